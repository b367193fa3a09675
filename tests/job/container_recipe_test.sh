#!/usr/bin/env bash
# The container recipe (containers/Dockerfile, containers/recipe.sh), its steps run in a Charliecloud image built
# here: no base image can be pulled, so the image is a directory (charliecloud_support.sh) whose /usr is the host's
# (the compiler, CMake, Ninja, the -dev packages and /usr/local/cuda, as the CUDA devel base has them) and whose
# /opt/venv is the host's venv (the torch and pyarrow the libtorch step would install). The steps that download
# run with --check (they verify what they would install: every command, header and the torch version and CUDA
# flavour); the two that build run for real, inside ch-run: `hpctrain` installs the package into /opt/hpctrain,
# `program` configures and builds containers/example (find_package, hpctrain_add_program) against it, and the
# program trains there (--local 1, fp32 stated), loading the image's LibTorch; on the host, where nothing is at the
# RUNPATH's /opt/venv, it does not start (what docs/containers.md tells users about a binary built in the image).
# The package's hpctrain_add_program consumer (tests/package/consumer/main_program.cpp: a language-model Training,
# the lm entry points of hpctrain::runtime) is built in the same tree, so the runtime and every installed header it
# includes compile once for both (a consumer build of its own outside the image cost 141 s of CPU at -O0): it runs its
# login path (--dry-run), and its unit parsed the description only (tests/package/program_unit_is_slim.sh).
# Usage: container_recipe_test.sh <a binary linking the venv's LibTorch>
set -euo pipefail
here="$(dirname "$(realpath "${BASH_SOURCE[0]}")")"
source "$here/../support/shell_test_support.sh"
source "$here/charliecloud_support.sh"
command -v ch-run > /dev/null || { echo "SKIP: no ch-run (Debian charliecloud-runtime)"; exit 77; }
root="$(realpath "$here/../..")"
venv="$(libtorch_venv "$1")" || fail "no LibTorch in the RUNPATH of $1"
[ -e "$venv/pyvenv.cfg" ] || fail "$venv is not a venv: the recipe's libtorch step makes one"
# The venv's python is a link to its base interpreter (pyvenv.cfg's home): the image gets that at the same path, as
# a real image has its python3 in /usr.
python_home="$(dirname "$(sed -n 's/^home = //p' "$venv/pyvenv.cfg")")"
flavour="$("$venv/bin/python" -c 'import torch; c = torch.version.cuda; print("cu" + c.replace(".", "") if c else "cpu")')"
export USER="${USER:-$(id -un)}"  # ch-run requires it
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/container-recipe-test.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cd "$work"

