#!/usr/bin/env bash
# Every Catch2 test name survives its trip through ctest: a name that starts with '-' is read as a flag by
# the test binary (the case never runs and the run "passes"), and catch_discover_tests splits a name at ';'
# into halves that match nothing (each "passes" without running). Names are listed from the binaries.
#   test_names_test.sh <test binary>...
set -euo pipefail
bad=0
for binary in "$@"; do
  while IFS= read -r name; do
    case "$name" in
      -*|*\;*) echo "FAIL: $(basename "$binary"): test name \"$name\" starts with '-' or holds ';'" >&2; bad=1 ;;
    esac
  done < <("$binary" --list-test-names-only | sed -e '/^$/d' -e '/test cases*$/d' -e 's/^  *//')
done
[ "$bad" = 0 ] && echo "checked the test names of $# binaries"
exit "$bad"
