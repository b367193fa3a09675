#!/usr/bin/env bash
# docs/quickstart-gpu.md, run: every command of its shell blocks from the build on, at small scale on the local
# cluster, in the Charliecloud image and with the program that container_recipe_test.sh built by the recipe's steps
# (the fixture leaves both under $HPCTRAIN_BUILD_DIR/tests/quickstart). Small scale means:
#   - the image is that test's image directory, whose /usr and /opt/venv are the host's, bound (in_image below does
#     what the doc's in_image does, with those binds added), and the program's pyxis line is that image;
#   - --plan and --dry-run run as written, on Llama 3.1 8B's config.json (the plan reads no weights) beside a small
#     tokenizer; the jobs train a 2-layer Llama made by transformers, with the overrides in $small (no GPUs on the
#     local nodes, one CPU a task, a batch and a number of steps that fit the data and the time);
#   - the requeue is the USR2 that Slurm sends requeue_on_timeout's grace before the limit, sent at once (scancel,
#     as the doc shows), and Slurm's hold on the requeued job released early (release_requeue_hold).
# Checked: the doc's train.cpp is containers/example/train.cpp and each of its commands is run here; the plans of
# LoRA and of full SFT at 8B fit 80 GB H100s; --dry-run asks for 2 nodes x 8 GPUs and 8 tasks a node; the LoRA job
# trains under ch-run on both nodes, is requeued by USR2, resumes from its checkpoint and completes, and --status
# says so; its export is the doc's listing (PEFT's adapter, the merged model, the tokenizer files), and the merged
# model and the full run's export load in transformers.
# Usage: quickstart_gpu_test.sh   (after container_recipe_test.sh: the fixture quickstart_program)
set -euo pipefail
here="$(dirname "$(realpath "${BASH_SOURCE[0]}")")"
source "$here/../support/slurm_test_support.sh"
source "$here/charliecloud_support.sh"
charliecloud_or_skip
root="$(realpath "$here/../..")"
doc="$root/docs/quickstart-gpu.md"
python="${HPCTRAIN_PYTHON:-$HOME/.cache/hpctrain/venv/bin/python}"
qs="${HPCTRAIN_BUILD_DIR:?}/tests/quickstart"
project="$qs/sft"
[ -x "$project/build/train" ] && [ -e "$qs/venv" ] ||
  fail "no quickstart build in $qs: container_recipe_test.sh makes it (the ctest fixture quickstart_program)"
venv="$(cat "$qs/venv")"
python_home="$(dirname "$(sed -n 's/^home = //p' "$venv/pyvenv.cfg")")"
slurm_etc="$(dirname "${SLURM_CONF:-/etc/slurm/slurm.conf}")"
export USER="${USER:-$(id -un)}"  # ch-run requires it
unset HPCTRAIN_RUN_DIR
cd "$project"
rm -rf hpctrain-jobs models data

# --- the doc is what runs here ------------------------------------------------------------------------------------
"$python" - "$doc" "$root/containers/example/train.cpp" "$(realpath "$0")" <<'PY' || fail "docs/quickstart-gpu.md and this test differ"
import re, sys
doc, program, test = (open(p).read() for p in sys.argv[1:])
blocks = re.findall(r"```(\w*)\n(.*?)```", doc, re.S)
shown = [body for lang, body in blocks if lang == "cpp" and "int main" in body]
if shown != [program]:
    sys.exit("the doc's train.cpp is not containers/example/train.cpp, whole")
commands = [line.strip() for lang, body in blocks if lang == "sh" for line in body.splitlines()
            if line.startswith(("in_image ./build/train", "scancel ", "ls ", "MODEL="))]
missing = [c for c in commands if c not in test]
if missing or len(commands) < 8:
    sys.exit("commands of the doc this test does not run: %s (of %d)" % (missing, len(commands)))
print("the doc's train.cpp and its %d commands" % len(commands))
PY

