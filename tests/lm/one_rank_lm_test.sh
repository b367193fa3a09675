#!/usr/bin/env bash
# sft --local 1 --sharding zero3 (a Llama of 2 layers of width 256 made by transformers, fp32), which trains as
# Replicated at one rank, against zero3's own strategy at one rank (--shard-at-one-rank):
#  - the export: of the same weights (one step at a learning rate of 1e-30, which moves no fp32 weight), Replicated's
#    export (the model as one unit) and ZeRO-3's (unit by unit) hold the same tensors bit for bit, and the same
#    config and tokenizer files; only which file of the shards holds which tensor differs;
#  - LoRA: a LoRA run's checkpoint (the adapters only, as under zero3) loads under zero3's own strategy and the other
#    way, with the held-out loss of the run that saved it; and the run exports a PEFT adapter that PEFT loads onto
#    the base model with our merged model's logits (sft_oracle.py peft-check);
#  - --plan at one rank plans Replicated, saying so, and names the cheapest setting that fits; --dry-run of 70B on 64
#    H100s prints the checkpoint's size and warns that requeue_on_timeout(1min) cannot hold its save; under a site
#    file's short_grace = refuse, --submit of it exits 2 (nothing written or queued) and so does --plan.
# Usage: one_rank_lm_test.sh <sft binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
fail_tail=40
sft="$(realpath "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
transformers_test_setup one-rank-lm-test
oracle() { "$python" "$here/sft_oracle.py" "$@"; }
note="zero3 at one rank trains as replicated"

oracle make "$work" "$fortunes" > make.log 2>&1 || fail "the oracle could not make the tokenizer and data"
oracle make-sharded "$work" 2 256 688 > make-sharded.log 2>&1 || fail "the oracle could not make the model"
run() {  # run NAME [ARG...]: sft at --local 1 under zero3 in fp32
  local name="$1"
  shift
  HPCTRAIN_RUN_DIR="$work/$name" "$sft" --from sharded --data conversations.jsonl --local 1 --sharding zero3 --precision fp32 \
    --max-length 64 --log-every 1 "$@" > "$name.log" 2>&1 || log="$name.log" fail "$name: sft exited $?"
}
noted() { grep -qF "hpctrain: $note" "$1.log"; }

# The export of the same weights, as one unit and unit by unit.
run one-unit --max-steps 1 --lr 1e-30 --export-dtype fp32 --export-shard-size 1MB
run unit-by-unit --shard-at-one-rank --max-steps 1 --lr 1e-30 --export-dtype fp32 --export-shard-size 1MB
noted one-unit || fail "zero3 at --local 1 did not say that it trains as replicated"
! noted unit-by-unit || fail "--shard-at-one-rank still trained as replicated"
for file in config.json generation_config.json tokenizer.json tokenizer_config.json; do
  cmp -s "one-unit/export/$file" "unit-by-unit/export/$file" || fail "the exports' $file differ"
done
"$python" - one-unit/export unit-by-unit/export <<'PY' || fail "the exports of the same weights differ"
import glob, json, os, sys
from safetensors.torch import load_file
def tensors(directory):
    index = json.load(open(os.path.join(directory, "model.safetensors.index.json")))
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "model-*.safetensors"))):
        out.update(load_file(path))
    assert sorted(out) == sorted(index["weight_map"]), directory
    return out
ours, theirs = tensors(sys.argv[1]), tensors(sys.argv[2])
assert sorted(ours) == sorted(theirs), (sorted(ours), sorted(theirs))
for name in ours:
    assert ours[name].dtype == theirs[name].dtype and ours[name].shape == theirs[name].shape, name
    assert ours[name].equal(theirs[name]), name
print(f"{len(ours)} tensors equal bit for bit")
PY

