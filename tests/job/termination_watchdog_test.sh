#!/usr/bin/env bash
# Issue 12, defect (a): SIGTERM sets the preemption flag, so a rank torn down after a peer failed would try to
# agree on a checkpoint and wait in a collective for a peer that never answers (Gloo/NCCL wait minutes). The
# termination watchdog ends such a rank: after SIGTERM, no step completes for HPCTRAIN_TERM_STALL_SECONDS and the
# ranks have not agreed, so it exits 143 at once, saying why. Here rank 1 is frozen (SIGSTOP: alive, silent, as
# a hung peer) and rank 0 gets SIGTERM, as from srun's teardown; without the watchdog rank 0 would wait in the
# gradient all-reduce for the process group's 5-minute timeout.
# Usage: termination_watchdog_test.sh <fashion_mnist binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
on_fail='[ -z "${rank1:-}" ] || kill -KILL "$rank1" 2>/dev/null'
binary="$(realpath "$1")"
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/termination-watchdog-test.XXXXXX")"
cd "$work"
unset HPCTRAIN_RUN_DIR
export HPCTRAIN_TERM_STALL_SECONDS=3

"$binary" --local 2 --max-steps 100000 --max-eval-examples 1000 > run.log 2>&1 &
launcher=$!
for _ in $(seq 1 300); do grep -q '^step 50/' run.log && break; sleep 1; done
grep -q '^step 50/' run.log || fail "the run never reached step 50"
rank0="" rank1=""
for pid in $(pgrep -P "$launcher"); do
  rank="$(tr '\0' '\n' < "/proc/$pid/environ" | sed -n 's/^RANK=//p')"
  [ "$rank" = 0 ] && rank0=$pid
  [ "$rank" = 1 ] && rank1=$pid
done
[ -n "$rank0" ] && [ -n "$rank1" ] || fail "ranks not found under launcher $launcher"
kill -STOP "$rank1"
kill -TERM "$rank0"
for _ in $(seq 1 120); do kill -0 "$rank0" 2>/dev/null || break; sleep 1; done
if kill -0 "$rank0" 2>/dev/null; then fail "rank 0 still waits 120 s after SIGTERM"; fi
kill -KILL "$rank1" 2>/dev/null || true
status=0
wait "$launcher" || status=$?
grep -q '^rank 0: SIGTERM, then no step completed for 3000 ms and the ranks did not agree to checkpoint: a peer is gone' run.log ||
  fail "rank 0 did not say why it exited"
[ "$status" = 143 ] || fail "the launcher exited $status, not rank 0's 143"
if grep -q '^preempted: checkpointed' run.log; then fail "a torn-down rank checkpointed as if preempted"; fi
echo "PASS: rank 0 left 143 after SIGTERM with a frozen peer"
