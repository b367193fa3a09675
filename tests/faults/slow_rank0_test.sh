#!/usr/bin/env bash
# Fault: rank 0 of a real 2-node job is slow to start (srun's task prolog sleeps before rank 0's process starts, as
# on a slow node). With the delay past the rendezvous timeout (HPCTRAIN_RENDEZVOUS_TIMEOUT_S) rank 1 waits the whole
# timeout, then fails naming rank 0's host and port, and the job ends FAILED; with the delay inside the timeout the
# job completes.  Usage: slow_rank0_test.sh <fashion_mnist binary>
set -euo pipefail
binary="$(realpath "$1")"
source "$(dirname "$(realpath "$0")")/fault_support.sh"   # before the cd: $0 may be relative
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/slow-rank0-test.XXXXXX")"
cd "$work"
job=""
trap '[ -n "$job" ] && scancel "$job" 2>/dev/null || true' EXIT
job_state() { scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }

# The delay comes from outside the program: `--env SLURM_TASK_PROLOG=<script>` exports it in the batch script (the
# submitting shell's SLURM_* variables do not reach sbatch), srun reads it there, and slurmstepd runs the script
# before it starts each task. For rank 0 it notes that it started, then sleeps; a step that fails meanwhile (rank 1
# giving up) kills it with the step.
prolog="$work/delay_rank0.sh" started="$work/rank0-delay-started"
cat > "$prolog" <<EOF
#!/bin/sh
[ "\$SLURM_PROCID" = 0 ] || exit 0
touch '$started'
sleep "\$DELAY_RANK0_S"
EOF
chmod +x "$prolog"

# run_job <delay s> <timeout s>: submits 5 steps with rank 0 delayed; sets job, log, started_at, ended_at
# (started_at: rank 0's delay began, i.e. both ranks' tasks are starting).
run_job() {
  local out
  rm -f "$started"
  out="$(HPCTRAIN_RENDEZVOUS_TIMEOUT_S="$2" "$binary" --submit --env SLURM_TASK_PROLOG="$prolog" \
    --env DELAY_RANK0_S="$1" --max-steps 5 --max-eval-examples 1000)"
  job="$(sed -n 's/^submitted job \([0-9]*\).*/\1/p' <<<"$out" | head -1)"
  [ -n "$job" ] || fail "no job id: $out"
  log="$(scontrol show job "$job" | sed -n 's/^ *StdOut=//p')"
  wait_for "[ -e '$started' ]" 900 || fail "job $job: rank 0's delay never began (srun's task prolog did not run)"
  started_at="$(now)"
  wait_for "! squeue --noheader --jobs $job 2>/dev/null | grep -q ." 600 || fail "job $job did not end"
  ended_at="$(now)"
}

echo "== 1. rank 0 starts 60 s late, the rendezvous timeout is 10 s"
run_job 60 10
late_job=$job late_state="$(job_state "$job")" late_s="$(elapsed "$started_at" "$ended_at")"
echo "job $late_job ended $late_state $late_s s after rank 0 began its delay"
case "$late_state" in COMPLETED*) fail "job $late_job completed although rank 0 was 60 s late for a 10 s rendezvous";; esac
message="$(grep -o 'rank 1 of 2 could not rendezvous at [^ ]*:[0-9]* within 10000 ms (the rendezvous timeout: HPCTRAIN_RENDEZVOUS_TIMEOUT_S' "$log" | head -1)" ||
  fail "rank 1's error does not name rank 0's host and port and the timeout, by name"
echo "rank 1 said: $message"
# Rank 1 waited the timeout (not less); the job did not wait for rank 0's full delay.
awk -v s="$late_s" 'BEGIN { exit !(s >= 10 - 1) }' || fail "rank 1 gave up after $late_s s, before the 10 s timeout"
awk -v s="$late_s" 'BEGIN { exit !(s < 60) }' || fail "the job waited $late_s s: for rank 0, not for the timeout"

echo "== 2. rank 0 starts 5 s late, the rendezvous timeout is 60 s"
run_job 5 60
ok_job=$job ok_state="$(job_state "$job")" ok_s="$(elapsed "$started_at" "$ended_at")"
echo "job $ok_job ended $ok_state $ok_s s after rank 0 began its delay"
[ "$ok_state" = COMPLETED ] || fail "job $ok_job ended $ok_state with rank 0 5 s late for a 60 s rendezvous"
grep -q '^step 5/5 ' "$log" || fail "job $ok_job did not train its 5 steps"
# Rank 0 did start late: the job lasted at least its delay.
awk -v s="$ok_s" 'BEGIN { exit !(s >= 5) }' || fail "job $ok_job ended $ok_s s after rank 0's delay of 5 s began"
job=""

{
  echo "late_job=$late_job"
  echo "late_delay_s=60"
  echo "late_timeout_s=10"
  echo "late_state=$late_state"
  echo "late_delay_start_to_job_end_s=$late_s"
  echo "late_message=$message"
  echo "within_job=$ok_job"
  echo "within_delay_s=5"
  echo "within_timeout_s=60"
  echo "within_state=$ok_state"
  echo "within_delay_start_to_job_end_s=$ok_s"
} > "$results/slow_rank0.txt"
echo "PASS: 60 s late for a 10 s timeout: job $late_job $late_state after $late_s s, rank 1 named host and port; 5 s late for 60 s: job $ok_job COMPLETED"
