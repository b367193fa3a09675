#!/usr/bin/env bash
# Compiler launcher for the headers' self-containment checks, run with clang (tests/headers/CMakeLists.txt
# says why): the build hands it gcc's command line, and it runs clang++ with the same arguments instead.
#   clang_check.sh pch    <clang++> <pch file> <gcc> <arguments...>   precompile the source (the outside headers) for clang
#   clang_check.sh syntax <clang++> <pch file> <gcc> <arguments...>   parse and type-check one header's TU against it
# Either way an empty object file is left where the build expects one (nothing links them).
set -euo pipefail
mode=$1 clang=$2 pch=$3
shift 4
arguments=() output=
while [ $# -gt 0 ]; do
  case $1 in
    -o) output=$2; shift 2 ;;
    # The source comes last on CMake's command line; -x must come before it to apply.
    -c) source=$2; shift 2 ;;
    *) arguments+=("$1"); shift ;;
  esac
done
case $mode in
  # -fpch-instantiate-templates: what torch's inline code instantiates is done once here, not in every check.
  pch) "$clang" "${arguments[@]}" -fpch-instantiate-templates -x c++-header -o "$pch" -c "$source" ;;
  syntax) "$clang" "${arguments[@]}" -include-pch "$pch" -fsyntax-only "$source" ;;
  *) echo "clang_check.sh: unknown mode '$mode'" >&2; exit 2 ;;
esac
[ -z "$output" ] || : > "$output"