# LoRA: checkpoints of the adapters, resumed across the two strategies.
lora=(--lora-r 8 --lora-alpha 16 --lora-targets q_proj,v_proj --lr 1e-2 --max-steps 4 --checkpoint-every 2 --export-dtype fp32)
run lora "${lora[@]}"
run lora-own "${lora[@]}" --shard-at-one-rank
noted lora || fail "LoRA under zero3 at --local 1 did not train as replicated"
[ -f lora/export/adapter_model.safetensors ] && [ -f lora/export/merged/config.json ] || fail "no PEFT adapter and merged model"
oracle peft-check sharded lora/export > peft-check.log 2>&1 || log=peft-check.log fail "PEFT's view of the adapter differs from our merged model"
# Each run's last checkpoint (step 4, the run's end: the example keeps one) loaded by the other strategy: no step is
# left, so the resumed run evaluates and reports what it loaded. The same adapters give the same held-out loss.
resume() {  # resume NAME FROM [ARG...]: FROM's checkpoint at step 4, loaded and evaluated
  local name="$1" from="$2"
  shift 2
  HPCTRAIN_RUN_DIR="$work/$name" "$sft" --from sharded --data conversations.jsonl --local 1 --sharding zero3 \
    --precision fp32 --max-length 64 --log-every 1 "${lora[@]}" "$@" --resume "$work/$from" > "$name.log" 2>&1 ||
    log="$name.log" fail "$name: sft exited $?"
  grep -q "^resumed from $work/$from/checkpoints at step 4 " "$name.log" || log="$name.log" fail "$name did not resume at step 4"
}
resume lora-to-own lora --shard-at-one-rank
resume own-to-lora lora-own
after() { sed -n 's/^response_loss_after=\([^ ]*\).*/\1/p' "$1.log" | tail -1; }
lora_report=""
for pair in lora:lora-to-own lora-own:own-to-lora; do
  whole="${pair%%:*}" resumed="${pair#*:}"
  # The same fp32 weights through the same forward (zero3's own strategy gathers each block whole): 1e-6 relative
  # leaves room for the order of the held-out loss's sums only.
  close "$(after "$resumed")" "$(after "$whole")" 1e-6 ||
    fail "$resumed: the held-out loss of the loaded adapters is $(after "$resumed"), the run that saved them had $(after "$whole")"
  lora_report="$lora_report $resumed $(after "$resumed") against $(after "$whole");"
done

# --plan at one rank plans what runs (Replicated), and on a GPU too small for it names the cheapest setting that fits.
plan=(--from sharded --data conversations.jsonl --plan --nodes 1 --tasks-per-node 1 --gpus-per-node 1 --sharding zero3
      --max-length 2048 --batch-size 16)
"$sft" "${plan[@]}" --gpu-memory 80 > plan.log 2>&1 || log=plan.log fail "--plan: exit $?"
grep -q "^hpctrain: zero3 at one rank trains as replicated: planned as such" plan.log &&
  grep -q "^memory plan: llama (.*), replicated, fp32, 1 rank(s)" plan.log || log=plan.log fail "--plan at one rank did not plan Replicated"
peak="$(sed -n 's/^  peak  *\([0-9.]*\) GiB.*/\1/p' plan.log)"
chunked="$("$sft" "${plan[@]}" --loss-chunk-tokens 2048 --gpu-memory 80 | sed -n 's/^  peak  *\([0-9.]*\) GiB.*/\1/p')"
# A GPU between the two plans: the chunked loss fits, the run's own setting does not.
gpu="$(awk -v a="$peak" -v b="$chunked" 'BEGIN { printf "%.2f", (a + b) / 2 }')"
status=0
"$sft" "${plan[@]}" --gpu-memory "$gpu" > small.log 2>&1 || status=$?
[ "$status" = 2 ] || log=small.log fail "--plan on a GPU of $gpu GiB: exit $status, not 2"
grep -q "^hpctrain: fits with --loss-chunk-tokens 2048: $chunked GiB of $gpu GiB per GPU" small.log ||
  log=small.log fail "--plan on a GPU of $gpu GiB did not name the chunked loss ($chunked GiB)"
# --gpu-memory takes units: 80GB is 74.5 GiB, as GPUs are sold; a bare 80 is GiB and the plan says so; a bad size
# exits 2 naming it. Eight GPUs a node with the plan's one task a node: --plan warns that 7 would stay idle, as
# --dry-run does.
"$sft" "${plan[@]}" --gpu-memory 80GB > sold.log 2>&1 || log=sold.log fail "--plan --gpu-memory 80GB: exit $?"
grep -q "of 74.51 GiB per GPU" sold.log || log=sold.log fail "--gpu-memory 80GB was not planned as 74.51 GiB"
grep -q "^hpctrain: --gpu-memory 80 read as 80 GiB (85.9 GB); 80GB states a GPU sold as 80 GB" plan.log ||
  log=plan.log fail "--plan did not say that a bare --gpu-memory 80 is GiB"
! grep -q "read as" sold.log || log=sold.log fail "--gpu-memory 80GB was said to be read as GiB"
status=0
"$sft" "${plan[@]}" --gpu-memory 80XB > bad-size.log 2>&1 || status=$?
[ "$status" = 2 ] && grep -q "\--gpu-memory 80XB: expected one GPU's memory" bad-size.log ||
  log=bad-size.log fail "--gpu-memory 80XB: exit $status, or no message naming it"
