#!/usr/bin/env bash
# Faults while a checkpoint is written, on two local ranks (`--local 2`), injected with RLIMIT_FSIZE
# (`ulimit -f`), which no checkpoint of the example fits in; each case synchronously and with
# --checkpoint-async (the archive written by a background thread):
#  1. torn: rank 0 is killed by SIGXFSZ in the middle of writing its checkpoint (the default action of
#     the signal) -> the run fails, the previous checkpoint is intact and the next run resumes from it.
#  2. disk full: SIGXFSZ ignored, so the write fails with EFBIG as on a full file system -> a clear error
#     naming the file, exit non-zero, the previous checkpoint intact, no partial checkpoint left visible.
# Then corruption found at resume, with one archive per rank (--sharding zero2):
#  3. only rank 1's archive of the newest checkpoint is corrupt -> rank 1 says so, and both ranks resume
#     together from the previous checkpoint (each rank verifies its own archive; they agree on the step).
#  4. a byte of a piece of rank 1's file is flipped, and the run resumes at another world size (--local 1), where
#     no file is read whole: the rank that reads that piece names the file and the piece, and the run resumes from
#     the previous checkpoint.
# Usage: checkpoint_faults_test.sh <fashion_mnist binary>
set -euo pipefail
binary="$(realpath "$1")"
source "$(dirname "$(realpath "$0")")/fault_support.sh"   # before the cd: $0 may be relative
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/checkpoint-faults-test.XXXXXX")"
cd "$work"
limit_kib=512   # the example's checkpoint (model + AdamW state) is about 5 MB

# Cases 1 and 2 in run directory $1, with the extra arguments that follow (the mode).
write_faults() {
  export HPCTRAIN_RUN_DIR="$work/$1"
  local mode="$1"; shift
  log=$mode-first.log
  "$binary" --local 2 --max-steps 20 --max-eval-examples 1000 "$@" > "$log" 2>&1 || fail "the first run failed"
  grep -q '^step 20/20 ' "$log" || fail "the first run did not reach step 20"

  echo "== 1. ($mode) rank 0 killed by SIGXFSZ while it writes the checkpoint of step 40"
  log=$mode-torn.log
  set +e
  ( ulimit -f "$limit_kib"; exec "$binary" --local 2 --max-steps 40 --max-eval-examples 1000 "$@" ) > "$log" 2>&1
  torn_exit=$?
  set -e
  [ "$torn_exit" -ne 0 ] || fail "the run whose checkpoint was torn exited 0"
  grep -q '^resumed from .* at step 20 ' "$log" || fail "the torn run did not start from step 20"
  log=$mode-after-torn.log
  "$binary" --local 2 --max-steps 30 --max-eval-examples 1000 "$@" > "$log" 2>&1 || fail "the run after the torn checkpoint failed"
  grep -q '^resumed from .* at step 20 ' "$log" || fail "did not resume from the intact checkpoint of step 20"
  torn_warning="$(grep -c 'warning: skipping checkpoint' "$log" || true)"

  echo "== 2. ($mode) disk full (EFBIG) while rank 0 writes the checkpoint of step 40"
  log=$mode-full.log
  set +e
  ( ulimit -f "$limit_kib"; trap '' XFSZ; exec "$binary" --local 2 --max-steps 40 --max-eval-examples 1000 "$@" ) > "$log" 2>&1
  full_exit=$?
  set -e
  [ "$full_exit" -ne 0 ] || fail "the run that could not write its checkpoint exited 0"
  grep -q 'hpctrain.runtime' "$log" || fail "no [hpctrain.runtime.*] error after the failed checkpoint write"
  # The writing rank's error (the other rank's, that a peer failed, may come first).
  error_line="$(grep -m1 "hpctrain.runtime.*$HPCTRAIN_RUN_DIR.*: File too large" "$log" || true)"
  [ -n "$error_line" ] ||
    fail "no error names the path under $HPCTRAIN_RUN_DIR and the reason (EFBIG): $(grep -m1 'hpctrain.runtime' "$log")"
  log=$mode-after-full.log
  "$binary" --local 2 --max-steps 30 --max-eval-examples 1000 "$@" > "$log" 2>&1 || fail "the run after the failed write failed"
  grep -q '^resumed from .* at step 30 ' "$log" || fail "did not resume from an intact checkpoint"
}
figures=()
summary=""
for mode in sync async; do
  if [ "$mode" = async ]; then write_faults async --checkpoint-async; else write_faults sync; fi
  figures+=("${mode}_torn_exit=$torn_exit" "${mode}_torn_resumed_from_step=20" "${mode}_torn_warnings=$torn_warning"
            "${mode}_disk_full_exit=$full_exit" "${mode}_disk_full_error=$error_line")
  summary+="$mode: torn checkpoint -> exit $torn_exit, resumed from step 20; disk full -> exit $full_exit: $error_line; "
