#!/usr/bin/env bash
# Issue 20's check with the real example: inside `salloc -N 2 -p debug`, `fashion_mnist --run --max-steps 5`
# trains on both nodes (the job's 2 x 1 ranks) and exits 0; Ctrl-C (SIGINT to --run) in a longer run stops
# every rank with a checkpoint, and the next --run in the same allocation resumes from it.
# Usage: fashion_mnist_run_test.sh <fashion_mnist binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
binary="$(realpath "$1")"
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/fashion-mnist-run-test.XXXXXX")"
cd "$work"
unset HPCTRAIN_RUN_DIR

status=0
salloc --quiet --nodes=2 --partition=debug --time=10 bash -c "\"$binary\" --run --max-steps 5 --max-eval-examples 1000" > five.log 2>&1 ||
  status=$?
[ "$status" = 0 ] || fail "--run --max-steps 5 inside salloc -N 2 exited $status"
grep -q '^hpctrain: --run on allocation [0-9]* (2 node(s)): 2 rank(s) on 2 node(s);' five.log || fail "not 2 ranks on 2 nodes"
grep -q '^hpctrain: 2 rank(s) on cpu (gloo)' five.log || fail "the training did not see 2 ranks"
grep -q '^step 5/5 ' five.log || fail "did not train to step 5"
echo "ok: fashion_mnist --run --max-steps 5 inside salloc -N 2 trained 2 ranks on 2 nodes to step 5 and exited 0"

# Ctrl-C, then --run again in the same allocation: the ranks checkpoint on the preemption signal and stop
# (exit 130); the second --run resumes from that checkpoint and finishes.
status=0
salloc --quiet --nodes=2 --partition=debug --time=10 bash -c "
  \"$binary\" --run --max-steps 150 --max-eval-examples 1000 > '$work/interrupted.log' 2>&1 &
  run=\$!
  for i in \$(seq 1200); do grep -q '^step 50/150 ' '$work/interrupted.log' && break; sleep 0.1; done
  kill -INT \"\$run\"
  status=0
  wait \"\$run\" || status=\$?
  echo \"run exited \$status\" >> '$work/interrupted.log'
  \"$binary\" --run --max-steps 150 --max-eval-examples 1000 > '$work/resumed.log' 2>&1 || echo \"resumed run exited \$?\" >> '$work/resumed.log'
" > salloc.log 2>&1 || status=$?
[ "$status" = 0 ] || fail "salloc around the interrupted run exited $status"
grep -q '^run exited 130$' interrupted.log || fail "the interrupted --run did not exit 130"
grep -q 'preempted: checkpointed step [0-9]* of 150' interrupted.log || fail "no checkpoint after SIGINT"
step="$(sed -n 's/.*preempted: checkpointed step \([0-9]*\) of 150.*/\1/p' interrupted.log | head -n 1)"
grep -q "resumed from .* at step $step " resumed.log || fail "the second --run did not resume from step $step"
grep -q '^step 150/150 ' resumed.log || fail "the resumed run did not finish"
if grep -q '^resumed run exited' resumed.log; then fail "the resumed run failed"; fi
echo "ok: SIGINT to --run the ranks checkpointed step $step together (exit 130); --run again resumed there and finished"
rm -rf "$work"
