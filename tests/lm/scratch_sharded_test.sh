#!/usr/bin/env bash
# A GPT-2 trained from scratch under --sharding zero3 (the GPT example, --local 2, fp32): every rank builds the
# model a block at a time, each block emptied as soon as it is built, its initialisation recorded and replayed
# only for the slices the rank keeps (models::DeferredInitialization; test_models checks the replayed weights
# bit for bit against the model built whole).
#  - the first two losses equal zero2's, which builds the whole model on every rank from the same seed: the
#    same weights and batches, so the same fp32 sums but for the order in which the two ranks' gradients are
#    added (reduce-scatter against all-reduce: a sum of two terms either way, exact) and the forward's per-block
#    gather; within 1e-6 relative (fp32's 6e-8 with room; a wrong block's weights move the loss by ~1e-3).
#  - through the Trainer at world 2 under zero3, with dropout 0.1, --activation-checkpointing selective and full
#    train the losses of keeping every activation: the forward computes the same (step 1 equal to the last digit),
#    and step 2's loss, after an AdamW step on the gradients, within the same 1e-6 (the gradients differ by the
#    order of fp32 sums only; a product's gradient lost or a dropout mask not replayed moves it by ~1e-3).
# Usage: scratch_sharded_test.sh <gpt binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
fail_tail=30
[ -d /usr/share/games/fortunes ] && [ -f "$HOME/.cache/hpctrain/gpt2.tiktoken" ] ||
  { echo "SKIP: needs Debian's fortunes and ~/.cache/hpctrain/gpt2.tiktoken (scripts/setup)"; exit 77; }
gpt="$(realpath "$1")"
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/scratch-sharded-test.XXXXXX")"
cd "$work"
loss_at() { sed -n "/\"step\":$2,/s/.*\"loss\":\([^,]*\).*/\1/p" "$1/metrics.jsonl" | head -1; }
run() {  # run NAME SHARDING [ARG...]
  local name="$1" sharding="$2"
  shift 2
  HPCTRAIN_RUN_DIR="$work/$name" "$gpt" --local 2 --sharding "$sharding" --precision fp32 --log-every 1 --eval-every 0 \
    --checkpoint-every 0 --sample-tokens 0 --seq-len 64 "$@" > "$name.log" 2>&1 || fail "$name: gpt exited $?"
  rm -rf "${work:?}/$name/export"
}

run zero2 zero2 --max-steps 2
run zero3 zero3 --max-steps 2
grep -q "^hpctrain: the model's 4 blocks were built one at a time; each rank initialises only its shards of them" zero3.log ||
  fail "zero3 did not build the blocks empty"
! grep -q "blocks were built one at a time" zero2.log || fail "zero2 built the blocks empty: it needs them whole"
report="losses against zero2's:"
for step in 1 2; do
  ours="$(loss_at zero3 "$step")" theirs="$(loss_at zero2 "$step")"
  [ -n "$ours" ] && [ -n "$theirs" ] || fail "no loss at step $step"
  close "$ours" "$theirs" 1e-6 || fail "step $step: zero3 from scratch trains $ours, zero2 $theirs"
  report="$report step $step $(difference "$ours" "$theirs")"
done

run keep-dropout zero3 --max-steps 2 --dropout 0.1 --activation-checkpointing none
for recompute in selective full; do
  run "$recompute-dropout" zero3 --max-steps 2 --dropout 0.1 --activation-checkpointing "$recompute"
  report="$report; $recompute against none (dropout 0.1):"
  for step in 1 2; do
    ours="$(loss_at "$recompute-dropout" "$step")" theirs="$(loss_at keep-dropout "$step")"
    [ -n "$ours" ] && [ -n "$theirs" ] || fail "$recompute: no loss at step $step"
    close "$ours" "$theirs" 1e-6 || fail "step $step: --activation-checkpointing $recompute trains $ours, none $theirs"
    report="$report step $step $(difference "$ours" "$theirs")"
  done
done

echo "$report (bound 1e-6)"
