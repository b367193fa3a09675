# Sourced by the shell tests that run jobs on the local cluster.
#
# release_requeue_hold <job id>: Slurm holds a requeued job for about two minutes (Reason=BeginTime) before
# it may start again; the tests release it at once, as an operator may with `scontrol update StartTime=now`.
# What they check is hpctrain's checkpoint, requeue and resume, not Slurm's back-off. Always succeeds.
release_requeue_hold() {
  local shown
  shown="$(scontrol --oneliner show job "$1" 2>/dev/null)" || return 0
  case "$shown" in
    *" JobState=PENDING "*" Reason=BeginTime "*) scontrol update "JobId=$1" StartTime=now >/dev/null 2>&1 || true ;;
  esac
  return 0
}
