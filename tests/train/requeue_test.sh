#!/usr/bin/env bash
# End to end on the local Slurm cluster, both ways a running job is told to stop, in one 2-node Fashion-MNIST job
# of the partition `preemptable` (scripts/slurm-local):
#  1. preemption by a higher-priority partition (PreemptType=preempt/partition_prio): a job in `urgent` wants both
#     nodes; Slurm sends the ranks SIGTERM (not our USR2), they agree, checkpoint, exit 75, the job is requeued;
#  2. after the resume, USR2 (as `srun --signal=USR2@grace` delivers it before a time limit) to the job's steps:
#     checkpoint, exit 75, requeued by its batch script;
# then it resumes again and completes, restarted exactly twice, with final parameters bit-identical to an
# uninterrupted 2-rank run. (One job for both: each was a job of its own, and a Slurm job's round trip is most of
# this test's time.)  Usage: requeue_test.sh <fashion_mnist binary> <reference file>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/slurm_test_support.sh"
# Without the dataset this is a skip with its reason (ctest: SKIP_RETURN_CODE 77), not a failure.
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  { echo "SKIP: Fashion-MNIST is not installed at /usr/share/datasets/fashion-mnist (apt install dataset-fashion-mnist)"; exit 77; }
scontrol show partition preemptable >/dev/null 2>&1 ||
  fail "the local cluster has no partition preemptable (scripts/slurm-local up adds it)"
binary="$(realpath "$1")"
reference_file="$2"  # from the fixture tests/train/fashion_mnist_reference.sh
steps=150  # the same in tests/train/fashion_mnist_reference.sh
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/requeue-test.XXXXXX")"
cd "$work"

reference="$(reference_digest "$reference_file" "$steps")"

echo "== submit to the preemptable partition"
# A line every 10 steps (the default is 50): the test reads the steps from the log.
out="$("$binary" --submit --report-digest --partition preemptable --max-steps "$steps" --max-eval-examples 1000 --log-every 10)"
echo "$out"
job="$(sed -n 's/^submitted job \([0-9]*\).*/\1/p' <<<"$out" | head -1)"
[ -n "$job" ] || fail "no job id: $out"
trap 'scancel "$job" ${urgent:-} 2>/dev/null || true' EXIT
log="$(scontrol show job "$job" | sed -n 's/^ *StdOut=//p')"
echo "job $job, log $log"
# stopped_at N: the step of the Nth preemption checkpoint in the log
stopped_at() { sed -n 's/^preempted: checkpointed step \([0-9]*\) .*/\1/p' "$log" | sed -n "$1p"; }
# resume N: wait for the Nth requeue to run again (Slurm holds a requeued job about two minutes, Reason=BeginTime:
# released at once) and for its line "resumed from ... at step" of the Nth checkpoint
resume() {
  wait_for "release_requeue_hold $job; [ \"\$(grep -c '^resumed from ' '$log')\" -ge $1 ]" 600 ||
    fail "job $job did not resume after preemption $1: $(scontrol show job "$job" | grep -o 'JobState=[A-Z_]*')"
  grep '^resumed from ' "$log" | sed -n "$1p" | grep -q " at step $(stopped_at "$1") " ||
    fail "the requeued run did not resume from step $(stopped_at "$1"): $(grep '^resumed from ' "$log" | sed -n "$1p")"
  echo "resumed from step $(stopped_at "$1")"
}

# The partition's preemption first: from its request to the signal takes Slurm's scheduler a few seconds (seen
# 10 to 20 steps); USR2 lands at the next preemption check, 10 steps at most.
wait_for "grep -q '^step 40/' '$log' 2>/dev/null" 600 || fail "job $job never reached step 40"
echo "== 1. a job in the urgent partition wants both nodes whole: Slurm preempts ours with SIGTERM"
urgent="$(sbatch --parsable --partition urgent --nodes 2 --exclusive --job-name urgent --output /dev/null --wrap 'sleep 5')"
wait_for "grep -q '^preempted: checkpointed step' '$log'" 120 || fail "no preemption checkpoint after SIGTERM"
echo "checkpointed at step $(stopped_at 1)"
resume 1

# The resumed run's first progress line (every 10 steps), so that USR2 finds it training wherever the partition's
# preemption stopped it (a fixed step failed when the scheduler took longer than usual: stopped at 94, it never
# logged step 90 again).
resumed_line="$(grep -n '^resumed from ' "$log" | head -1 | cut -d: -f1)"
wait_for "tail -n +$resumed_line '$log' | grep -q '^step [0-9]*/'" 600 ||
  fail "the resumed job $job logged no step after step $(stopped_at 1)"
echo "== 2. USR2 to the job's steps (not the batch script, which must survive to requeue)"
scancel --signal=USR2 "$job"
wait_for "[ \"\$(grep -c '^preempted: checkpointed step' '$log')\" -ge 2 ]" 120 || fail "no preemption checkpoint after USR2"
echo "checkpointed at step $(stopped_at 2)"
[ "$(stopped_at 2)" -lt "$steps" ] || fail "USR2 landed at the last step: nothing to resume"
resume 2

wait_for "scontrol show job $job | grep -q 'JobState=COMPLETED'" 600 ||
  fail "job $job did not complete: $(scontrol show job "$job" | grep -o 'JobState=[A-Z_]*')"
scontrol show job "$job" | grep -q 'Restarts=2' ||
  fail "job $job was not restarted exactly twice: $(scontrol show job "$job" | grep -o 'Restarts=[0-9]*')"
grep -q "^step $steps/$steps " "$log" || fail "the resumed run did not reach step $steps"
digest="$(sed -n 's/^parameters_crc32c=//p' "$log" | tail -1)"
[ "$digest" = "$reference" ] || fail "final parameters differ: preempted twice $digest, uninterrupted $reference"
grep -q '^test_accuracy=' "$log" || fail "no test_accuracy line"
echo "PASS: job $job preempted by job $urgent at step $(stopped_at 1) (SIGTERM) and by USR2 at step $(stopped_at 2), requeued and resumed each time, completed; parameters_crc32c=$digest as uninterrupted"
trap - EXIT
