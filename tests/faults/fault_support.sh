# Sourced by the fault-injection tests: failure reporting, waiting, and where figures go.
# Each test appends `key=value` lines to $results/<test>.txt; scripts/reliability-report reads them.
results="${HPCTRAIN_FAULT_RESULTS:-${HPCTRAIN_BUILD_DIR:-/tmp}/fault-results}"
mkdir -p "$results"
fail() { echo "FAIL: $*" >&2; [ -n "${log:-}" ] && [ -f "$log" ] && tail -n 30 "$log" >&2; exit 1; }
# wait_for <command> <seconds>: polls every 0.5 s until the command succeeds
wait_for() {
  local deadline=$((SECONDS + $2))
  until eval "$1"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.5
  done
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
# pids of processes whose environment has SLURM_JOB_ID=<job> (both local nodes run on this host)
job_pids() {
  local p
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" = "$$" ] && continue
    { tr '\0' '\n' < "$p/environ"; } 2>/dev/null | grep -qx "SLURM_JOB_ID=$1" && echo "${p#/proc/}"
  done
  return 0
}
# pid of the task with SLURM_PROCID=<rank> of job <job> running <binary>
rank_pid() {
  local p
  for p in $(job_pids "$1"); do
    [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$3" ] || continue
    { tr '\0' '\n' < "/proc/$p/environ"; } 2>/dev/null | grep -qx "SLURM_PROCID=$2" && { echo "$p"; return 0; }
  done
  return 1
}
