#!/usr/bin/env bash
# Checks that each given test binary carries AddressSanitizer and UndefinedBehaviorSanitizer (its undefined
# symbols name their runtimes): the torch-free tests' only sanitizer run is their ctest run.
#   tests/sanitized_test.sh <binary>...
set -euo pipefail
for binary in "$@"; do
  symbols=$(nm -u "$binary")
  grep -q '__asan_init' <<<"$symbols" || { echo "$binary: no AddressSanitizer (no __asan_init)" >&2; exit 1; }
  grep -q '__ubsan_handle_' <<<"$symbols" || { echo "$binary: no UndefinedBehaviorSanitizer (no __ubsan_handle_*)" >&2; exit 1; }
  echo "$binary: ASan + UBSan"
done
