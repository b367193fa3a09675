#!/usr/bin/env bash
# Fault: the `slurmd` of one node of a running 2-node job is SIGKILLed, as when a node's daemon crashes or
# the node drops off the network. slurmctld hears nothing for SlurmdTimeout (scripts/slurm-local sets 30 s),
# marks the node DOWN and, since the example's job is requeueable (`#SBATCH --requeue`), requeues it. Once
# the node's slurmd is back (ReturnToService=2) the job runs again and resumes from its last checkpoint
# (Slurm's 120 s hold of a requeued job is released by the test).
# The cluster is shared: the test waits until no other job runs, and a trap restarts the slurmd it killed
# whatever happens.  Usage: slurmd_kill_test.sh <fashion_mnist binary>
set -euo pipefail
binary="$(realpath "$1")"
source "$(dirname "$(realpath "$0")")/fault_support.sh"   # before the cd: $0 may be relative
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/slurmd-kill-test.XXXXXX")"
cd "$work"
slurm_dir="$(dirname "$SLURM_CONF")"
node=n2                       # not the batch host (n1): the batch script survives, as on a real cluster
pid_file="$slurm_dir/run/slurmd-$node.pid"
[ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2>/dev/null || fail "slurmd of $node is not running ($pid_file)"
timeout_s="$(scontrol show config | awk '$1 == "SlurmdTimeout" {print $3}')"
echo "SlurmdTimeout=$timeout_s s"

job=""
killed=0
restore() {
  [ -n "$job" ] && scancel "$job" 2>/dev/null || true
  if [ "$killed" = 1 ] && ! { [ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2>/dev/null; }; then
    echo "== restoring slurmd of $node"
    /usr/sbin/slurmd -f "$SLURM_CONF" -N "$node" || true
  fi
  # A node that was DOWN returns once its slurmd registers (ReturnToService=2); nudge it if it did not.
  wait_for "sinfo -h -n $node -o %t | grep -Eq '^(idle|alloc|mix)'" 60 ||
    { scontrol update nodename="$node" state=resume 2>/dev/null || true; }
}
trap restore EXIT

# Other engineers' jobs would die with the node: wait for an idle cluster (their jobs end within minutes).
wait_for "! squeue --noheader --states=RUNNING,COMPLETING 2>/dev/null | grep -q ." 600 ||
  fail "the cluster stayed busy for 10 minutes; not killing a slurmd under someone else's job"

# A checkpoint every 50 steps and a progress line every 10: the kill comes soon after the first checkpoint
# (the example's own 250 steps cost 2 ranks 50 s of CPU more to reach).
out="$("$binary" --submit --max-steps 100000 --max-eval-examples 1000 --checkpoint-every 50 --log-every 10)"
job="$(sed -n 's/^submitted job \([0-9]*\).*/\1/p' <<<"$out" | head -1)"
[ -n "$job" ] || fail "no job id: $out"
log="$(scontrol show job "$job" | sed -n 's/^ *StdOut=//p')"
echo "job $job, log $log"
# Past step 60 the checkpoint of step 50 exists.
wait_for "grep -q '^step 60/' '$log' 2>/dev/null" 900 || fail "job $job never reached step 60"
scontrol show job "$job" | grep -q 'Requeue=1' || fail "job $job is not requeueable"

echo "== SIGKILL slurmd of $node (pid $(cat "$pid_file")) at $(grep -o '^step [0-9]*/' "$log" | tail -1)"
killed_at="$(now)"
killed=1
kill -KILL "$(cat "$pid_file")"
job_state() { scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
# scontrol, not sinfo: sinfo's short state of a DOWN node whose job is still completing is "comp".
node_down() { scontrol show node "$node" | grep -Eq 'State=DOWN'; }
wait_for node_down $((timeout_s * 3)) ||
  fail "$node not marked down $((timeout_s * 3)) s after its slurmd was killed"
down_at="$(now)"
# Slurm requeues the job (NODE_FAIL -> PENDING, Restarts=1) or, were it not requeueable, ends it.
wait_for "scontrol show job $job | grep -q 'Restarts=[1-9]'" 120 ||
  fail "job $job was not requeued after $node went down (state $(job_state))"
requeued_at="$(now)"
echo "$node DOWN $(elapsed "$killed_at" "$down_at") s after the kill; job $job requeued $(elapsed "$killed_at" "$requeued_at") s after it (state $(job_state))"

echo "== the node comes back: restart its slurmd"
/usr/sbin/slurmd -f "$SLURM_CONF" -N "$node"
killed=0
wait_for "sinfo -h -n $node -o %t | grep -Eq '^(idle|alloc|mix)'" 120 ||
  { scontrol update nodename="$node" state=resume 2>/dev/null || true; }
back_at="$(now)"
# Slurm holds a requeued batch job for 120 s (its begin time) before it may start again; release it now,
# as an administrator would, so that the test stays short. What is tested is that it resumes, not when.
wait_for '[ "$(job_state)" = PENDING ]' 120 || fail "the requeued job $job is $(job_state), not PENDING"
# That hold also lets the first run drain: its rank on n2 and n2's slurmstepd of step $job.0 exit, and the
# REQUEST_TERMINATE_JOB slurmctld sent to the dead slurmd, kept in its agent's retry queue, reaches the new
# one. The requeued run reuses the job and step ids: started before that kill arrives, its own step $job.0
# is the one killed (seen in CI and here: srun "Requested nodes are busy" for 10 minutes, or exit 137). So
# the early release waits until nothing of the first run is left and slurmctld has no message in flight, and
# then 5 s more for the kill's epilog, which slurmd runs after it answered.
first_run_gone() { [ -z "$(job_pids "$job")" ] && ! pgrep -f "^slurmstepd: \[$job\." >/dev/null; }
slurmctld_idle() { sdiag | awk '/^Agent (queue size|count):/ { n += $NF } END { exit n != 0 }'; }
drained() { first_run_gone && slurmctld_idle; }
{ wait_for drained 180 && sleep 5 && wait_for drained 60; } ||
  fail "job $job's first run did not drain 180 s after its requeue: pids $(job_pids "$job" | tr '\n' ' '), $(sdiag | grep '^Agent' | tr '\n' ' ')"
scontrol update jobid="$job" StartTime=now || fail "could not release the requeued job $job"
wait_for "grep -q '^resumed from .* at step [0-9]* ' '$log' 2>/dev/null" 600 ||
  fail "the requeued job $job did not resume from a checkpoint"
resumed_at="$(now)"
resumed_step="$(grep -o '^resumed from .* at step [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')"
[ "$resumed_step" -ge 50 ] || fail "resumed from step $resumed_step, expected the checkpoint of step 50 or later"
# It trains on from there: one more progress line after the resume.
wait_for "sed -n '/^resumed from/,\$p' '$log' | grep -q '^step [0-9]*/'" 300 || fail "the resumed job does not train"
scancel "$job"
wait_for "! squeue --noheader --jobs $job 2>/dev/null | grep -q ." 60 || fail "job $job still queued after scancel"
sleep 1
left="$(job_pids "$job" | tr '\n' ' ')"
[ -z "$left" ] || fail "processes of job $job left after it ended: $left"

{
  echo "job=$job"
  echo "slurmd_timeout_s=$timeout_s"
  echo "kill_to_node_down_s=$(elapsed "$killed_at" "$down_at")"
  echo "kill_to_requeue_s=$(elapsed "$killed_at" "$requeued_at")"
  echo "node_back_to_resumed_s=$(elapsed "$back_at" "$resumed_at")"
  echo "resumed_from_step=$resumed_step"
  echo "processes_left=0"
} > "$results/slurmd_kill.txt"
echo "PASS: slurmd of $node killed; node DOWN after $(elapsed "$killed_at" "$down_at") s, job $job requeued after $(elapsed "$killed_at" "$requeued_at") s, resumed from step $resumed_step $(elapsed "$back_at" "$resumed_at") s after the node came back"
