#!/usr/bin/env bash
# examples/sft end to end, checked by transformers (tests/lm/sft_oracle.py):
#  - the start: a small random Llama (a config no other test uses) saved by transformers, with a byte-level BPE
#    trained on the fortunes, BOS added by its post-processor and a chat template of its own; the data: a JSONL
#    file of conversations (system prompts, two turns, quotes, non-ASCII) that no other test reads;
#  - a JSONL file with line 7 broken: --submit exits 2 naming the file and line 7, nothing written or queued;
#    a missing --from or --data exits 2 naming the knob, and so do a --from without tokenizer files and a batch
#    larger than an epoch of the data (read at login);
#  - sft --local 2 --max-steps 20 lowers the assistant-token loss; response_loss_before equals transformers'
#    masked loss on the same rendered conversations (apply_chat_template's assistant mask), and
#    response_loss_after equals it on the export, which transformers loads (1e-4 relative, fp32);
#  - --packing gives the same loss before training as padding; build/examples/generate continues a prompt;
#  - tool-calling conversations (a tools column, tool_calls, tool results) with a template that renders them: the
#    masked loss before training equals transformers' (apply_chat_template with tools, its assistant mask).
#  - a --from directory with config.json and the tokenizer alone: the model of that config with random weights from
#    --seed, the same at --local 1 and under zero3 at --local 2, and among transformers' from_config models.
# Usage: sft_test.sh <sft binary> <generate binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
fail_tail=40
sft="$(realpath "$1")"
generate="$(realpath "$2")"
here="$(cd "$(dirname "$0")" && pwd)"
transformers_test_setup sft-test
oracle() { "$python" "$here/sft_oracle.py" "$@"; }
value() { sed -n "s/^$1=\([^ ]*\).*/\1/p" "$2" | tail -1; }

oracle make "$work" "$fortunes" || fail "the oracle could not make the start model"
# refused NAME PATTERN ARGS...: sft ARGS, run in bad/, exits 2 with PATTERN in its output, and writes nothing.
refused() {
  local name="$1" pattern="$2" status=0
  shift 2
  (cd bad && "$sft" "$@") > "$name.log" 2>&1 || status=$?
  [ "$status" = 2 ] || fail "$name: exit status $status, not 2"
  grep -q -- "$pattern" "$name.log" || fail "$name: the message does not match: $pattern"
  [ ! -e bad/hpctrain-jobs ] || fail "$name: something was written"
}

# Bad input: exit 2 before anything is written or queued.
mkdir -p bad
refused "a broken line 7" 'broken.jsonl:7: ' --from ../llama --data ../broken.jsonl --submit
for args in "--data ../conversations.jsonl" "--from ../llama"; do
  status=0
  # shellcheck disable=SC2086  # two words each
  (cd bad && "$sft" $args --local 2) > bad.log 2>&1 || status=$?
  [ "$status" = 2 ] || fail "with only $args: exit status $status, not 2"
  grep -q '\[hpctrain.spec.knob\] --' bad.log || fail "with only $args: the message does not name the missing knob"
  [ ! -e bad/hpctrain-jobs ] || fail "with only $args: something was written"
done

# A --from directory without tokenizer files fails at login (exit 2, nothing written), not on the compute nodes.
mkdir -p notokenizer && cp llama/config.json llama/model.safetensors notokenizer/
refused "a model without a tokenizer" '\[hpctrain.spec.tokenizer\] .*notokenizer: .*holds neither tokenizer.json nor a \*.tiktoken file' \
  --from ../notokenizer --data ../conversations.jsonl --dry-run
# A batch larger than an epoch of each rank's data, read at login (the training split: 171 of the file's 182
# records, every 16th held out): refused in the units typed, naming the largest that fits. The job's 2 nodes give
# each rank at most 85 records (170 fits, 172 does not); --nodes 4 at most 42 (168); --local 2 as 2 nodes. A global
# batch that does not divide by the ranks fails there too.
refused "a batch larger than the data" '\[hpctrain.spec.knob\] --batch-size = 100000 (global): 100000 examples per rank per step (1 ranks share it), but each rank gets at most 171 examples per epoch of .*conversations.jsonl (171 of its 182 records in this split, counted at login) (1 ranks); at most 171 here' \
  --from ../llama --data ../conversations.jsonl --dry-run --batch-size 100000 --nodes 1
