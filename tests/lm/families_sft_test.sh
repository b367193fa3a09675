#!/usr/bin/env bash
# sft on two families beyond the plain Llama, each a small random model saved by transformers (sft_oracle.py
# make-family) with the SFT test's tokenizer, chat template and conversations:
#  - Qwen3 (an RMSNorm over each query and key head, heads of 16 on a 40-wide stream) under zero3 at --local 2, a
#    Llama 3.2-shaped model (the head tied to the embedding, llama3 rope scaling) under hsdp at --local 4 (2 shard
#    groups of 2), and Phi-3 (q/k/v in one qkv_proj, gate/up in one gate_up_proj) under zero2 at --local 2, in fp32: the start model's held-out loss equals transformers' on the same directory within 1e-5
#    relative (two fp32 forwards of the same model, summed in another order: measured ~1e-8 on the Llama of
#    sharded_load_test.sh), and after 3 steps the export (fp32) loaded by transformers gives the held-out loss the
#    run printed at its end, within the same bound: the trained weights, the q/k norms and the tied head included,
#    went out under their own names;
#  - LoRA on Phi-3's four Linears by their own names (qkv_proj, o_proj, gate_up_proj, down_proj) under zero3 at
#    --local 2 in fp32: the adapter loads in PEFT with our merged export's logits;
#  - LoRA on every projection of Qwen3 (q, k, v, o, gate, up, down) under zero3 at --local 2 in bf16 (stated:
#    --precision auto differs between the CPUs; the norms of q and k then see bf16 heads), from the same weights
#    saved in bf16 (under zero3 a bf16 run holds its frozen base in bf16: from the fp32 directory our merged model
#    would be the rounded base plus the adapter, 2e-3 from PEFT's on the fp32 base): the adapter the run exports
#    loads in PEFT onto that base with the logits of our merged export (sft_oracle.py peft-check);
#  - Gemma 2 (its own soft caps of attention and logits, a window of 16 on every other layer, norms by 1 + weight, the
#    tied head) under zero3 at --local 2 in fp32, checked as the first three against transformers' eager attention
#    (its SDPA path skips the attention cap);
#  - LoRA on every projection of Gemma 3 text (query and key norms, a sliding layer on its own rope base) under zero3
#    at --local 2 in fp32: the adapter loads in PEFT with our merged export's logits;
#  - --plan reads the five configs and counts transformers' parameters (to its 3 digits).
# Usage: families_sft_test.sh <sft binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
fail_tail=40
sft="$(realpath "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
transformers_test_setup families-sft-test
oracle() { "$python" "$here/sft_oracle.py" "$@"; }
last_eval_loss() { sed -n 's/.*"eval_loss":\([^,}]*\).*/\1/p' "$1/metrics.jsonl" | tail -1; }

oracle make "$work" "$fortunes" > make.log 2>&1 || fail "the oracle could not make the tokenizer and data"
for family in qwen3 llama3.2 phi3 gemma2 gemma3_text; do
  oracle make-family "$work" "$family" > "make-$family.log" 2>&1 || log="make-$family.log" fail "the oracle could not make $family"
done

report=""
train() {  # train FAMILY WORLD SHARDING [ARG...]: 3 steps in fp32, start and end losses against transformers'
  local family="$1" world="$2" sharding="$3"
  shift 3
  HPCTRAIN_RUN_DIR="$work/run-$family" "$sft" --from "$family" --data conversations.jsonl --local "$world" \
    --sharding "$sharding" --precision fp32 --max-steps 3 --max-length 64 --eval-every 0 --checkpoint-every 0 \
    --export-dtype fp32 "$@" > "run-$family.log" 2>&1 || log="run-$family.log" fail "$family: sft exited $?"
  local start expected end exported
  start="$(sed -n 's/^eval_loss_at_start=\([^ ]*\).*/\1/p' "run-$family.log" | tail -1)"
  expected="$(oracle loss "$family" conversations.jsonl 64 2>"loss-$family.log")" ||
    log="loss-$family.log" fail "transformers could not compute $family's start loss"
  close "$start" "$expected" 1e-5 || fail "$family: the start model's held-out loss is $start, transformers says $expected"
  end="$(last_eval_loss "run-$family")"
  exported="$(oracle loss "run-$family/export" conversations.jsonl 64 2>"export-loss-$family.log")" ||
    log="export-loss-$family.log" fail "transformers could not load $family's export"
  close "$end" "$exported" 1e-5 ||
    fail "$family: the run ended at a held-out loss of $end, transformers gives its export $exported"
  awk -v a="$start" -v b="$end" 'BEGIN { exit !(b < a) }' || fail "$family: 3 steps did not lower the held-out loss ($start to $end)"
  report="$report $family $sharding --local $world: start $start (transformers $(difference "$start" "$expected") apart),"
  report="$report end $end (its export in transformers $(difference "$end" "$exported") apart);"
}
train qwen3 2 zero3
grep -q "query and key norms" run-qwen3.log || fail "sft did not say that the Qwen3 model normalises queries and keys"
train llama3.2 4 hsdp --hsdp-group-size 2
grep -q "tied head" run-llama3.2.log || fail "sft did not say that the Llama 3.2 model's head is tied"
train phi3 2 zero2
grep -q "stacked (qkv_proj, gate_up_proj)" run-phi3.log || fail "sft did not say that the Phi-3 model stacks its projections"
train gemma2 2 zero3
grep -q "attention soft-capped at 50" run-gemma2.log || fail "sft did not say that the Gemma 2 model caps its attention"

