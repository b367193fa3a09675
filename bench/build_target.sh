#!/bin/sh
# Builds one benchmark target (benchmarks are outside `all`): configures BUILD_DIR first when it has no
# build system yet, at -O2 (scripts/configure --bench; the test build is at -O1).
#   bench/build_target.sh BUILD_DIR TARGET
set -eu
build=$1 target=$2
source_dir=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$build/CMakeCache.txt" ] || "$source_dir/scripts/configure" --bench "$build" >&2
cmake --build "$build" -j "$(nproc)" --target "$target" >&2
