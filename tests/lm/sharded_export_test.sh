#!/usr/bin/env bash
# sft --from a bf16 Llama made by transformers (2 layers of width 256, in shards with an index), under --sharding
# zero3 --local 2, exports the trained model unit by unit (every rank gathers one block or edge at a time; the ranks
# write alternate shards in parallel, rank 0 the index and config) in shards of at most 1 MB:
#  - with --export-dtype left to auto, the export keeps the checkpoint's bf16 (config.json says so); with fp32 the
#    same run (same seed and world: the same trained weights) exports fp32; each export's index names exactly
#    its shards' tensors and their total size, every bf16 tensor is the fp32 one rounded to bf16, and
#    transformers' AutoModelForCausalLM loads both, the bf16 one's logits within the first-order bound of bf16's
#    rounding of the fp32 one's (sft_oracle.py export-check derives it);
#  - lm::from_pretrained reads the bf16 export back: its held-out loss before any step (eval_loss_at_start) equals
#    transformers' on the same export in fp32 within 1e-5 relative (two fp32 forwards of the same weights:
#    sharded_load_test.sh derives the bound); `generate` reads it too;
#  - a bad --export-dtype or --export-shard-size is refused before anything runs (exit 2, naming the knob).
# Usage: sharded_export_test.sh <sft binary> <generate binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
fail_tail=40
sft="$(realpath "$1")"
generate="$(realpath "$2")"
here="$(cd "$(dirname "$0")" && pwd)"
transformers_test_setup sharded-export-test
oracle() { "$python" "$here/sft_oracle.py" "$@"; }
value() { sed -n "s/^$1=\([^ ]*\).*/\1/p" "$2" | tail -1; }

oracle make "$work" "$fortunes" > make.log 2>&1 || fail "the oracle could not make the tokenizer and data"
oracle make-sharded "$work" 2 256 688 > make-sharded.log 2>&1 || fail "the oracle could not make the sharded model"

run() {  # run NAME FROM [ARG...]: two steps under zero3 at --local 2, exported in shards of at most 1 MB
  local name="$1" from="$2"
  shift 2
  HPCTRAIN_RUN_DIR="$work/$name" "$sft" --from "$from" --data conversations.jsonl --local 2 --sharding zero3 \
    --max-steps 2 --max-length 64 --export-shard-size 1MB "$@" > "$name.log" 2>&1 || fail "$name: sft exited $?"
  grep -q "^exported the model to $work/$name/export " "$name.log" || log="$name.log" fail "$name: no 'exported the model' line"
}
run bf16 sharded
run fp32 sharded --export-dtype fp32
[ -f bf16/export/model.safetensors.index.json ] && [ ! -e bf16/export/model.safetensors ] || fail "the bf16 export is not sharded"
[ -f bf16/export/tokenizer.json ] || fail "the export has no tokenizer.json"
# Written in parallel: rank 1 wrote the even-numbered shards (model-00002-of-..., its share of every other one).
shards="$(ls bf16/export | grep -c '^model-.*\.safetensors$')"
rank1="$(sed -n "s/^rank 1 wrote \([0-9]*\) of the export's files (model-00002-of-.*/\1/p" bf16.log)"
[ "$rank1" = "$((shards / 2))" ] || log=bf16.log fail "rank 1 wrote '${rank1:-none}' of the $shards shards, not every other one"
ls -a bf16 | grep -q '^\.export\.' && fail "a staging directory is left beside the export: $(ls -a bf16)"
check="$(oracle export-check fp32/export bf16/export 2> export-check.err)" || log=export-check.err fail "the exports do not check: $check"

# The bf16 export read back by hpctrain (lm::from_pretrained, sharded with an index) and by transformers.
expected="$(oracle loss bf16/export conversations.jsonl 64 2>/dev/null)" || fail "transformers could not compute the export's loss"
HPCTRAIN_RUN_DIR="$work/reread" "$sft" --from bf16/export --data conversations.jsonl --local 2 --sharding zero3 \
  --max-steps 1 --max-length 64 > reread.log 2>&1 || log=reread.log fail "sft --from the export exited $?"
start="$(value eval_loss_at_start reread.log)"
close "$start" "$expected" 1e-5 || fail "hpctrain's held-out loss on the export is $start, transformers' $expected"
"$generate" --model bf16/export --prompt $'[USER] What is the difference?\n[BOT] ' --max-new-tokens 4 > generated.txt 2>&1 ||
  log=generated.txt fail "generate could not read the export"

for knob in "--export-dtype=int8" "--export-shard-size=5 parsecs"; do
  status=0
  HPCTRAIN_RUN_DIR="$work/bad" "$sft" --from sharded --data conversations.jsonl --local 2 "$knob" > bad.log 2>&1 || status=$?
  [ "$status" = 2 ] && grep -qF -- "${knob%%=*}" bad.log || log=bad.log fail "$knob: exit $status, not 2 naming the knob"
done
[ ! -e bad ] || fail "a refused knob left a run directory"
cd / && rm -rf "${work:?}"
echo "PASS: $check; hpctrain's held-out loss on the bf16 export $start, transformers' $expected ($(difference "$start" "$expected"), bound 1e-5)"
