#!/usr/bin/env bash
# The container recipe (containers/Dockerfile, containers/recipe.sh), its steps run in a Charliecloud image built
# here: no base image can be pulled, so the image is a directory (charliecloud_support.sh) whose /usr is the host's
# (the compiler, CMake, Ninja, the -dev packages, Slurm's client and /usr/local/cuda, as the CUDA devel base and the
# slurm step give them) and whose /opt/venv is the host's venv (the torch and pyarrow the libtorch step would
# install). The steps that download run with --check (they verify what they would install: every command, header
# and the torch version and CUDA flavour); the two that build run for real, inside ch-run: `hpctrain` installs the
# package into /opt/hpctrain, `program` configures and builds containers/example (find_package,
# hpctrain_add_program: the program of docs/quickstart-gpu.md) against it, in a directory at the same path inside
# and out, as route (a) needs. On the host, where nothing is at the RUNPATH's /opt/venv, the program does not start
# (what docs/containers.md tells users about a binary built in the image). The quickstart's own test
# (quickstart_gpu_test.sh) runs the built program: it needs the local Slurm cluster, this test does not, so this one
# leaves the image and the build under $HPCTRAIN_BUILD_DIR/tests/quickstart for it (a ctest fixture). Small scale
# takes one change to the program: its pyxis image becomes this Charliecloud image, with the host's /usr and venv.
# The package's hpctrain_add_program consumer (tests/package/consumer/main_program.cpp: a language-model Training,
# the lm entry points of hpctrain::runtime) is built in the same tree, so the runtime and every installed header it
# includes compile once for both (a consumer build of its own outside the image cost 141 s of CPU at -O0): it runs its
# login path (--dry-run), and its unit parsed the description only (tests/package/program_unit_is_slim.sh).
# Usage: container_recipe_test.sh <a binary linking the venv's LibTorch>
set -euo pipefail
here="$(dirname "$(realpath "${BASH_SOURCE[0]}")")"
source "$here/../support/shell_test_support.sh"
source "$here/charliecloud_support.sh"
charliecloud_or_skip
root="$(realpath "$here/../..")"
venv="$(libtorch_venv "$1")" || fail "no LibTorch in the RUNPATH of $1"
[ -e "$venv/pyvenv.cfg" ] || fail "$venv is not a venv: the recipe's libtorch step makes one"
# The venv's python is a link to its base interpreter (pyvenv.cfg's home): the image gets that at the same path, as
# a real image has its python3 in /usr.
python_home="$(dirname "$(sed -n 's/^home = //p' "$venv/pyvenv.cfg")")"
flavour="$("$venv/bin/python" -c 'import torch; c = torch.version.cuda; print("cu" + c.replace(".", "") if c else "cpu")')"
export USER="${USER:-$(id -un)}"  # ch-run requires it
work="${HPCTRAIN_BUILD_DIR:?the build tree, where the quickstart test finds what this test builds}/tests/quickstart"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
echo "$venv" > venv  # for quickstart_gpu_test.sh