mounts=(/opt/venv /opt/hpctrain-src /opt/hpctrain /src)
[[ "$python_home" == /usr/* ]] || mounts+=("$python_home")
charliecloud_image "$work/image" "${mounts[@]}"
mkdir prefix
cp -r "$root/containers/example" src
cp "$root/tests/package/consumer/main_program.cpp" src/consumer.cpp
echo 'hpctrain_add_program(consumer consumer.cpp)  # the package test'"'"'s program (the comment at the top)' >> src/CMakeLists.txt
binds=(-b /usr:/usr -b "$venv:/opt/venv" -b "$root:/opt/hpctrain-src" -b "$work/prefix:/opt/hpctrain" -b "$work/src:/src")
[[ "$python_home" == /usr/* ]] || binds+=(-b "$python_home:$python_home")
in_image() { ch-run "${binds[@]}" --cd /src "$work/image" -- "$@"; }
recipe=/opt/hpctrain-src/containers/recipe.sh

# --- the steps that download, verified ----------------------------------------------------------------------
in_image "$recipe" system --check > system.log 2>&1 || log=system.log fail "the system step's check failed"
cat system.log
in_image "$recipe" libtorch "$flavour" --check > libtorch.log 2>&1 || log=libtorch.log fail "the libtorch step's check failed"
cat libtorch.log
# A flavour the venv is not: the check names both.
other=cu126
[ "$flavour" != cu126 ] || other=cu130
status=0
in_image "$recipe" libtorch "$other" --check > other.log 2>&1 || status=$?
[ "$status" = 1 ] && grep -q "the flavour $other means" other.log ||
  log=other.log fail "the libtorch check of a flavour the venv is not ($other) should fail naming it, got exit $status"
status=0
in_image "$recipe" libtorch cu99 --check > unknown.log 2>&1 || status=$?
[ "$status" = 1 ] && grep -q "'cu99' is not one of cu126, cu128, cu130, cpu" unknown.log ||
  log=unknown.log fail "an unknown flavour should be refused by name, got exit $status"
echo "ok: the download steps verified what they install (torch flavour $flavour; $other and cu99 refused by name)"

# --- the steps that build, run --------------------------------------------------------------------------------
in_image "$recipe" hpctrain /opt/hpctrain-src /opt/hpctrain > hpctrain.log 2>&1 ||
  log=hpctrain.log fail "the hpctrain step failed"
[ -e prefix/lib/cmake/hpctrain/hpctrainConfig.cmake ] || [ -e prefix/lib64/cmake/hpctrain/hpctrainConfig.cmake ] ||
  fail "the hpctrain step installed no hpctrainConfig.cmake"
# The Dockerfile's ENV says CMAKE_PREFIX_PATH=/opt/hpctrain; -O0 without debug info: this test proves the recipe
# builds and the program trains, not its speed.
in_image env CMAKE_PREFIX_PATH=/opt/hpctrain "$recipe" program /src /src/build -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG=-O0 > program.log 2>&1 || log=program.log fail "the program step failed"
tail -1 program.log
runpath="$(readelf -d src/build/train | sed -n 's/.*(RUNPATH).*\[\(.*\)\]$/\1/p')"
[[ ":$runpath:" == *:/opt/venv/*/torch/lib:* ]] || fail "the program's RUNPATH '$runpath' does not name the image's LibTorch"
echo "ok: built inside the image by the recipe's steps; RUNPATH $runpath"
"$root/tests/package/program_unit_is_slim.sh" src/build CMakeFiles/consumer.dir/consumer.cpp.o > slim.log 2>&1 ||
  log=slim.log fail "hpctrain_add_program's unit parsed the runtime's machinery"
cat slim.log
in_image ./build/consumer --dry-run > consumer.log 2>&1 || log=consumer.log fail "the hpctrain_add_program consumer's --dry-run failed"
version="$(sed -n 's/^#define HPCTRAIN_VERSION_STRING "\(.*\)"$/\1/p' "$root/include/hpctrain/version.hpp")"
grep -q "^hpctrain $version " consumer.log || log=consumer.log fail "the consumer did not print 'hpctrain $version'"
echo "ok: the hpctrain_add_program consumer runs its login path (--dry-run) in the image"

# --- and it trains there -----------------------------------------------------------------------------------
in_image ./build/train --local 1 --precision fp32 > train.log 2>&1 || log=train.log fail "the program did not train in the image"
grep -q "^step 30/30 " train.log || log=train.log fail "no step 30/30 in the log"
loaded="$(in_image ldd ./build/train | sed -n 's/^\s*libtorch_cpu\.so => \([^ ]*\).*/\1/p')"
[[ "$loaded" == /opt/venv/*/torch/lib/libtorch_cpu.so ]] || fail "in the image the loader finds libtorch_cpu.so at '$loaded'"
metrics="$(find src -name metrics.jsonl | head -1)"
[ -n "$metrics" ] || log=train.log fail "the run wrote no metrics.jsonl"
first="$(grep -o '"loss":[0-9.e+-]*' "$metrics" | head -1 | cut -d: -f2)"
last="$(grep -o '"loss":[0-9.e+-]*' "$metrics" | tail -1 | cut -d: -f2)"
awk -v first="$first" -v last="$last" 'BEGIN { exit !(last < first) }' || fail "the loss did not fall: $first -> $last"
echo "ok: it trained in the image with $loaded, loss $first -> $last ($metrics)"
# --- and not on the host -------------------------------------------------------------------------------
status=0
src/build/train --help > host.log 2>&1 || status=$?
[ "$status" = 127 ] && grep -qE "lib(torch[a-z_]*|c10)\.so: cannot open shared object file" host.log ||
  log=host.log fail "on the host it should not start (exit 127, LibTorch not found), got exit $status"
echo "ok: on the host it does not start: $(head -1 host.log)"
echo "PASS: the recipe's steps build a program against the image's LibTorch, and it trains there"
