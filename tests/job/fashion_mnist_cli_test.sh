#!/usr/bin/env bash
# Issue 8's checks on the real example, as a new user types them:
#   --submit with an invalid or unknown knob exits 2 naming it, writes nothing and queues nothing;
#   --local 2 --max-steps 20 run twice in one directory trains twice (a new run directory each time);
#   --local 2 --resume continues the newest run from its checkpoint, in a directory of its own;
#   --dry-run --gpus-per-node 8 runs 8 tasks a node (the example leaves tasks_per_node to follow the GPUs).
# Usage: fashion_mnist_cli_test.sh <fashion_mnist binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
fail_tail=20
binary="$(realpath "$1")"
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/fashion-mnist-cli-test.XXXXXX")"
cd "$work"
unset HPCTRAIN_RUN_DIR

# Jobs (any user's) whose working directory is $1: squeue's %Z.
jobs_in() { squeue --noheader --format '%i %Z' | awk -v dir="$1" '$2 == dir { print $1 }'; }

# The example's geometry follows the GPUs: --gpus-per-node 8 gives 8 tasks a node (one rank per GPU), none idle.
"$binary" --dry-run --gpus-per-node 8 > gpus.sh 2> gpus.err || { log=gpus.err; fail "--dry-run --gpus-per-node 8 exited $?"; }
grep -qx -- "#SBATCH --ntasks-per-node=8" gpus.sh || fail "--dry-run --gpus-per-node 8: $(grep -m1 ntasks gpus.sh), not 8 tasks a node"
! grep -q "would stay idle" gpus.err || fail "--dry-run --gpus-per-node 8 warns of idle GPUs: $(grep -m1 idle gpus.err)"

mkdir refused
for case in "--lr -1|[hpctrain.spec.knob] --lr = -1: must be positive" \
            "--epoch 3|[hpctrain.usage] unknown option --epoch (did you mean --epochs?)"; do
  args="${case%%|*}"
  message="${case#*|}"
  before="$(jobs_in "$work/refused")"
  status=0
  # shellcheck disable=SC2086  # $args is two words on purpose
  (cd refused && "$binary" --submit $args) > "$work/refused.out.log" 2> "$work/refused.err.log" || status=$?
  [ "$status" = 2 ] || fail "--submit $args exited $status, not 2"
  grep -qF -- "$message" refused.err.log || fail "--submit $args: stderr does not say '$message'"
  [ -z "$(ls -A refused)" ] || fail "--submit $args wrote $(ls -A refused)"
  [ "$(jobs_in "$work/refused")" = "$before" ] || fail "--submit $args changed the queue"
done
echo "ok: --submit --lr -1 and --submit --epoch 3 exit 2 naming the knob; nothing written or queued"

"$binary" --local 2 --max-steps 20 --max-eval-examples 1000 > first.log 2>&1 || fail "first --local run failed"
"$binary" --local 2 --max-steps 20 --max-eval-examples 1000 > second.log 2>&1 || fail "second --local run failed"
for log in first.log second.log; do
  grep -q '^step 20/20 ' "$log" || fail "$log: did not train to step 20"
  if grep -q '^resumed from' "$log"; then fail "$log: resumed instead of training"; fi
  grep -q '^hpctrain: run directory .* (a new run)$' "$log" || fail "$log: no run directory line"
done
first_dir="$(sed -n 's/^run directory: //p' first.log)"
second_dir="$(sed -n 's/^run directory: //p' second.log)"
[ -n "$first_dir" ] && [ "$first_dir" != "$second_dir" ] || fail "the two runs share a run directory: '$first_dir'"
[ -n "$(ls -A "$second_dir/checkpoints")" ] || fail "no checkpoint in $second_dir"
echo "ok: two --local runs in one directory trained twice, into $first_dir and $second_dir"

"$binary" --local 2 --max-steps 30 --max-eval-examples 1000 --resume > resumed.log 2>&1 || fail "--resume run failed"
grep -q "^resumed from $second_dir/checkpoints at step 20 " resumed.log || fail "--resume did not continue the newest run at step 20"
grep -q '^step 30/30 ' resumed.log || fail "--resume did not train on to step 30"
resumed_dir="$(sed -n 's/^run directory: //p' resumed.log)"
[ "$resumed_dir" != "$second_dir" ] || fail "--resume wrote into the run it resumed"
echo "PASS"