# The doc's in_image, with this image's binds of the host's /usr and venv (a real image has both inside).
binds=(-b /usr:/usr -b "$venv:/opt/venv")
[[ "$python_home" == /usr/* ]] || binds+=(-b "$python_home:$python_home")
in_image() {
  ch-run "${binds[@]}" -b "$PWD:$PWD" -b "$slurm_etc:$slurm_etc" -b /run/munge:/run/munge --cd "$PWD" "$qs/image" -- "$@"
}

# --- the model and the data -----------------------------------------------------------------------------------------
"$python" "$root/tests/lm/sft_oracle.py" make "$qs" /usr/share/games/fortunes > make.log 2>&1 ||
  log=make.log fail "transformers could not make the small Llama"
mkdir -p models/Llama-3.1-8B-Instruct data
mv "$qs/llama" models/small-llama
cp "$qs/conversations.jsonl" data/chat.jsonl
"$python" - models/small-llama models/Llama-3.1-8B-Instruct <<'PY'
import json, os, shutil, sys
small, big = sys.argv[1:]
config = json.load(open(os.path.join(small, "config.json")))
config.update(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
              num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
              rope_theta=500000.0, tie_word_embeddings=False, dtype="bfloat16", torch_dtype="bfloat16")
json.dump(config, open(os.path.join(big, "config.json"), "w"))
for name in os.listdir(small):  # the tokenizer and its chat template; no weights
    if not name.endswith(".safetensors") and name != "config.json":
        shutil.copy(os.path.join(small, name), big)
PY

# --- check before you queue: 8B as written --------------------------------------------------------------------------
MODEL=models/Llama-3.1-8B-Instruct DATA=data/chat.jsonl
in_image ./build/train --plan --from $MODEL --data $DATA --lora-r 16 --gpu-memory 80GB > plan-lora.log 2>&1 ||
  log=plan-lora.log fail "--plan of LoRA at 8B exited $?"
in_image ./build/train --plan --from $MODEL --data $DATA --gpu-memory 80GB > plan-full.log 2>&1 ||
  log=plan-full.log fail "--plan of full SFT at 8B exited $?"
for plan in plan-lora.log plan-full.log; do
  cat "$plan"
  grep -q "16 rank(s) (8 per node)" "$plan" || log=$plan fail "$plan does not plan 16 ranks, 8 a node"
  grep -q "fits" "$plan" || log=$plan fail "$plan does not say it fits"
done
in_image ./build/train --dry-run --from $MODEL --data $DATA --lora-r 16 --lr 1e-4 > dry.log 2>&1 ||
  log=dry.log fail "--dry-run exited $?"
grep -q "^#SBATCH --nodes=2$" dry.log && grep -q "^#SBATCH --ntasks-per-node=8$" dry.log &&
  grep -qE "^#SBATCH --(gpus-per-node=8|gres=gpu:8)$" dry.log || log=dry.log fail "--dry-run does not ask for 2 nodes x 8 GPUs, 8 tasks a node"
grep -q "ch-run .* $qs/image -- " dry.log || log=dry.log fail "--dry-run's srun line does not enter the image"
# What the doc prints of the full plan is this run's.
"$python" - "$doc" plan-full.log <<'PY' || log=plan-full.log fail "the doc's plan is not what --plan prints"
import re, sys
doc, log = (open(p).read() for p in sys.argv[1:])
shown = re.search(r"```text\n(memory plan: .*?)```", doc, re.S)
lines = log.splitlines()
sys.exit(0 if shown and all(l in lines for l in shown.group(1).splitlines()) else "the doc shows lines --plan did not print")
PY
echo "ok: the plans fit (the doc's is this one), and --dry-run asks for 2 nodes x 8 GPUs"

# --- small scale from here: the small Llama, no GPUs, one CPU a task ------------------------------------------------
MODEL=models/small-llama
small=(--gpus-per-node 0 --tasks-per-node 1 --cpus-per-task 1 --partition debug --time 20:00 --batch-size 4 --gradient-accumulation 1
       --max-length 128 --precision fp32 --log-every 1 --eval-every 1000)

# --- LoRA, a requeue, the export ---------------------------------------------------------------------------------
in_image ./build/train --submit --from $MODEL --data $DATA --lora-r 16 --lr 1e-4 "${small[@]}" --epochs 20 --max-steps 300 > submit-lora.log 2>&1 ||
  log=submit-lora.log fail "--submit of the LoRA run exited $?"
JOB="$(sed -n 's/^submitted job \([0-9]*\)$/\1/p' submit-lora.log)"
[ -n "$JOB" ] || log=submit-lora.log fail "no job id"
trap 'scancel "$JOB" 2>/dev/null || true' EXIT
job_log="hpctrain-jobs/sft/$JOB/slurm-$JOB.out"
# A step of this model takes a few tens of milliseconds: the signal goes out as soon as training runs.
wait_for "grep -q '^step 6/' '$job_log' 2>/dev/null" 600 0.1 || log="$job_log" fail "job $JOB never reached step 6"
scancel --signal=USR2 $JOB
wait_for "grep -q '^preempted: checkpointed step' '$job_log'" 120 || log="$job_log" fail "no checkpoint after USR2"
stopped="$(sed -n 's/^preempted: checkpointed step \([0-9]*\) .*/\1/p' "$job_log" | head -1)"
wait_for "release_requeue_hold $JOB; grep -q '^resumed from .* at step $stopped ' '$job_log'" 300 ||
  log="$job_log" fail "job $JOB did not resume from step $stopped"
wait_for '[ -z "$(squeue --noheader --jobs "$JOB" 2>/dev/null)" ]' 600 || log="$job_log" fail "job $JOB did not end"
in_image ./build/train --status > status.log 2>&1 || log=status.log fail "--status exited $?"
cat status.log
grep -q "^job $JOB (sft): COMPLETED .*1 restart(s)" status.log || log=status.log fail "--status does not say COMPLETED, 1 restart"
scontrol show job "$JOB" | grep -q "Restarts=1" || fail "job $JOB was not restarted once"
grep -q "^step 300/300 " "$job_log" || log="$job_log" fail "the resumed run did not reach step 300"
ls hpctrain-jobs/sft/$JOB/export > export-lora.log
# The listing the doc shows after its ls.
"$python" - "$doc" export-lora.log <<'PY' || log=export-lora.log fail "the LoRA export is not what the doc lists"
import re, sys
doc, listing = (open(p).read() for p in sys.argv[1:])
shown = re.search(r"```sh\nls hpctrain-jobs/sft/\$JOB/export\n```\n+```text\n(.*?)```", doc, re.S)
sys.exit(0 if shown and shown.group(1) == listing else "the doc shows %r" % (shown and shown.group(1)))
PY
echo "ok: LoRA job $JOB requeued at step $stopped, resumed, completed, exported"

# --- then every parameter -----------------------------------------------------------------------------------------
in_image ./build/train --submit --from $MODEL --data $DATA "${small[@]}" --max-steps 6 > submit-full.log 2>&1 ||
  log=submit-full.log fail "--submit of the full run exited $?"
FULL="$(sed -n 's/^submitted job \([0-9]*\)$/\1/p' submit-full.log)"
[ -n "$FULL" ] || log=submit-full.log fail "no job id"
trap 'scancel "$FULL" 2>/dev/null || true' EXIT
in_image ./build/train --logs --follow > follow.log 2>&1 ||
  log=follow.log fail "--logs --follow exited $?"
grep -q "^step 6/6 " follow.log || log=follow.log fail "--logs --follow did not show the full run's last step"
[ "$(final_state "$FULL")" = COMPLETED ] || log=follow.log fail "the full run $FULL did not complete"
ls hpctrain-jobs/sft/$FULL/export > export-full.log
"$python" - "hpctrain-jobs/sft/$JOB/export/merged" "hpctrain-jobs/sft/$FULL/export" <<'PY' || fail "transformers could not load an export"
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
for directory in sys.argv[1:]:
    model = AutoModelForCausalLM.from_pretrained(directory)
    ids = AutoTokenizer.from_pretrained(directory)("Q: what is a fortune?", return_tensors="pt").input_ids
    logits = model(ids).logits
    assert torch.isfinite(logits).all(), directory
    print("transformers loads", directory, tuple(logits.shape))
PY
trap - EXIT
echo "PASS: docs/quickstart-gpu.md's commands ran: plans of 8B, --dry-run, a LoRA job requeued and resumed ($JOB), a full job ($FULL), both exports load in transformers"
