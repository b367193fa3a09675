# Sourced by the shell tests that run jobs on the local cluster; brings shell_test_support.sh along.
source "$(dirname "${BASH_SOURCE[0]}")/shell_test_support.sh"

# release_requeue_hold <job id>: Slurm holds a requeued job for about two minutes (Reason=BeginTime) before
# it may start again; the tests release it early, as an operator may with `scontrol update StartTime=now`.
# What they check is hpctrain's checkpoint, requeue and resume, not Slurm's back-off. Not within the seconds
# after the requeue, though: slurmd refuses a launch credential issued in the second it revoked the job's last
# one ("Killing non-startable batch JobId=...: Job credential revoked") and the job ends FAILED, so a hold is
# released once this shell has seen it for 3 s (requeue_hold_seen: job id -> $SECONDS). Always succeeds.
declare -A requeue_hold_seen=()
release_requeue_hold() {
  local shown
  shown="$(scontrol --oneliner show job "$1" 2>/dev/null)" || return 0
  case "$shown" in
    *" JobState=PENDING "*" Reason=BeginTime "*)
      [ -n "${requeue_hold_seen[$1]:-}" ] || requeue_hold_seen[$1]=$SECONDS
      if [ $((SECONDS - requeue_hold_seen[$1])) -ge 3 ]; then
        scontrol update "JobId=$1" StartTime=now >/dev/null 2>&1 || true
        unset "requeue_hold_seen[$1]"
      fi ;;
  esac
  return 0
}

# reference_digest <file> <steps>: the parameters_crc32c of the uninterrupted run the preemption tests compare
# with, from the "<steps> <digest>" line the fixture tests/train/fashion_mnist_reference.sh wrote; fails when it
# is missing or ran another number of steps.
reference_digest() {
  local steps digest
  read -r steps digest < "$1" || fail "no reference in $1"
  [ "$steps" = "$2" ] || fail "the reference ran $steps steps, this test $2"
  echo "$digest"
}

# final_state <job id>: the state of a job once it left the queue (scontrol: the local cluster keeps no
# accounting), waiting at most 3 minutes; TIMEOUT if it is still queued then.
final_state() {
  local _
  for _ in $(seq 180); do
    if [ -z "$(squeue --noheader --jobs "$1" 2>/dev/null)" ]; then
      scontrol --oneliner show job "$1" 2>/dev/null | sed -n 's/.* JobState=\([A-Z_]*\).*/\1/p'
      return 0
    fi
    sleep 1
  done
  echo TIMEOUT
}
