#!/usr/bin/env bash
# Issue 20, item 2 on the local cluster, with the torch-free probe (PROBE_CHAIN: a 2-node stage, then a
# 1-node stage `<name>-second`):
#   a chain whose stages succeed runs both, the second after the first, each with its own geometry and name;
#   a chain whose first stage fails leaves the second PENDING forever, and --status says why; --cancel ends it;
#   --submit --after JOB waits for JOB (afterok).
# Usage: chain_test.sh <hpctrain_job_probe binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/slurm_test_support.sh"
probe="$(realpath "$1")"
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/chain-test.XXXXXX")"
cd "$work"
unset HPCTRAIN_RUN_DIR
export PROBE_NODES=2

# squeue's reason for job $1, waiting (at most a minute) until it is $2.
wait_reason() {
  for _ in $(seq 60); do
    [ "$(squeue --noheader --jobs "$1" --format %r 2>/dev/null)" = "$2" ] && return 0
    sleep 1
  done
  return 1
}

PROBE_CHAIN=ok PROBE_NAME=chain-ok "$probe" --submit > ok-submit.log 2>&1 || fail "--submit of a chain failed"
first="$(sed -n 's/^  stage 1 chain-ok: job \([0-9]*\)$/\1/p' ok-submit.log)"
second="$(sed -n 's/^  stage 2 chain-ok-second: job \([0-9]*\)$/\1/p' ok-submit.log)"
[ -n "$first" ] && [ -n "$second" ] || fail "--submit did not name both stages' jobs"
[ "$(final_state "$second")" = COMPLETED ] || fail "the second stage of a good chain did not complete"
[ "$(final_state "$first")" = COMPLETED ] || fail "the first stage of a good chain did not complete"
grep -q "^probe stage=chain-ok job=$first nodes=2\$" "hpctrain-jobs/chain-ok/$first/slurm-$first.out" ||
  fail "the first stage did not run as chain-ok on 2 nodes"
grep -q "^probe stage=chain-ok-second job=$second nodes=1\$" "hpctrain-jobs/chain-ok-second/$second/slurm-$second.out" ||
  fail "the second stage did not run as chain-ok-second on 1 node"
grep -qx "probe stage_dirs=chain-ok=$(pwd -P)/hpctrain-jobs/chain-ok/$first" "hpctrain-jobs/chain-ok-second/$second/slurm-$second.out" ||
  fail "the second stage was not told the first stage's directory (HPCTRAIN_STAGE_DIRS)"
grep -q "stage_dirs" "hpctrain-jobs/chain-ok/$first/slurm-$first.out" && fail "the first stage was told earlier stages"
echo "ok: a 2-stage chain ran stage chain-ok (2 nodes) then chain-ok-second (1 node, told the first's directory), both COMPLETED"

PROBE_CHAIN=fail PROBE_NAME=chain-fail "$probe" --submit > fail-submit.log 2>&1 || fail "--submit of a chain failed"
first="$(sed -n 's/^  stage 1 chain-fail: job \([0-9]*\)$/\1/p' fail-submit.log)"
second="$(sed -n 's/^  stage 2 chain-fail-second: job \([0-9]*\)$/\1/p' fail-submit.log)"
[ "$(final_state "$first")" = FAILED ] || fail "the failing first stage did not end FAILED"
wait_reason "$second" DependencyNeverSatisfied || fail "the second stage is not DependencyNeverSatisfied"
PROBE_CHAIN=fail PROBE_NAME=chain-fail "$probe" --status > fail-status.log 2>&1 || fail "--status failed"
grep -q "^  stage 1 chain-fail (job $first): FAILED" fail-status.log || fail "--status does not show stage 1 FAILED"
grep -q "^  stage 2 chain-fail-second (job $second): PENDING" fail-status.log || fail "--status does not show stage 2 PENDING"
grep -qF "never starts: stage 1 (chain-fail, job $first) did not complete successfully" fail-status.log ||
  fail "--status does not say why stage 2 never starts"
[ ! -e "hpctrain-jobs/chain-fail-second/$second/slurm-$second.out" ] || fail "the second stage ran"
PROBE_CHAIN=fail PROBE_NAME=chain-fail "$probe" --cancel > fail-cancel.log 2>&1 || fail "--cancel failed"
[ "$(final_state "$second")" = CANCELLED ] || fail "--cancel did not cancel the waiting stage"
echo "ok: a chain whose first stage FAILED left the second PENDING (DependencyNeverSatisfied), --status said so, --cancel ended it"

# --local runs the stages in order, each told the earlier ones' run directories; a failing stage stops the chain.
PROBE_CHAIN=ok PROBE_NAME=chain-local "$probe" --local 1 > local.log 2>&1 || log=local.log fail "--local of a chain failed"
first_dir="$(sed -n 's/^run directory: //p' local.log | head -1)"
grep -q "^stage 2 of 2: chain-local-second$" local.log && grep -q "^probe stage=chain-local-second " local.log ||
  log=local.log fail "--local did not run the second stage"
grep -qx "probe stage_dirs=chain-local=$first_dir" local.log ||
  log=local.log fail "--local did not tell the second stage the first stage's run directory ($first_dir)"
status=0
PROBE_CHAIN=fail PROBE_NAME=chain-local-fail "$probe" --local 1 > local-fail.log 2>&1 || status=$?
[ "$status" = 3 ] && grep -q "stage 1 (chain-local-fail) exited 3: the later stages do not run" local-fail.log &&
  ! grep -q "^probe stage=chain-local-fail-second" local-fail.log ||
  log=local-fail.log fail "a failing first stage under --local: exit $status, or the second stage ran"
[ "$(grep -c '^probe first_stage_only=1$' local.log)" = 1 ] && grep -q '^probe first_stage_only=unset$' local.log ||
  log=local.log fail "--local let the first stage's own variable (Job::env) reach the second stage"
echo "ok: --local ran the chain's stages in order (the second told the first's directory) and stopped at a failing one"

PROBE_NAME=after "$probe" --submit --after "$first" > after-submit.log 2>&1 || fail "--submit --after failed"
after="$(sed -n 's/^submitted job \([0-9]*\)$/\1/p' after-submit.log)"
grep -q '^#SBATCH --dependency=afterok:'"$first"'$' "hpctrain-jobs/after/$after/job.sbatch" || fail "no afterok line"
wait_reason "$after" DependencyNeverSatisfied || fail "--after a failed job is not DependencyNeverSatisfied"
scancel "$after"
echo "ok: --submit --after $first wrote --dependency=afterok:$first and waits forever on the failed job"
rm -rf "$work"
