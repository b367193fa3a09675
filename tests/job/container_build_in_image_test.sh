#!/usr/bin/env bash
# Containers and LibTorch, route (a): the program is built inside the image and run there. The image (a directory,
# tests/job/charliecloud_support.sh) has a compiler (the host's /usr bound as its /usr) and a LibTorch at a path of
# its own, /opt/venv (the host's venv bound there: the host has nothing at /opt/venv). Inside ch-run, g++ compiles a
# one-file LibTorch program against /opt/venv; it runs inside, fits its least-squares problem, and says it loaded
# /opt/venv's libtorch_cpu.so. Its RUNPATH names /opt/venv, so on the host it does not start: what
# docs/containers.md tells users about the login modes of a binary built this way.
# Usage: container_build_in_image_test.sh <a binary linking the venv's LibTorch> <libtorch_in_image.cpp>
set -euo pipefail
here="$(dirname "$(realpath "${BASH_SOURCE[0]}")")"
source "$here/../support/shell_test_support.sh"
source "$here/charliecloud_support.sh"
command -v ch-run >/dev/null || { echo "SKIP: no ch-run (Debian charliecloud-runtime)"; exit 77; }
venv="$(libtorch_venv "$1")" && host_lib="$(libtorch_lib "$1")" || fail "no LibTorch in the RUNPATH of $1"
source_file="$(realpath "$2")"
export USER="${USER:-$(id -un)}"  # ch-run requires it
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/container-build-in-image-test.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cd "$work"

charliecloud_image "$work/image" /opt/venv /src
mkdir src
cp "$source_file" src/train.cpp
torch="$(dirname "/opt/venv/${host_lib#"$venv"/}")"  # LibTorch's directory, at the image's path
in_image() { ch-run -b /usr:/usr -b "$venv:/opt/venv" -b "$work/src:/src" --cd /src "$work/image" -- "$@"; }

# --- build inside the image, with its compiler and its LibTorch -------------------------------------------
in_image g++ -std=c++20 -O0 train.cpp -o train -I"$torch/include" -L"$torch/lib" -ltorch_cpu -lc10 \
  -Wl,-rpath,"$torch/lib" > build.log 2>&1 || fail "g++ inside the image failed"
runpath="$(readelf -d src/train | sed -n 's/.*(RUNPATH).*\[\(.*\)\]$/\1/p')"
[ "$runpath" = "$torch/lib" ] || fail "the RUNPATH is '$runpath', not the image's $torch/lib"
echo "ok: built inside the image; RUNPATH $runpath"

# --- run there ----------------------------------------------------------------------------------------
in_image ./train > run.log 2>&1 || fail "the program exited $? inside the image"
cat run.log
grep -qE "^LibTorch [0-9.]+ from $torch/lib/libtorch_cpu.so\$" run.log || fail "it did not load the image's LibTorch"
first="$(sed -n 's/^step 0 loss //p' run.log)"
last="$(sed -n 's/^step 50 loss //p' run.log)"
# Gradient descent on an exact least-squares problem: each step lowers the loss, so the last is below the first.
awk -v first="$first" -v last="$last" 'BEGIN { exit !(last < first) }' || fail "the loss did not fall: $first -> $last"
echo "ok: it ran inside the image with the image's LibTorch, loss $first -> $last"

# --- and not on the host ------------------------------------------------------------------------------
status=0
src/train > host.log 2>&1 || status=$?
[ "$status" = 127 ] && grep -qE "lib(torch[a-z_]*|c10)\.so: cannot open shared object file" host.log ||
  log=host.log fail "on the host it should not start (exit 127, libtorch_cpu.so not found), got exit $status"
echo "ok: on the host it does not start: $(cat host.log)"
echo "PASS: a program built inside the image with its compiler and LibTorch runs there, and only there"
