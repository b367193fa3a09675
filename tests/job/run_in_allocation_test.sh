#!/usr/bin/env bash
# Issue 20, item 1 on the local cluster, with the torch-free probe (a Job of 2 nodes x 1 task):
#   --run outside an allocation exits 2 and says how to get one;
#   inside `salloc -N 2` it runs one rank per node (the job's geometry) and exits 0;
#   inside `salloc -N 1` it is refused naming the allocation and the job (exit 2);
#   the user's own `srun -N 2 -n 2 probe --run` trains as that step's two ranks;
#   SIGINT to the --run process reaches the ranks as the preemption signal: they checkpoint, stop, exit 130.
# Usage: run_in_allocation_test.sh <hpctrain_job_probe binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
probe="$(realpath "$1")"
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/run-in-allocation-test.XXXXXX")"
cd "$work"
unset HPCTRAIN_RUN_DIR
export PROBE_NODES=2 PROBE_NAME=alloc-probe
salloc_here() { salloc --quiet --partition=debug --time=5 "$@"; }

status=0
env -u SLURM_JOB_ID -u SLURM_JOBID "$probe" --run > outside.log 2>&1 || status=$?
[ "$status" = 2 ] || fail "--run outside an allocation exited $status, not 2"
grep -qF -- "--run trains on the allocation this shell is in, and there is none here" outside.log ||
  fail "--run outside an allocation does not explain itself"
grep -qF -- "salloc --nodes=2 --ntasks-per-node=1" outside.log || fail "no salloc line suggested"
echo "ok: --run outside an allocation exits 2 and suggests salloc --nodes=2 --ntasks-per-node=1"

status=0
salloc_here --nodes=2 bash -c "\"$probe\" --run first" > inside.log 2>&1 || status=$?
[ "$status" = 0 ] || fail "--run inside salloc -N 2 exited $status"
grep -q '^probe rank=0 ntasks=2 node=n1 ' inside.log || fail "no rank 0 on n1"
grep -q '^probe rank=1 ntasks=2 node=n2 ' inside.log || fail "no rank 1 on n2"
grep -q "^probe rank=0 arg0=$(printf first | xxd -p)\$" inside.log || fail "the argument did not reach the ranks"
echo "ok: --run inside salloc -N 2 ran rank 0 on n1 and rank 1 on n2 and exited 0"

status=0
salloc_here --nodes=1 bash -c "\"$probe\" --run" > small.log 2>&1 || status=$?
[ "$status" = 2 ] || fail "--run inside salloc -N 1 exited $status, not 2"
grep -qE '^\[hpctrain.spec.allocation\] allocation [0-9]+: has 1 node\(s\) but the job asks for nodes = 2' small.log ||
  fail "the small allocation's refusal does not name both"
if grep -q '^probe rank' small.log; then fail "a rank started in an allocation too small"; fi
echo "ok: --run inside salloc -N 1 is refused naming the allocation and the job's 2 nodes (exit 2)"

status=0
salloc_here --nodes=2 bash -c "srun --nodes=2 --ntasks=2 \"$probe\" --run own" > own.log 2>&1 || status=$?
[ "$status" = 0 ] || fail "srun ... --run exited $status"
[ "$(grep -c '^probe rank=[01] ntasks=2 ' own.log)" = 2 ] || fail "the user's own step did not run two ranks"
if grep -q 'hpctrain: --run on allocation' own.log; then fail "a task of the user's step started a step of its own"; fi
echo "ok: srun --nodes=2 --ntasks=2 probe --run trains as that step's two ranks"

# Ctrl-C: the --run process runs in the background of salloc's shell; once both ranks wait, SIGINT to it.
status=0
salloc_here --nodes=2 bash -c "
  \"$probe\" --run --wait-for-preemption > '$work/interrupted.log' 2>&1 &
  run=\$!
  for i in \$(seq 600); do
    [ \"\$(grep -c 'waiting for preemption' '$work/interrupted.log')\" = 2 ] && break
    sleep 0.1
  done
  kill -INT \"\$run\"
  status=0
  wait \"\$run\" || status=\$?
  echo \"run exited \$status\"
" > interrupt.log 2>&1 || status=$?
cat interrupt.log >> interrupted.log
[ "$status" = 0 ] || fail "salloc around the interrupted --run exited $status"
grep -q '^run exited 130$' interrupted.log || fail "the interrupted --run did not exit 130"
[ "$(grep -c '^probe rank=[01] preempted: checkpointing$' interrupted.log)" = 2 ] ||
  fail "SIGINT did not reach both ranks as the preemption signal"
grep -q '^hpctrain: the ranks checkpointed in .* and stopped; --run again' interrupted.log ||
  fail "no word on where the checkpoint is"
echo "ok: SIGINT to --run reached both ranks as SIGUSR2 (the preemption signal): they checkpointed and stopped; --run exited 130"
rm -rf "$work"