"$sft" --from sharded --data conversations.jsonl --plan --nodes 1 --tasks-per-node 1 --gpus-per-node 8 --max-length 2048 \
  --gpu-memory 80GB > idle.log 2>&1 || true
grep -q "^hpctrain: warning: 8 GPUs per node but 1 task(s) per node: .* 7 GPU(s) per node would stay idle" idle.log ||
  log=idle.log fail "--plan with 8 GPUs a node and 1 task did not warn of 7 idle GPUs"
# --dry-run of Llama 3.1 70B's shape (a config.json alone: the plan reads no weights) on 8 nodes of 8 H100 under zero3, with
# the example's requeue_on_timeout(1min): the checkpoint's 847 GB (13.2 GB a rank, 106 GB a node) and a warning that the
# grace cannot hold the steps until every rank stops after the signal and the write.
mkdir -p llama70b
python3 - sharded/config.json llama70b/config.json <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config.update(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
              num_attention_heads=64, num_key_value_heads=8, tie_word_embeddings=False, head_dim=128)
json.dump(config, open(sys.argv[2], "w"))
PY
for file in sharded/*; do  # the tokenizer and chat template: not the weights
  case "$file" in *.safetensors | *.safetensors.index.json | */config.json) ;; *) cp "$file" llama70b/ ;; esac
done
"$sft" --from llama70b --data conversations.jsonl --dry-run --nodes 8 --tasks-per-node 8 --gpus-per-node h100:8 \
  --sharding zero3 --max-length 4096 --batch-size 64 --gpu-memory 80GB > dry-70b.log 2>&1 || log=dry-70b.log fail "--dry-run of 70B: exit $?"
grep -q "^checkpoint: 13.2 GB a rank, 105.8 GB a node, 846.6 GB in all" dry-70b.log ||
  log=dry-70b.log fail "--dry-run of 70B on 64 GPUs did not print the checkpoint's size"
grep -q "^hpctrain: warning: requeue_on_timeout's grace of 60 s is shorter than 2 step(s) until every rank stops" dry-70b.log ||
  log=dry-70b.log fail "--dry-run of 70B with a grace of 60 s did not warn that the save cannot fit in it"
# A site whose file says short_grace = refuse: --submit of the same job exits 2, nothing written or queued; --plan
# exits 2; a value other than warn or refuse is refused naming the file and line.
seventy=(--from "$work/llama70b" --data "$work/conversations.jsonl" --nodes 8 --tasks-per-node 8 --gpus-per-node h100:8 --sharding zero3
  --max-length 4096 --batch-size 64 --gpu-memory 80GB --activation-checkpointing full)
mkdir -p strict && printf 'checkpoint_write_gbps = 2\nshort_grace = refuse\n' > strict/site.conf
status=0
(cd strict && HPCTRAIN_SITE_CONFIG="$work/strict/site.conf" "$sft" "${seventy[@]}" --submit) \
  > submit-70b.log 2>&1 || status=$?
[ "$status" = 2 ] && grep -q "^hpctrain: not submitted: requeue_on_timeout's grace cannot hold a save .* short_grace = refuse" \
  submit-70b.log || log=submit-70b.log fail "--submit of 70B under short_grace = refuse: exit $status, not 2 with the reason"
[ ! -e strict/hpctrain-jobs ] || fail "--submit under short_grace = refuse wrote something"
status=0
HPCTRAIN_SITE_CONFIG="$work/strict/site.conf" "$sft" "${seventy[@]}" --plan > plan-70b.log 2>&1 || status=$?
[ "$status" = 2 ] || log=plan-70b.log fail "--plan of 70B under short_grace = refuse: exit $status, not 2"
printf 'short_grace = sometimes\n' > strict/site.conf
status=0
HPCTRAIN_SITE_CONFIG="$work/strict/site.conf" "$sft" "${seventy[@]}" --plan > plan-bad-site.log 2>&1 || status=$?
[ "$status" = 2 ] && grep -q "\[hpctrain.spec.site\] short_grace = sometimes: expected warn or refuse (.*strict/site.conf:1)" \
  plan-bad-site.log || log=plan-bad-site.log fail "short_grace = sometimes: exit $status, not 2 naming the line"
cd / && rm -rf "${work:?}"
echo "PASS: exports of the same weights equal bit for bit; LoRA loaded across the strategies:$lora_report --plan: $peak GiB, fits with the chunked loss ($chunked GiB) on $gpu GiB"