project="$work/sft"  # the quickstart's project directory, at the same path inside the image
# Mount points: ch-run binds only onto directories the image has (the job binds the program's directory and the
# working directory, at their paths, besides what the recipe's steps bind).
slurm_etc="$(dirname "${SLURM_CONF:-/etc/slurm/slurm.conf}")"
mounts=(/opt/venv /opt/hpctrain-src /opt/hpctrain "$project" "$project/build" "$slurm_etc" /run/munge)
[[ "$python_home" == /usr/* ]] || mounts+=("$python_home")
charliecloud_image "$work/image" "${mounts[@]}"
mkdir prefix
cp -r "$root/containers/example" "$project"
# Small scale: the program's pyxis image is this Charliecloud image, which binds the host's /usr and venv (a real
# image has both inside); everything else in train.cpp is the quickstart's.
pyxis='.container(ht::Pyxis("./hpctrain-cu128.sqsh"))'
charliecloud=".container(ht::Charliecloud(\"$work/image\")).mount(\"/usr\", \"/usr\").mount(\"$venv\", \"/opt/venv\")"
[[ "$python_home" == /usr/* ]] || charliecloud+=".mount(\"$python_home\", \"$python_home\")"
[ "$(grep -cF "$pyxis" "$project/train.cpp")" = 1 ] || fail "containers/example/train.cpp has no line $pyxis"
python3 - "$project/train.cpp" "$pyxis" "$charliecloud" <<'PY'
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
open(path, "w").write(text.replace(old, new))
PY
cp "$root/tests/package/consumer/main_program.cpp" "$project/consumer.cpp"
echo 'hpctrain_add_program(consumer consumer.cpp)  # the package test'"'"'s program (the comment at the top)' >> "$project/CMakeLists.txt"
binds=(-b /usr:/usr -b "$venv:/opt/venv" -b "$root:/opt/hpctrain-src" -b "$work/prefix:/opt/hpctrain" -b "$project:$project")
[[ "$python_home" == /usr/* ]] || binds+=(-b "$python_home:$python_home")
in_image() { ch-run "${binds[@]}" --cd "$project" "$work/image" -- "$@"; }
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
in_image "$recipe" slurm --check > slurm.log 2>&1 || log=slurm.log fail "the slurm step's check failed"
cat slurm.log
echo "ok: the download steps verified what they install (torch flavour $flavour; $other and cu99 refused by name)"

# --- the steps that build, run --------------------------------------------------------------------------------
in_image "$recipe" hpctrain /opt/hpctrain-src /opt/hpctrain > hpctrain.log 2>&1 ||
  log=hpctrain.log fail "the hpctrain step failed"
[ -e prefix/lib/cmake/hpctrain/hpctrainConfig.cmake ] || [ -e prefix/lib64/cmake/hpctrain/hpctrainConfig.cmake ] ||
  fail "the hpctrain step installed no hpctrainConfig.cmake"
# The Dockerfile's ENV says CMAKE_PREFIX_PATH=/opt/hpctrain; -O0 without debug info: this test proves the recipe
# builds and the program trains (quickstart_gpu_test.sh), not its speed.
in_image env CMAKE_PREFIX_PATH=/opt/hpctrain "$recipe" program "$project" "$project/build" -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG=-O0 > program.log 2>&1 || log=program.log fail "the program step failed"
tail -1 program.log
runpath="$(readelf -d "$project/build/train" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]$/\1/p')"
[[ ":$runpath:" == *:/opt/venv/*/torch/lib:* ]] || fail "the program's RUNPATH '$runpath' does not name the image's LibTorch"
echo "ok: built inside the image by the recipe's steps; RUNPATH $runpath"
"$root/tests/package/program_unit_is_slim.sh" "$project/build" CMakeFiles/consumer.dir/consumer.cpp.o > slim.log 2>&1 ||
  log=slim.log fail "hpctrain_add_program's unit parsed the runtime's machinery"
cat slim.log
in_image ./build/consumer --dry-run > consumer.log 2>&1 || log=consumer.log fail "the hpctrain_add_program consumer's --dry-run failed"
version="$(sed -n 's/^#define HPCTRAIN_VERSION_STRING "\(.*\)"$/\1/p' "$root/include/hpctrain/version.hpp")"
grep -q "^hpctrain $version " consumer.log || log=consumer.log fail "the consumer did not print 'hpctrain $version'"
echo "ok: the hpctrain_add_program consumer runs its login path (--dry-run) in the image"

loaded="$(in_image ldd ./build/train | sed -n 's/^\s*libtorch_cpu\.so => \([^ ]*\).*/\1/p')"
[[ "$loaded" == /opt/venv/*/torch/lib/libtorch_cpu.so ]] || fail "in the image the loader finds libtorch_cpu.so at '$loaded'"
echo "ok: in the image the program loads $loaded"
# --- and not on the host -------------------------------------------------------------------------------
status=0
"$project/build/train" --help > host.log 2>&1 || status=$?
[ "$status" = 127 ] && grep -qE "lib(torch[a-z_]*|c10)\.so: cannot open shared object file" host.log ||
  log=host.log fail "on the host it should not start (exit 127, LibTorch not found), got exit $status"
echo "ok: on the host it does not start: $(head -1 host.log)"
echo "PASS: the recipe's steps build the quickstart's program against the image's LibTorch, which it loads there (and not on the host)"
