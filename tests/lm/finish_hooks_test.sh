#!/usr/bin/env bash
# Issue 54, item 7: every example's hooks at the end (gpt: export, greedy sample, val_loss; roberta: export,
# val_loss; sft: response losses, export in shards that both ranks write) run to exit 0 at --local 2 under each strategy — replicated, zero2, zero3,
# hsdp (--sharding none, zero2, zero3, hsdp) — with --precision bf16 stated (never through auto, which is fp32 on a CPU without AMX). Under zero3 and hsdp
# no hook of these gathers the whole model (the Trainer says so when one does), and the greedy sample is the
# same text under zero2, zero3 and hsdp (the same bf16 blocks, gathered one at a time on every rank).
# Usage: finish_hooks_test.sh <gpt binary> <roberta binary> <sft binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
fail_tail=40
gpt="$(realpath "$1")" roberta="$(realpath "$2")" sft="$(realpath "$3")"
here="$(cd "$(dirname "$0")" && pwd)"
transformers_test_setup finish-hooks-test
"$python" "$here/sft_oracle.py" make "$work" "$fortunes" > make.log 2>&1 || fail "the oracle could not make the start model"

# ends NAME PROGRAM ARGS...: PROGRAM --local 2 ARGS in NAME/ under each strategy in bf16, each exits 0 with its hooks'
# lines; under zero3/hsdp no hook gathered the whole model.
ends() {
  local name="$1" program="$2"
  shift 2
  for strategy in none zero2 zero3 hsdp; do
    mkdir -p "$name-$strategy"
    local log="$name-$strategy.log" status=0
    (cd "$name-$strategy" && HPCTRAIN_RUN_DIR="$PWD/run" "$program" --local 2 --sharding "$strategy" \
        --precision bf16 --max-steps 1 --max-eval-examples 16 "$@") > "$log" 2>&1 || status=$?
    [ "$status" = 0 ] || fail "$name under $strategy in bf16 exited $status: $(grep -v '^frame' "$log" | tail -8)"
    grep -q "^exported the model to " "$log" || fail "$name under $strategy: no export"
    [ -f "$name-$strategy/run/export/config.json" ] || fail "$name under $strategy: no config.json in the export"
    ! grep -q "the whole model gathered on every rank" "$log" || fail "$name under $strategy gathered the whole model"
    grep -q ", bf16, ${strategy/none/replicated}$" "$log" || fail "$name under $strategy did not train in bf16: $(grep ' rank(s) on ' "$log")"
  done
}
gpt_args=(--n-layer 2 --n-embd 32 --n-head 2 --sample-tokens 6 --prompt "The meaning of life is")  # one line
ends gpt "$gpt" "${gpt_args[@]}"
for strategy in none zero2 zero3 hsdp; do
  grep -q '^val_loss=' "gpt-$strategy.log" || fail "gpt under $strategy printed no val_loss"
  grep -q '^sample (greedy): ' "gpt-$strategy.log" || fail "gpt under $strategy printed no sample"
done
sample() { sed -n 's/^sample (greedy): //p' "gpt-$1.log"; }
for strategy in zero3 hsdp; do
  [ "$(sample "$strategy")" = "$(sample zero2)" ] ||
    fail "gpt's sample under $strategy ($(sample "$strategy")) is not zero2's ($(sample zero2))"
done
ends roberta "$roberta" --layers 1 --hidden 32 --heads 2
for strategy in none zero2 zero3 hsdp; do
  grep -q '^val_loss=' "roberta-$strategy.log" || fail "roberta under $strategy printed no val_loss"
done
# sft's export in shards of 100 KB (4 or 5 of this model's): both ranks write theirs, whatever the strategy (every rank
# sees every unit whole as the export visits it), rank 0 the index naming them all.
ends sft "$sft" --from "$work/llama" --data "$work/conversations.jsonl" --max-length 64 --export-shard-size 100KB
for strategy in none zero2 zero3 hsdp; do
  grep -q '^response_loss_after=' "sft-$strategy.log" || fail "sft under $strategy printed no response_loss_after"
  index="sft-$strategy/run/export/model.safetensors.index.json"
  [ -f "$index" ] || fail "sft under $strategy: no index of shards in the export"
  grep -qE "^rank 1 wrote [1-9][0-9]* of the export's files \(model-00002-of-" "sft-$strategy.log" ||
    fail "sft under $strategy: rank 1 wrote none of the export's shards"
  for shard in $(grep -o 'model-[0-9]*-of-[0-9]*\.safetensors' "$index" | sort -u); do
    [ -s "sft-$strategy/run/export/$shard" ] || fail "sft under $strategy: the index names $shard, which is not there"
  done
done
echo "PASS: gpt, roberta and sft end cleanly under replicated, zero2, zero3 and hsdp in bf16; gpt's sample under all" \
  "three sharded strategies: $(sample zero2)"