HPCTRAIN_RUN_DIR="$work/lora" "$sft" --from qwen3-bf16 --data conversations.jsonl --local 2 --sharding zero3 --precision bf16 \
  --max-steps 3 --max-length 64 --batch-size 8 --lr 1e-2 --eval-every 0 --max-eval-examples 4 --checkpoint-every 0 \
  --export-dtype fp32 --lora-r 8 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj \
  > lora.log 2>&1 || log=lora.log fail "LoRA on qwen3: sft exited $?"
oracle peft-check qwen3-bf16 lora/export > lora-peft.log 2>&1 ||
  log=lora-peft.log fail "PEFT's view of the Qwen3 adapter differs from our merged model"

HPCTRAIN_RUN_DIR="$work/lora-phi3" "$sft" --from phi3 --data conversations.jsonl --local 2 --sharding zero3 \
  --precision fp32 --max-steps 3 --max-length 64 --batch-size 8 --lr 1e-2 --eval-every 0 --max-eval-examples 4 \
  --checkpoint-every 0 --export-dtype fp32 --lora-r 8 --lora-targets qkv_proj,o_proj,gate_up_proj,down_proj \
  > lora-phi3.log 2>&1 || log=lora-phi3.log fail "LoRA on phi3: sft exited $?"
oracle peft-check phi3 lora-phi3/export > lora-phi3-peft.log 2>&1 ||
  log=lora-phi3-peft.log fail "PEFT's view of the Phi-3 adapter differs from our merged model"

HPCTRAIN_RUN_DIR="$work/lora-gemma3" "$sft" --from gemma3_text --data conversations.jsonl --local 2 --sharding zero3 \
  --precision fp32 --max-steps 3 --max-length 64 --batch-size 8 --lr 1e-2 --eval-every 0 --max-eval-examples 4 \
  --checkpoint-every 0 --export-dtype fp32 --lora-r 8 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj \
  > lora-gemma3.log 2>&1 || log=lora-gemma3.log fail "LoRA on gemma3_text: sft exited $?"
oracle peft-check gemma3_text lora-gemma3/export > lora-gemma3-peft.log 2>&1 ||
  log=lora-gemma3-peft.log fail "PEFT's view of the Gemma 3 adapter differs from our merged model"

for family in qwen3 llama3.2 phi3 gemma2 gemma3_text; do
  "$sft" --from "$family" --plan --nodes 1 --tasks-per-node 2 --sharding zero3 --max-length 64 > "plan-$family.log" 2>&1 || true
  parameters="$(sed -n "s/^$family: \([0-9]*\) parameters$/\1/p" "make-$family.log")"
  grep -qE "^  peak " "plan-$family.log" || log="plan-$family.log" fail "--plan printed no peak for $family"
  # the plan counts the parameters from the config (the q/k norms and the tied head included): transformers' count
  planned="$(sed -n 's/^memory plan: [a-z0-9]* (\([0-9.]*K\) parameters.*/\1/p' "plan-$family.log")"
  [ "$planned" = "$(awk -v n="$parameters" 'BEGIN { printf "%.1fK", n / 1000 }')" ] ||
    log="plan-$family.log" fail "--plan counts $planned parameters of $family, transformers $parameters"
  report="$report --plan of $family: $planned parameters (transformers $parameters);"
done
report="$report LoRA on every projection of qwen3 in bf16: $(tail -1 lora-peft.log);"
report="$report LoRA on Phi-3's qkv_proj, o_proj, gate_up_proj and down_proj in fp32: $(tail -1 lora-phi3-peft.log);"
report="$report LoRA on every projection of Gemma 3 text in fp32: $(tail -1 lora-gemma3-peft.log)"
cd / && rm -rf "${work:?}"
echo "PASS:$report"
