#!/usr/bin/env bash
# Issue 20, item 3 (submitit #1782) on the local cluster: a job submitted from inside another job's step gets
# its own geometry, not the parent's. A raw `sbatch` from inside a 1-task step leaks SLURM_STEP_NUM_TASKS=1
# and SLURM_STEP_ID into the child's batch script (seen on Slurm 22.05: the control below); the probe's
# --submit from the same place leaves them out, and its 2-node child runs 2 ranks on n1 and n2.
# Usage: submit_from_job_test.sh <hpctrain_job_probe binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/slurm_test_support.sh"
fail_logs='*.log hpctrain-jobs/*/*/*.out'
probe="$(realpath "$1")"
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/submit-from-job-test.XXXXXX")"
cd "$work"
unset HPCTRAIN_RUN_DIR

# The control: what a submission that passes its environment on leaks.
salloc --quiet --nodes=1 --partition=debug --time=5 srun --ntasks=1 \
  sbatch --parsable --nodes=2 --ntasks-per-node=1 --partition=debug --time=2 --output="$work/control-%j.out" \
  --wrap='echo "control batch SLURM_STEP_NUM_TASKS=${SLURM_STEP_NUM_TASKS:-unset} SLURM_STEP_ID=${SLURM_STEP_ID:-unset}"' \
  > control.log 2>&1 || fail "the control submission failed"
control="$(tail -n 1 control.log)"
[ "$(final_state "$control")" = COMPLETED ] || fail "the control job did not complete"
grep -q '^control batch SLURM_STEP_NUM_TASKS=1 SLURM_STEP_ID=0$' "control-$control.out" ||
  echo "note: this Slurm does not leak the step's variables through sbatch (the check below still holds)"

PROBE_NODES=2 PROBE_NAME=child PROBE_SHOW_BATCH_ENV=1 \
  salloc --quiet --nodes=1 --partition=debug --time=5 srun --ntasks=1 "$probe" --submit > submit.log 2>&1 ||
  fail "--submit from inside a step failed"
child="$(sed -n 's/^submitted job \([0-9]*\)$/\1/p' submit.log)"
[ -n "$child" ] || fail "--submit did not name the child job"
[ "$(final_state "$child")" = COMPLETED ] || fail "the child job did not complete"
log="hpctrain-jobs/child/$child/slurm-$child.out"
grep -q '^probe batch SLURM_STEP_NUM_TASKS=unset SLURM_STEP_ID=unset SLURM_PTY_PORT=unset$' "$log" ||
  fail "the parent's step variables reached the child's batch script"
grep -q '^probe rank=0 ntasks=2 node=n1 ' "$log" && grep -q '^probe rank=1 ntasks=2 node=n2 ' "$log" ||
  fail "the child did not run its own geometry (2 ranks on n1 and n2)"
echo "ok: a job submitted from inside a 1-task step ran its own 2 ranks on n1 and n2, with no step variable of the parent"
rm -rf "$work"
