#!/usr/bin/env bash
# Preemption by a higher-priority partition, end to end with the real Trainer: a 2-node Fashion-MNIST job in
# partition `preemptable` is preempted mid-run by a job in `urgent` (PreemptType=preempt/partition_prio,
# scripts/slurm-local). Its ranks get SIGTERM (not our USR2), agree, checkpoint, exit 75; the job is
# requeued, resumes from the checkpoint and completes with final parameters bit-identical to an
# uninterrupted 2-rank run.  Usage: preemption_training_test.sh <fashion_mnist binary> <reference file>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/slurm_test_support.sh"
binary="$(realpath "$1")"
reference_file="$2"  # from the fixture tests/train/fashion_mnist_reference.sh
steps=150  # the same in tests/train/fashion_mnist_reference.sh
if ! scontrol show partition preemptable >/dev/null 2>&1; then
  echo "SKIP: the local cluster has no partition preemptable (scripts/slurm-local up adds it)"; exit 0
fi
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/preemption-test.XXXXXX")"
cd "$work"
export HPCTRAIN_REPORT_DIGEST=1  # the ranks print their parameter digest (sbatch passes the environment on)

reference="$(reference_digest "$reference_file" "$steps")"

echo "== submit to the preemptable partition"
out="$("$binary" --submit --partition preemptable --max-steps "$steps" --max-eval-examples 1000)"
job="$(sed -n 's/^submitted job \([0-9]*\).*/\1/p' <<<"$out" | head -1)"
[ -n "$job" ] || fail "no job id: $out"
trap 'scancel "$job" ${urgent:-} 2>/dev/null || true' EXIT
log="$(scontrol show job "$job" | sed -n 's/^ *StdOut=//p')"
echo "job $job, log $log"
# Past step 50 the signal lands within a second or two (seen: 10 to 20 steps later), well before the end.
wait_for "grep -q '^step 50/' '$log' 2>/dev/null" 600 || fail "job $job never reached step 50"

echo "== a job in the urgent partition wants both nodes whole: Slurm preempts ours with SIGTERM"
urgent="$(sbatch --parsable --partition urgent --nodes 2 --exclusive --job-name urgent --output /dev/null --wrap 'sleep 5')"
wait_for "grep -q '^preempted: checkpointed step' '$log'" 120 || fail "no preemption checkpoint after SIGTERM"
stopped_at="$(sed -n 's/^preempted: checkpointed step \([0-9]*\) .*/\1/p' "$log" | head -1)"
echo "checkpointed at step $stopped_at"

# Slurm holds a requeued job about two minutes (BeginTime) before it runs again: released at once.
wait_for "release_requeue_hold $job; scontrol show job $job | grep -q 'JobState=COMPLETED'" 600 || fail "job $job did not complete: $(scontrol show job "$job" | grep -o 'JobState=[A-Z_]*')"
grep -q "^resumed from .* at step $stopped_at " "$log" || fail "the requeued run did not resume from step $stopped_at"
grep -q "^step $steps/$steps " "$log" || fail "the resumed run did not reach step $steps"
digest="$(sed -n 's/^parameters_crc32c=//p' "$log" | tail -1)"
[ "$digest" = "$reference" ] || fail "final parameters differ: preempted $digest, uninterrupted $reference"
echo "PASS: job $job preempted by job $urgent at step $stopped_at, requeued, resumed, completed; parameters_crc32c=$digest as uninterrupted"
trap - EXIT
