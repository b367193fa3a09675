# Sourced by the fault-injection tests: where figures go, and the helpers they share.
# Each test appends `key=value` lines to $results/<test>.txt; scripts/reliability-report reads them.
results="${HPCTRAIN_FAULT_RESULTS:-${HPCTRAIN_BUILD_DIR:-/tmp}/fault-results}"
mkdir -p "$results"
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/slurm_test_support.sh"  # fail, wait_for
wait_interval=0.5  # the fault figures are timings: poll finely
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
