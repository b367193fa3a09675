#!/usr/bin/env bash
# Faults while a checkpoint is written, on two local ranks (`--local 2`), injected with RLIMIT_FSIZE
# (`ulimit -f`), which no checkpoint of the example fits in:
#  1. torn: rank 0 is killed by SIGXFSZ in the middle of writing its checkpoint (the default action of
#     the signal) -> the run fails, the previous checkpoint is intact and the next run resumes from it.
#  2. disk full: SIGXFSZ ignored, so the write fails with EFBIG as on a full file system -> a clear error
#     naming the file, exit non-zero, the previous checkpoint intact, no partial checkpoint left visible.
# Usage: checkpoint_faults_test.sh <fashion_mnist binary>
set -euo pipefail
binary="$(realpath "$1")"
source "$(dirname "$(realpath "$0")")/fault_support.sh"   # before the cd: $0 may be relative
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/checkpoint-faults-test.XXXXXX")"
cd "$work"
export HPCTRAIN_RUN_DIR="$work/run"
limit_kib=512   # the example's checkpoint (model + AdamW state) is about 5 MB

log=first.log
"$binary" --local 2 --max-steps 20 --max-eval-examples 1000 > first.log 2>&1 || fail "the first run failed"
grep -q '^step 20/20 ' first.log || fail "the first run did not reach step 20"

echo "== 1. rank 0 killed by SIGXFSZ while it writes the checkpoint of step 40"
log=torn.log
set +e
( ulimit -f "$limit_kib"; exec "$binary" --local 2 --max-steps 40 --max-eval-examples 1000 ) > torn.log 2>&1
torn_exit=$?
set -e
[ "$torn_exit" -ne 0 ] || fail "the run whose checkpoint was torn exited 0"
grep -q '^resumed from .* at step 20 ' torn.log || fail "the torn run did not start from step 20"
log=after-torn.log
"$binary" --local 2 --max-steps 30 --max-eval-examples 1000 > after-torn.log 2>&1 || fail "the run after the torn checkpoint failed"
grep -q '^resumed from .* at step 20 ' after-torn.log || fail "did not resume from the intact checkpoint of step 20"
torn_warning="$(grep -c 'warning: skipping checkpoint' after-torn.log || true)"

echo "== 2. disk full (EFBIG) while rank 0 writes the checkpoint of step 40"
log=full.log
set +e
( ulimit -f "$limit_kib"; trap '' XFSZ; exec "$binary" --local 2 --max-steps 40 --max-eval-examples 1000 ) > full.log 2>&1
full_exit=$?
set -e
[ "$full_exit" -ne 0 ] || fail "the run that could not write its checkpoint exited 0"
error_line="$(grep -m1 'hpctrain.runtime' full.log || true)"
[ -n "$error_line" ] || fail "no [hpctrain.runtime.*] error after the failed checkpoint write"
grep -q "hpctrain.runtime.*$HPCTRAIN_RUN_DIR.*: File too large" full.log ||
  fail "the error does not name the path under $HPCTRAIN_RUN_DIR and the reason (EFBIG): $error_line"
log=after-full.log
"$binary" --local 2 --max-steps 30 --max-eval-examples 1000 > after-full.log 2>&1 || fail "the run after the failed write failed"
grep -q '^resumed from .* at step 30 ' after-full.log || fail "did not resume from an intact checkpoint"
{
  echo "torn_exit=$torn_exit"
  echo "torn_resumed_from_step=20"
  echo "torn_warnings=$torn_warning"
  echo "disk_full_exit=$full_exit"
  echo "disk_full_error=$error_line"
} > "$results/checkpoint_faults.txt"
echo "PASS: torn checkpoint -> exit $torn_exit, resumed from step 20; disk full -> exit $full_exit: $error_line"