done

echo "== 3. only rank 1's archive of the newest checkpoint (step 20) is corrupt"
export HPCTRAIN_RUN_DIR="$work/corrupt"
log=corrupt-first.log
"$binary" --local 2 --sharding zero2 --max-steps 20 --checkpoint-every 10 --max-eval-examples 1000 > "$log" 2>&1 || fail "the zero2 run failed"
newest="$HPCTRAIN_RUN_DIR/checkpoints/step-0000000020"
[ -f "$newest/rank-00001.hpct" ] || fail "no archive of rank 1 in $newest"
size="$(stat -c %s "$newest/rank-00001.hpct")"
# One byte in the middle flipped: the size still matches meta.json, the CRC-32C does not.
python3 - "$newest/rank-00001.hpct" "$((size / 2))" <<'PY'
import sys
path, at = sys.argv[1], int(sys.argv[2])
with open(path, "r+b") as f:
    f.seek(at); byte = f.read(1); f.seek(at); f.write(bytes([byte[0] ^ 0xFF]))
PY
log=corrupt-resumed.log
"$binary" --local 2 --sharding zero2 --max-steps 30 --checkpoint-every 10 --max-eval-examples 1000 > "$log" 2>&1 ||
  fail "the run after the corrupt archive failed"
grep -q '^resumed from .* at step 10 ' "$log" || fail "did not resume from step 10, the checkpoint before the corrupt one"
# The byte lies in the pieces region: the rank that reads it names the file, the piece and its bytes (no rank reads
# its file whole to check it against meta.json; each chunk is checked as the load reads it).
grep -q "warning: skipping checkpoint: rank 1: .*$newest/rank-00001.hpct: corrupt: piece [0-9]*, bytes \[[0-9]*, [0-9]*) of its [0-9]*: CRC-32C does not match" "$log" ||
  fail "rank 1 did not name its corrupt archive"
grep -q "warning: skipping checkpoint: $newest: 1 of 2 ranks found their archives invalid" "$log" ||
  fail "rank 0 did not say that a rank refused the checkpoint of step 20"
grep -q '^step 30/30 ' "$log" || fail "the resumed run did not reach step 30"

figures+=("corrupt_rank1_resumed_from_step=10")

echo "== 4. a flipped byte in a piece of rank 1's file of the newest checkpoint (step 20), resumed at --local 1"
export HPCTRAIN_RUN_DIR="$work/corrupt-piece"
log=corrupt-piece-first.log
"$binary" --local 2 --sharding zero2 --max-steps 20 --checkpoint-every 10 --max-eval-examples 1000 > "$log" 2>&1 || fail "the zero2 run failed"
newest="$HPCTRAIN_RUN_DIR/checkpoints/step-0000000020"
size="$(stat -c %s "$newest/rank-00001.hpct")"
# The file's last byte: its last piece's (the pieces follow the archive), which the resharded load reads.
python3 - "$newest/rank-00001.hpct" "$((size - 1))" <<'PY'
import sys
path, at = sys.argv[1], int(sys.argv[2])
with open(path, "r+b") as f:
    f.seek(at); byte = f.read(1); f.seek(at); f.write(bytes([byte[0] ^ 0xFF]))
PY
log=corrupt-piece-resumed.log
"$binary" --local 1 --sharding zero2 --max-steps 30 --checkpoint-every 10 --max-eval-examples 1000 > "$log" 2>&1 ||
  fail "the run after the corrupt piece failed"
grep -q '^resumed from .* at step 10 ' "$log" || fail "did not resume from step 10, the checkpoint before the corrupt piece"
piece_warning="$(grep -m1 "warning: skipping checkpoint: rank 0: .*$newest/rank-00001.hpct: corrupt: piece [0-9]*, bytes \[" "$log" || true)"
[ -n "$piece_warning" ] || fail "rank 0 did not name the corrupt piece of rank-00001.hpct"
grep -q '^step 30/30 ' "$log" || fail "the resumed run did not reach step 30"
figures+=("corrupt_piece_resumed_from_step=10" "corrupt_piece_warning=${piece_warning#*hpctrain.runtime.checkpoint\] }")
printf '%s\n' "${figures[@]}" > "$results/checkpoint_faults.txt"
echo "PASS: ${summary}rank 1's corrupt archive -> both ranks resumed from step 10; a corrupt piece read at --local 1 -> named, resumed from step 10"
