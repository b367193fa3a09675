#!/usr/bin/env bash
# End to end on the local Slurm cluster: a 2-node Fashion-MNIST job gets USR2 mid-run (as
# `srun --signal=USR2@grace` delivers it before a time limit), checkpoints, exits 75, is requeued by its
# batch script, resumes from the checkpoint and completes — with final parameters bit-identical to an
# uninterrupted 2-rank run.  Usage: requeue_test.sh <fashion_mnist binary> <reference file>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/slurm_test_support.sh"
# Without the dataset this is a skip with its reason (ctest: SKIP_RETURN_CODE 77), not a failure.
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  { echo "SKIP: Fashion-MNIST is not installed at /usr/share/datasets/fashion-mnist (apt install dataset-fashion-mnist)"; exit 77; }
binary="$(realpath "$1")"
reference_file="$2"  # from the fixture tests/train/fashion_mnist_reference.sh
steps=150  # the same in tests/train/fashion_mnist_reference.sh
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/requeue-test.XXXXXX")"
cd "$work"
export HPCTRAIN_REPORT_DIGEST=1  # the ranks print their parameter digest (sbatch passes the environment on)

reference="$(reference_digest "$reference_file" "$steps")"

echo "== submit"
out="$("$binary" --submit --max-steps "$steps" --max-eval-examples 1000)"
echo "$out"
job="$(sed -n 's/^submitted job \([0-9]*\).*/\1/p' <<<"$out" | head -1)"
[ -n "$job" ] || fail "no job id"
trap 'scancel "$job" 2>/dev/null || true' EXIT
log="$(scontrol show job "$job" | sed -n 's/^ *StdOut=//p')"
echo "log: $log"

# Past step 50 the signal lands within a second or two (seen: 10 to 20 steps later), well before the end.
wait_for "grep -q '^step 50/' '$log' 2>/dev/null" 600 || fail "job $job never reached step 50"
echo "== USR2 to the job's steps (not the batch script, which must survive to requeue)"
scancel --signal=USR2 "$job"
wait_for "grep -q '^preempted: checkpointed step' '$log'" 120 || fail "no preemption checkpoint"
stopped_at="$(sed -n 's/^preempted: checkpointed step \([0-9]*\) .*/\1/p' "$log" | head -1)"
echo "checkpointed at step $stopped_at"

# Slurm holds a requeued job about two minutes (BeginTime) before it runs again: released at once.
wait_for "release_requeue_hold $job; scontrol show job $job | grep -q 'JobState=COMPLETED'" 600 || fail "job $job did not complete: $(scontrol show job "$job" | grep -o 'JobState=[A-Z_]*')"
scontrol show job "$job" | grep -q 'Restarts=1' || fail "job $job was not restarted exactly once"
grep -q "^resumed from .* at step $stopped_at " "$log" || fail "the requeued run did not resume from step $stopped_at"
grep -q "^step $steps/$steps " "$log" || fail "the resumed run did not reach step $steps"
digest="$(sed -n 's/^parameters_crc32c=//p' "$log" | tail -1)"
[ "$digest" = "$reference" ] || fail "final parameters differ: requeued $digest, uninterrupted $reference"
grep -q '^test_accuracy=' "$log" || fail "no test_accuracy line"
echo "PASS: job $job preempted at step $stopped_at, requeued, resumed, completed; parameters_crc32c=$digest as uninterrupted"
trap - EXIT
