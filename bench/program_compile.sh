#!/bin/bash
# The edit loop of a user's train.cpp, measured: a copy of examples/sft.cpp as a project of its own, built against
# the package installed from SOURCE (default: this tree) into a fresh prefix, Release (-O3), 2 jobs. Prints the
# wall seconds of a fresh build tree's first build and of the rebuild after an edit of train.cpp, and the
# compiler's peak memory (maximum resident set size) for each unit, for both ways of linking:
#   header-only   add_executable + hpctrain::hpctrain
#   program       hpctrain_add_program (the runtime's unit compiled once per build tree)
# and beside them the peer a user compares with: a plain LibTorch program (a Linear, AdamW, one step;
# <torch/torch.h>, find_package(Torch): the C++17 Torch's targets ask for), the same build type and jobs.
#   bench/program_compile.sh [SOURCE] [WORK_DIR]
# Timings compete with whatever else runs on the machine (say so beside them); the memory figures do not.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
source=$(cd "${1:-$here}" && pwd)
work=${2:-$(mktemp -d /tmp/hpctrain-program-compile.XXXXXX)}
source "$here/scripts/pins.sh"
python=${HPCTRAIN_PYTHON:-$HPCTRAIN_VENV/bin/python}
mkdir -p "$work"

# The package, installed as a user would (no compilation: headers, CMake files and the runtime's source).
cmake -S "$source" -B "$work/package-build" -DHPCTRAIN_TESTS=OFF -DHPCTRAIN_EXAMPLES=OFF -DHPCTRAIN_BENCH=OFF \
  -DHPCTRAIN_PYTHON="$python" --log-level=WARNING >/dev/null
cmake --install "$work/package-build" --prefix "$work/prefix" >/dev/null

# Each compiler call is timed; its line says the unit, the wall seconds and the peak memory in KB.
cat >"$work/timed-compiler" <<'LAUNCHER'
#!/bin/sh
unit=$(for a in "$@"; do case "$a" in *.cpp) echo "$a";; esac; done | tail -1)
exec /usr/bin/time -a -o "$COMPILE_LOG" -f "$(basename "$unit") %e s %M KB" "$@"
LAUNCHER
chmod +x "$work/timed-compiler"

# The peer: what LibTorch's own C++ frontend example looks like, one step of it.
libtorch_program='#include <torch/torch.h>

int main() {
  torch::nn::Linear model(16, 4);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  auto loss = torch::nn::functional::cross_entropy(model(torch::randn({8, 16})), torch::randint(4, {8}));
  optimizer.zero_grad();
  loss.backward();
  optimizer.step();
  return 0;
}'
torch_prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')

for way in ${WAYS:-header-only program libtorch}; do  # WAYS: some of them
  project=$work/$way
  mkdir -p "$project"
  case "$way" in
    program) link='hpctrain_add_program(train train.cpp)' ;;
    header-only) link=$'add_executable(train train.cpp)\ntarget_link_libraries(train PRIVATE hpctrain::hpctrain)' ;;
    libtorch) link=$'add_executable(train train.cpp)\ntarget_link_libraries(train PRIVATE ${TORCH_LIBRARIES})' ;;
  esac
  if [ "$way" = libtorch ]; then
    echo "$libtorch_program" >"$project/train.cpp"
    package="find_package(Torch REQUIRED)"
  else
    cp "$source/examples/sft.cpp" "$project/train.cpp"
    package="find_package(hpctrain CONFIG REQUIRED)"
  fi
  cat >"$project/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.22)
project(train CXX)
$package
$link
CMAKE
  rm -rf "$project/build"
  cmake -S "$project" -B "$project/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix;$torch_prefix" \
    -DHPCTRAIN_PYTHON="$python" -DCMAKE_CXX_COMPILER_LAUNCHER="$work/timed-compiler" --log-level=ERROR >/dev/null
  for build in first rebuild; do
    export COMPILE_LOG=$project/$build.log
    : >"$COMPILE_LOG"
    [ "$build" = rebuild ] && echo "// an edit" >>"$project/train.cpp"
    start=$(date +%s.%N)
    cmake --build "$project/build" -j 2 >/dev/null
    end=$(date +%s.%N)
    printf '%-12s %-8s wall %6.1f s   units: %s\n' "$way" "$build" "$(echo "$end - $start" | bc)" \
      "$(awk '{printf "%s %s s %.2f GB; ", $1, $2, $4 / 1e6}' "$COMPILE_LOG")"
  done
done
