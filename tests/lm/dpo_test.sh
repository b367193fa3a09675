#!/usr/bin/env bash
# examples/dpo.cpp against TRL's DPOTrainer (trl 0.24, tests/lm/dpo_oracle.py), on a small random Llama with the SFT
# test's tokenizer and chat template (sft_oracle.py make) and 34 conversational pairs with implicit prompts (32 to
# train on, every 16th held out):
#  - full fine-tuning under zero3 at --local 2 in fp32, one step a pass over the 32 pairs: the first step's loss and
#    log-probabilities are DPOTrainer.evaluate()'s on those pairs from the same weights (policy and reference the start
#    model), within 1e-4 relative; the run's last evaluation (loss, rewards, log-probabilities, logits) is what TRL
#    computes with the export (fp32, loaded by transformers) as the policy and the start model as the reference, within
#    1e-4 relative; the last step's rewards/accuracies is above 0.5;
#  - LoRA under zero2 at --local 2 (the reference: the model with its adapters off): the first step's loss is log 2,
#    and the adapter it exports loads in PEFT with the logits of its merged export (sft_oracle.py peft-check);
#  - a row whose chosen equals its rejected exits 2 before training, naming the file and its line.
# Usage: dpo_test.sh <dpo binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
fail_tail=40
dpo="$(realpath "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
transformers_test_setup dpo-test
"$python" -c 'import trl' 2>/dev/null || { echo "SKIP: no trl at $python (scripts/setup installs it)"; exit 77; }
# value FILE KEY WHICH: KEY of the first (WHICH=first) or last train record, or of the last evaluation (WHICH=eval)
value() {
  local lines
  case "$3" in
    first) lines="$(grep -v '"eval_loss"' "$1" | grep '"loss"' | head -1)" ;;
    last) lines="$(grep -v '"eval_loss"' "$1" | grep '"loss"' | tail -1)" ;;
    eval) lines="$(grep '"eval_loss"' "$1" | tail -1)" ;;
  esac
  sed -n "s|.*\"$2\":\([^,}]*\).*|\1|p" <<< "$lines"
}

"$python" "$here/sft_oracle.py" make "$work" "$fortunes" > make.log 2>&1 || fail "the oracle could not make the model"
"$python" "$here/dpo_oracle.py" pairs "$work" 34 > pairs.log 2>&1 || log=pairs.log fail "the oracle could not make pairs"

status=0
"$dpo" --from llama --data bad.jsonl --local 2 --precision fp32 > bad.log 2>&1 || status=$?
[ "$status" = 2 ] || log=bad.log fail "a row preferring nothing: dpo exited $status, not 2"
grep -q "bad.jsonl:3" bad.log || log=bad.log fail "dpo did not name bad.jsonl:3"

HPCTRAIN_RUN_DIR="$work/run" "$dpo" --from llama --data pairs.jsonl --local 2 --sharding zero3 --precision fp32 \
  --batch-size 32 --epochs 8 --lr 2e-3 --eval-every 0 --checkpoint-every 0 --export-dtype fp32 > run.log 2>&1 ||
  log=run.log fail "dpo exited $?"
"$python" "$here/dpo_oracle.py" evaluate llama pairs.jsonl llama:train run/export:validation > trl.json 2> trl.log ||
  log=trl.log fail "TRL could not evaluate"
# transformers' PrinterCallback prints each evaluation too (a Python dict): the JSON lines are the oracle's
start_trl="$(grep '^{"' trl.json | sed -n 1p)" end_trl="$(grep '^{"' trl.json | sed -n 2p)"
trl() { sed -n "s|.*\"eval_$2\": \([^,}]*\).*|\1|p" <<< "$1"; }
metrics=run/metrics.jsonl
report=""
for key in loss logps/chosen logps/rejected; do
  ours="$(value $metrics "$key" first)" theirs="$(trl "$start_trl" "$key")"
  close "$ours" "$theirs" 1e-4 || fail "first step's $key: $ours, TRL's DPOTrainer $theirs"
  report="$report first $key $ours (TRL $theirs);"
done
for key in loss rewards/chosen rewards/rejected rewards/margins logps/chosen logps/rejected logits/chosen \
  logits/rejected rewards/accuracies; do
  ours="$(value $metrics "eval_$key" eval)" theirs="$(trl "$end_trl" "$key")"
  close "$ours" "$theirs" 1e-4 || fail "last evaluation's $key: $ours, TRL's on the export $theirs"
  report="$report end eval_$key $ours (TRL $theirs);"
done
accuracy="$(value $metrics rewards/accuracies last)"
awk -v a="$accuracy" 'BEGIN { exit !(a > 0.5) }' || fail "the last step's rewards/accuracies is $accuracy"
report="$report last rewards/accuracies $accuracy;"

HPCTRAIN_RUN_DIR="$work/lora" "$dpo" --from llama --data pairs.jsonl --local 2 --sharding zero2 --precision fp32 \
  --batch-size 8 --max-steps 2 --lr 1e-2 --lora-r 8 --eval-every 0 --checkpoint-every 0 --export-dtype fp32 \
  > lora.log 2>&1 || log=lora.log fail "dpo with LoRA exited $?"
first="$(value lora/metrics.jsonl loss first)"
close "$first" 0.69314718 1e-4 || fail "LoRA's first loss is $first, not log 2 (the adapters off are the policy)"
"$python" "$here/sft_oracle.py" peft-check llama lora/export > peft.log 2>&1 ||
  log=peft.log fail "PEFT's view of the DPO adapter differs from our merged export"
report="$report LoRA first loss $first, $(tail -1 peft.log)"
cd / && rm -rf "${work:?}"
echo "PASS:$report"
