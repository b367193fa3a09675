#!/usr/bin/env bash
# --checkpoint-async on the real Trainer (Fashion-MNIST, `--local 2`, --sharding zero2: one archive per rank),
# against the same run with synchronous checkpoints:
#  1. uninterrupted, checkpointing every 10 steps: every logged loss equal bit for bit, the parameters' digest
#     equal, and the committed archives byte-identical (the background writer writes the step's snapshot);
#  2. SIGTERM (a preemption) mid-run: the preemption waits for the save in flight and commits its own; the
#     resumed run ends with the uninterrupted run's digest and its losses, bit for bit, from the resume on.
# A kill during an asynchronous save is tests/faults/checkpoint_faults_test.sh's.
# Usage: async_checkpoint_test.sh <fashion_mnist binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
fail_tail=30
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  { echo "SKIP: Fashion-MNIST is not installed at /usr/share/datasets/fashion-mnist (apt install dataset-fashion-mnist)"; exit 77; }
binary="$(realpath "$1")"
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/async-checkpoint-test.XXXXXX")"
cd "$work"
steps=100
knobs=(--report-digest --local 2 --sharding zero2 --max-steps "$steps" --checkpoint-every 10 --log-every 1 --max-eval-examples 500)
digest() { sed -n 's/^parameters_crc32c=\([0-9a-f]*\)$/\1/p' "$1" | tail -1; }
# metrics.jsonl's train losses from step $2 on, one "step loss" line each (17 significant digits: the doubles exactly)
losses_from() { python3 -c 'import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "loss" in r and "eval_loss" not in r and r["step"] >= int(sys.argv[2]): print(r["step"], repr(r["loss"]))' "$1" "$2"; }

echo "== 1. synchronous and asynchronous checkpoints, uninterrupted"
log=sync.log
HPCTRAIN_RUN_DIR="$work/sync" "$binary" "${knobs[@]}" > sync.log 2>&1 || fail "the synchronous run failed"
log=async.log
HPCTRAIN_RUN_DIR="$work/async" "$binary" "${knobs[@]}" --checkpoint-async > async.log 2>&1 || fail "the asynchronous run failed"
[ -n "$(digest sync.log)" ] || fail "no parameters digest in sync.log"
[ "$(digest sync.log)" = "$(digest async.log)" ] || fail "digest $(digest async.log) with --checkpoint-async, $(digest sync.log) without"
losses_from sync/metrics.jsonl 1 > sync.losses
losses_from async/metrics.jsonl 1 > async.losses
[ "$(wc -l < sync.losses)" = "$steps" ] || fail "sync logged $(wc -l < sync.losses) train losses, not $steps"
cmp -s sync.losses async.losses || fail "the losses differ with --checkpoint-async: $(diff sync.losses async.losses | head -4)"
committed="$(cd sync/checkpoints && ls -d step-* | tr '\n' ' ')"
[ "$committed" = "$(cd async/checkpoints && ls -d step-* | tr '\n' ' ')" ] ||
  fail "committed: '$committed' synchronously, '$(cd async/checkpoints && ls -d step-* | tr '\n' ' ')' asynchronously"
for archive in sync/checkpoints/step-*/rank-*.hpct; do
  cmp -s "$archive" "async/${archive#sync/}" || fail "async/${archive#sync/} differs from $archive"
done
ls -d async/checkpoints/*.tmp 2>/dev/null && fail "an asynchronous save left a staging directory"

echo "== 2. SIGTERM (a preemption) with asynchronous saves, then the resume"
preempt_at_step 25 preempted preempted.log env HPCTRAIN_RUN_DIR="$work/preempted" "$binary" "${knobs[@]}" --checkpoint-async
[ -n "$stopped_at" ] || fail "the run was not preempted"
[ "$stopped_at" -lt "$steps" ] || fail "preempted at the last step: nothing to resume"
[ -d "preempted/checkpoints/step-$(printf %010d "$stopped_at")" ] || fail "the preemption's checkpoint of step $stopped_at is not committed"
log=resumed.log
HPCTRAIN_RUN_DIR="$work/preempted" "$binary" "${knobs[@]}" --checkpoint-async > resumed.log 2>&1 || fail "the resumed run failed"
grep -q "^resumed from .* at step $stopped_at " resumed.log || fail "did not resume from step $stopped_at"
[ "$(digest resumed.log)" = "$(digest sync.log)" ] || fail "digest $(digest resumed.log) after the resume, $(digest sync.log) uninterrupted"
losses_from preempted/metrics.jsonl $((stopped_at + 1)) | awk -v s="$stopped_at" '$1 > s' > resumed.losses
awk -v s="$stopped_at" '$1 > s' sync.losses > sync-tail.losses
[ -s resumed.losses ] || fail "no losses after step $stopped_at"
cmp -s sync-tail.losses <(tail -n "$(wc -l < sync-tail.losses)" resumed.losses) ||
  fail "losses after the resume differ: $(diff sync-tail.losses <(tail -n "$(wc -l < sync-tail.losses)" resumed.losses) | head -4)"
echo "PASS: --checkpoint-async: $steps losses and digest $(digest sync.log) as synchronous, $(ls sync/checkpoints/step-*/*.hpct | wc -l) archives byte-identical; preempted at step $stopped_at, resumed bit-identical"