refused "a batch past 2 ranks' records" 'but each rank gets at most 85 examples .* (2 ranks); at most 170 here' \
  --from ../llama --data ../conversations.jsonl --dry-run --batch-size 172
refused "a batch too large for 4 nodes" '(4 ranks); at most 168 here' \
  --from ../llama --data ../conversations.jsonl --submit --batch-size 172 --nodes 4
refused "a batch too large for --local 2" '(2 ranks); at most 170 here' \
  --from ../llama --data ../conversations.jsonl --local 2 --batch-size 172
refused "a batch that does not divide" 'batch_size = 15: a global batch must divide by world size × gradient_accumulation (2)' \
  --from ../llama --data ../conversations.jsonl --local 2 --batch-size 15
(cd bad && "$sft" --from ../llama --data ../conversations.jsonl --dry-run --batch-size 170) > batch-fits.log 2>&1 ||
  log=batch-fits.log fail "--dry-run with a batch of 170 on 2 ranks (85 records each at most): exit status $?"

# A rotary setting hpctrain does not implement (transformers 5's layout): exit 2 at --dry-run, naming the file and
# the field, before anything is written.
mkdir -p yarn && cp llama/* yarn/
"$python" - yarn/config.json <<'PY' || fail "could not write the yarn config"
import json, sys
config = json.load(open(sys.argv[1]))
config.pop("rope_theta", None), config.pop("rope_scaling", None)
config["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 128}
json.dump(config, open(sys.argv[1], "w"))
PY
refused "rope_type yarn" '\[hpctrain.spec.llama.rope_parameters.rope_type\] .*yarn/config.json: llama.rope_parameters.rope_type = yarn' \
  --from ../yarn --data ../conversations.jsonl --dry-run

# A chat template hpctrain cannot render: exit 2 at --dry-run naming the template error and the record, nothing written.
mkdir -p badtemplate && cp llama/* badtemplate/
"$python" - badtemplate <<'PY' || fail "could not write the bad template"
import json, os, sys
directory = sys.argv[1]
template = "{{ messages | no_such_filter }}"
if os.path.exists(os.path.join(directory, "chat_template.jinja")):
    open(os.path.join(directory, "chat_template.jinja"), "w").write(template)
config_path = os.path.join(directory, "tokenizer_config.json")
config = json.load(open(config_path))
if "chat_template" in config or not os.path.exists(os.path.join(directory, "chat_template.jinja")):
    config["chat_template"] = template
json.dump(config, open(config_path, "w"))
PY
refused "an unrenderable chat template" '\[hpctrain.spec.chat_template\] .*conversations.jsonl:1: the first record does not render: .*no_such_filter' \
  --from ../badtemplate --data ../conversations.jsonl --dry-run

# --tools FILE: a file that is not a JSON list of function schemas exits 2 at --dry-run naming it, nothing written.
echo '{"type": "function"}' > badtools.json
refused "a tools file that is no list" '\[hpctrain.spec.data.jsonl\] \.\./badtools.json: ' \
  --from ../llama --data ../conversations.jsonl --tools ../badtools.json --dry-run

# --plan: the memory each rank will hold, from config.json alone, nothing written; a GPU too small for it exits 2
# naming the figure.
(cd bad && "$sft" --from ../llama --data ../conversations.jsonl --plan --gpus-per-node 1) > plan.log 2>&1 ||
  fail "--plan: exit status $?"
grep -q "^memory plan: llama" plan.log && grep -q "^  peak " plan.log && grep -q "^per node at load" plan.log ||
  fail "--plan printed no plan"
refused "plan on a GPU of 1 MiB" "the plan does not fit: .* per GPU against 1.0 MiB" \
  --from ../llama --data ../conversations.jsonl --plan --gpus-per-node 1 --gpu-memory 0.001
# The same plan refuses a --submit (nothing written or queued) and is a section of --dry-run.
refused "submit on a GPU of 1 MiB" "not submitted: the memory plan does not fit" \
  --from ../llama --data ../conversations.jsonl --submit --gpus-per-node 1 --gpu-memory 0.001
# A GPU job whose plan cannot know one GPU's memory (no GPU type, or one hpctrain does not know) is not queued
# unchecked: --submit exits 2 asking for --gpu-memory, and --dry-run says that --submit would stop.
refused "submit on a GPU of no type" "not submitted: the memory plan cannot check the job against one GPU's memory (the job names no GPU type; a100:8 would name one): state it with --gpu-memory SIZE" \
  --from ../llama --data ../conversations.jsonl --submit --gpus-per-node 1
refused "submit on an unknown GPU type" "its GPU type 'v100' names none hpctrain knows): state it with --gpu-memory SIZE" \
  --from ../llama --data ../conversations.jsonl --submit --gpus-per-node v100:1
(cd bad && "$sft" --from ../llama --data ../conversations.jsonl --dry-run --gpus-per-node v100:1) > dry-unknown.log 2>&1 ||
  log=dry-unknown.log fail "--dry-run on an unknown GPU type: exit status $?"
grep -q "^hpctrain: warning: --submit would stop here: the memory plan cannot check the job" dry-unknown.log ||
  log=dry-unknown.log fail "--dry-run on an unknown GPU type does not say that --submit would stop"
(cd bad && "$sft" --from ../llama --data ../conversations.jsonl --dry-run --gpus-per-node 1 --gpu-memory 80) > plan-dry.log 2>&1 ||
  fail "--dry-run with a plan: exit status $?"
grep -q "^memory plan: llama" plan-dry.log && grep -q "per GPU: fits" plan-dry.log && grep -q "^#SBATCH" plan-dry.log ||
  fail "--dry-run: no plan section beside the script"
[ ! -e bad/hpctrain-jobs ] || fail "--plan wrote something"

# Train: 2 ranks, 20 steps.
HPCTRAIN_RUN_DIR="$work/run" "$sft" --from llama --data conversations.jsonl --local 2 --max-steps 20 --lr 1e-3 --max-length 256 \
  > run.log 2>&1 || fail "sft exited $?"
grep -q '^hpctrain: 2 rank(s) on cpu (gloo)' run.log || fail "not 2 Gloo ranks"
grep -q "^hpctrain: llama: llama: [0-9]* layers, .*rope theta" run.log || fail "no line saying what the config was understood as"
grep -q "^hpctrain: padding: [0-9.]*% of the token slots of an epoch's batches ([0-9]* tokens in [0-9]* slots; 10 batches of 8 rows on each of 2 rank(s))" run.log ||
  fail "no line saying what padding the batches carry"
before="$(value response_loss_before run.log)"
after="$(value response_loss_after run.log)"
[ -n "$before" ] && [ -n "$after" ] || fail "no response_loss_before/after"
awk -v b="$before" -v a="$after" 'BEGIN { exit !(a < b - 0.2) }' || fail "the response loss did not fall: $before -> $after"
for f in config.json model.safetensors tokenizer.json tokenizer_config.json chat_template.jinja; do
  [ -f "run/export/$f" ] || fail "the export has no $f"
done
expected_before="$(oracle loss llama conversations.jsonl 256 2>/dev/null)" || fail "transformers could not compute the start model's loss"
close "$before" "$expected_before" 1e-4 || fail "response_loss_before=$before but transformers says $expected_before"
expected_after="$(oracle loss run/export conversations.jsonl 256 2>/dev/null)" || fail "transformers could not load the export"
close "$after" "$expected_after" 1e-4 || fail "response_loss_after=$after but transformers says $expected_after"

# Packing: the same examples in packed rows give the same loss.
HPCTRAIN_RUN_DIR="$work/packed" "$sft" --from llama --data conversations.jsonl --local 2 --max-steps 1 --max-length 256 --packing \
  > packed.log 2>&1 || fail "sft --packing exited $?"
grep -q 'rows (packed)' packed.log || fail "--packing packed no row"
packed_before="$(value response_loss_before packed.log)"
close "$packed_before" "$before" 1e-4 || fail "--packing: response_loss_before=$packed_before, padded $before"

# Tool calling in TRL's shape (a "tools" column, assistant tool_calls, tool results): the loss on the assistant's
# turns, its calls included and the tool results excluded, equals transformers' on the same tokens (1e-4, fp32).
oracle make-tools "$work" "$here/../data/chat_templates/chatml-tools-generation.jinja" > make-tools.log 2>&1 ||
  fail "the oracle could not make the tool-calling model and data"
HPCTRAIN_RUN_DIR="$work/tools" "$sft" --from llama-tools --data tools.jsonl --local 2 --max-steps 1 --max-length 256 \
  > tools.log 2>&1 || fail "sft on tool-calling conversations exited $?"
tools_before="$(value response_loss_before tools.log)"
expected_tools="$(oracle loss llama-tools tools.jsonl 256 2>/dev/null)" || fail "transformers could not compute the tool-calling loss"
close "$tools_before" "$expected_tools" 1e-4 || fail "tool calling: response_loss_before=$tools_before but transformers says $expected_tools"

# LoRA: only the adapters train; the export is a PEFT adapter (PeftModel loads it) and the merged model.
HPCTRAIN_RUN_DIR="$work/lora" "$sft" --from llama --data conversations.jsonl --local 2 --max-steps 10 --lr 1e-2 --max-length 256 \
  --lora-r 8 --lora-alpha 16 --lora-targets q_proj,v_proj,down_proj > lora.log 2>&1 || fail "sft --lora-r 8 exited $?"
grep -q '^hpctrain: LoRA r=8 alpha=16 on \[q_proj, v_proj, down_proj\]: [0-9]* of [0-9]* parameters train' lora.log || fail "the log does not say what LoRA trains"
[ -f lora/export/adapter_model.safetensors ] && [ -f lora/export/adapter_config.json ] && [ -f lora/export/merged/config.json ] \
  || fail "no PEFT adapter and merged model in lora/export"
oracle peft-check llama lora/export || fail "PEFT's view of our adapter differs from our merged export"

# A model from its config alone: a --from directory with config.json and the tokenizer but no weights is built with
# random weights from --seed (the log says so), as transformers' from_config builds it; fp32 stated. The same seed
# gives the same weights at --local 1 and under zero3 at --local 2, where each rank initialises only its slices
# (response_loss_before equal within 1e-5 relative: the same fp32 forward, the held-out sums split over two ranks),
# another seed other weights; and the start loss falls among transformers' from_config models of the same config
# (8 seeds: within 5 standard deviations of their mean; a wrong initialisation scale moves it by far more).
cp -r llama shape && rm shape/*.safetensors
shape_run() {  # shape_run NAME WORLD ARG...: one step from the config alone
  local name="$1" world="$2"
  shift 2
  HPCTRAIN_RUN_DIR="$work/$name" "$sft" --from shape --data conversations.jsonl --local "$world" --max-steps 1 \
    --max-length 256 --precision fp32 --checkpoint-every 0 "$@" > "$name.log" 2>&1 || log="$name.log" fail "$name: sft exited $?"
}
shape_run shape-1 1 --seed 11
shape_run shape-zero3 2 --seed 11 --sharding zero3
shape_run shape-other 1 --seed 12
grep -q "^hpctrain: shape holds no weights (no model.safetensors, no model.safetensors.index.json): the model is built from its config.json with random weights, seed 11$" shape-1.log ||
  log=shape-1.log fail "the log does not say the model is random from the config, seed 11"
shape_before="$(value response_loss_before shape-1.log)"
close "$(value response_loss_before shape-zero3.log)" "$shape_before" 1e-5 ||
  fail "seed 11: response_loss_before=$(value response_loss_before shape-zero3.log) under zero3 at --local 2, $shape_before at --local 1"
! close "$(value response_loss_before shape-other.log)" "$shape_before" 1e-6 || fail "seeds 11 and 12 give the same start loss"
read -r peer_mean peer_std < <(oracle from-config-losses shape conversations.jsonl 256 8 2>/dev/null) ||
  fail "transformers could not build the config's model"
for seed_log in shape-1.log shape-other.log; do
  awk -v x="$(value response_loss_before "$seed_log")" -v m="$peer_mean" -v s="$peer_std" \
    'BEGIN { d = x - m; if (d < 0) d = -d; exit !(d <= 5 * s) }' ||
    fail "$seed_log: response_loss_before=$(value response_loss_before "$seed_log"), transformers' from_config models $peer_mean ± $peer_std"
done

"$generate" --model run/export --prompt $'[USER] What is the difference?\n[BOT] ' --max-new-tokens 8 > generated.txt 2>&1 || fail "generate exited $?"
echo "PASS: response loss $before -> $after (transformers: $expected_before -> $expected_after); packed $packed_before; tool calling $tools_before (transformers: $expected_tools); from the config alone $shape_before (transformers' from_config: $peer_mean ± $peer_std)"
