#!/usr/bin/env bash
# examples/dpo.cpp against TRL's DPOTrainer (trl 0.24, tests/lm/dpo_oracle.py), on a small random Llama with the SFT
# test's tokenizer and chat template (sft_oracle.py make) and 34 conversational pairs with implicit prompts (32 to
# train on, every 16th held out):
#  - full fine-tuning under zero3 at --local 2 in fp32, one step a pass over the 32 pairs: the first step's loss and
#    log-probabilities are DPOTrainer.evaluate()'s on those pairs from the same weights (policy and reference the start
#    model), within 1e-4 relative; the run's last evaluation (loss, rewards, log-probabilities, logits) is what TRL
#    computes with the export (fp32, loaded by transformers) as the policy and the start model as the reference, within
#    1e-4 relative; the last step's rewards/accuracies is above 0.5; its 8 training losses (0.693 down to 0.224) are a
#    PyTorch loop's (dpo_oracle.py train: TRL's batch and loss on transformers' model, torch's AdamW, the warmup and
#    cosine, clipping) from the same weights within 1e-4 relative, the loss-curve bound of the GPT example's oracle
#    (measured 4.9e-7 on the AMD EPYC: fp32 sums in another order, carried through 8 Adam steps);
#  - LoRA under zero2 at --local 2 (the reference: the model with its adapters off; the resume leg's uninterrupted
#    run below): the first step's loss is log 2, and the adapter it exports loads in PEFT with the logits of its
#    merged export (sft_oracle.py peft-check);
#  - a reference held in memory (--ref-model, TRL's ref_model) with TRL's weighted loss list, cDPO's smoothing and RPO's
#    NLL term (--loss-type sigmoid:0.8,sft:0.2 --label-smoothing 0.1 --rpo-alpha 0.5) at --local 1: the first step's
#    loss and nll_loss are DPOTrainer.evaluate()'s with loss_type [sigmoid, sft], loss_weights [0.8, 0.2], rpo_alpha 0.5
#    and label_smoothing 0.1, within 1e-4 relative;
#  - memory: on a 70M-parameter Llama (6 layers of 1024), a LoRA run's peak is below the same run's with that model
#    held as the reference by at least half the model's fp32 bytes (the held model is all of them; the allocator and
#    the file's pages move either peak by up to ~90 MB under a loaded machine: with a 24M model, 96 MB, a fresh clone's
#    run once measured 25 MB apart, so the model is 282 MB);
#  - resume: zero3 (the stored reference log-probabilities) and zero2 with LoRA (adapters off) at --local 2, preempted
#    (SIGTERM) mid-run and resumed, end with the uninterrupted run's parameters (CRC-32C) and log the same losses and
#    rewards/margins after the resume, bit for bit;
#  - the job's preparation step tokenizes the pairs and computes the reference once (--local runs it first), the ranks
#    read its file; the worker run by hand (no job) tokenizes and computes them itself, with the same first step;
#  - a row whose chosen equals its rejected exits 2 before training, naming the file and its line; so does a
#    --ref-model of a config alone (a random reference), naming the knob.
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
# A reference of a config alone would be random weights: refused at login, naming the knob, nothing queued or run.
mkdir -p config-only && cp llama/config.json config-only/
status=0
"$dpo" --from llama --data pairs.jsonl --local 2 --ref-model config-only > config-only.log 2>&1 || status=$?
[ "$status" = 2 ] && grep -q "ref-model.*config-only.*must be a Hugging Face model directory with its weights" \
  config-only.log || log=config-only.log fail "--ref-model of a config alone: dpo exited $status without naming it"

HPCTRAIN_RUN_DIR="$work/run" "$dpo" --from llama --data pairs.jsonl --local 2 --sharding zero3 --precision fp32 \
  --batch-size 32 --epochs 8 --lr 2e-3 --eval-every 0 --checkpoint-every 0 --export-dtype fp32 > run.log 2>&1 ||
  log=run.log fail "dpo exited $?"
grep -q "^hpctrain: prepared pairs.jsonl: 32 pairs and their reference log-probabilities (on cpu) in .*/prepare/dpo/" \
  run.log || log=run.log fail "the job's preparation did not prepare the pairs and their reference"
grep -q "^hpctrain: pairs.jsonl: 32 pairs (prepared by the job: .*); the reference log-probabilities of the start weights from the job's preparation" \
  run.log || log=run.log fail "the ranks did not read the prepared pairs and reference"
# No job: the worker itself, one rank, no preparation step: it tokenizes and computes the reference itself.
HPCTRAIN_RUN_DIR="$work/plain" "$dpo" --hpctrain-worker --from llama --data pairs.jsonl --precision fp32 \
  --batch-size 32 --max-steps 1 --eval-every 0 --checkpoint-every 0 > plain.log 2>&1 || log=plain.log fail "plain worker exited $?"
grep -q "^hpctrain: pairs.jsonl: 32 pairs (tokenized in each rank); the reference log-probabilities of the start weights computed here" \
  plain.log || log=plain.log fail "without a job, the worker did not tokenize and compute the reference itself"
"$python" "$here/dpo_oracle.py" evaluate llama pairs.jsonl llama:train run/export:validation > trl.json 2> trl.log ||
  log=trl.log fail "TRL could not evaluate"
# transformers' PrinterCallback prints each evaluation too (a Python dict): the JSON lines are the oracle's
start_trl="$(grep '^{"' trl.json | sed -n 1p)" end_trl="$(grep '^{"' trl.json | sed -n 2p)"
trl() { sed -n "s|.*\"eval_$2\": \([^,}]*\).*|\1|p" <<< "$1"; }
metrics=run/metrics.jsonl
report=""
for key in loss logps/chosen logps/rejected; do
  ours="$(value $metrics "$key" first)" theirs="$(trl "$start_trl" "$key")" plain="$(value plain/metrics.jsonl "$key" first)"
  close "$ours" "$theirs" 1e-4 || fail "first step's $key: $ours, TRL's DPOTrainer $theirs"
  close "$plain" "$theirs" 1e-4 || fail "first step's $key without a job: $plain, TRL's DPOTrainer $theirs"
  report="$report first $key $ours, without a job $plain (TRL $theirs);"
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
# The 8 steps against a PyTorch loop (TRL's loss and data on transformers' model, torch's AdamW, the schedule, clipping)
# from the same weights on the same batch (every step takes all 32 pairs, so the order of the pairs cannot differ).
"$python" "$here/dpo_oracle.py" train llama pairs.jsonl 8 2e-3 5 0.1 > loop.json 2> loop.log ||
  log=loop.log fail "the PyTorch loop failed"
worst=0 loop_bound=1e-4
for step in 1 2 3 4 5 6 7 8; do
  ours="$(grep -v '"eval_loss"' $metrics | grep "\"step\":$step," | sed -n 's|.*"loss":\([^,}]*\).*|\1|p')"
  theirs="$(grep "^{\"step\": $step," loop.json | sed -n 's|.*"loss": \([^,}]*\).*|\1|p')"
  close "$ours" "$theirs" "$loop_bound" || fail "step $step's loss: $ours, the PyTorch loop's $theirs"
  worst="$(awk -v w="$worst" -v d="$(difference "$ours" "$theirs")" 'BEGIN { print (d > w) ? d : w }')"
done
report="$report 8 steps against a PyTorch loop: at most $worst apart (bound $loop_bound);"
# --loss-chunk-tokens: the same 8 steps with the head 16 tokens at a time (the logits never whole), the same losses but
# for the order of fp32 sums (measured 6.6e-7 apart; bound 1e-5, ten times the loop's measured figure).
HPCTRAIN_RUN_DIR="$work/chunked" "$dpo" --from llama --data pairs.jsonl --local 2 --sharding zero3 --precision fp32 \
  --batch-size 32 --epochs 8 --lr 2e-3 --eval-every 0 --checkpoint-every 0 --export-dtype fp32 --loss-chunk-tokens 16 \
  > chunked.log 2>&1 || log=chunked.log fail "dpo --loss-chunk-tokens 16 exited $?"
# The reference pass's chunking is an input of the prepared pairs: this run prepares its own rather than reading those
# the whole logits gave.
grep -q "^hpctrain: prepared pairs.jsonl: " chunked.log ||
  log=chunked.log fail "dpo --loss-chunk-tokens 16 read the reference log-probabilities prepared with the whole logits"
for step in 1 2 3 4 5 6 7 8; do
  ours="$(grep -v '"eval_loss"' chunked/metrics.jsonl | grep "\"step\":$step," | sed -n 's|.*"loss":\([^,}]*\).*|\1|p')"
  whole="$(grep -v '"eval_loss"' $metrics | grep "\"step\":$step," | sed -n 's|.*"loss":\([^,}]*\).*|\1|p')"
  close "$ours" "$whole" 1e-5 || fail "step $step's loss with the head 16 tokens at a time: $ours, with the whole logits $whole"
done
# Its memory, where logits dominate: the same Llama with Llama 3's vocabulary (128,256), 8 pairs a step at --local 1.
# The whole logits of a step are at least 16 rows of the shortest row's tokens x 128,256 x 4 bytes, held at once
# (with their log-softmax and, in backward, their gradient: more); chunks of 64 tokens hold 33 MB. The chunked run's
# peak must be below the whole one's by at least that one copy (measured 3.81 GiB against 0.77 on the AMD EPYC).
shortest="$("$python" "$here/dpo_oracle.py" wide "$work" 2> wide.log | tail -1)" || log=wide.log fail "no wide model"
for chunk in 0 64; do
  HPCTRAIN_RUN_DIR="$work/wide-$chunk" "$dpo" --from wide --data pairs.jsonl --local 1 --precision fp32 --batch-size 8 \
    --max-steps 1 --eval-every 0 --checkpoint-every 0 --loss-chunk-tokens "$chunk" > "wide-$chunk.log" 2>&1 ||
    log="wide-$chunk.log" fail "dpo --from wide --loss-chunk-tokens $chunk exited $?"
done
steps_peak() { sed -n 's/.*steps done: peak host memory \([0-9.]*\) GiB.*/\1/p' "$1"; }
whole_peak="$(steps_peak wide-0.log)" chunked_peak="$(steps_peak wide-64.log)"
awk -v w="$whole_peak" -v c="$chunked_peak" -v t="$shortest" 'BEGIN { exit !((w - c) * 2^30 >= 16 * t * 128256 * 4) }' ||
  fail "128,256 words: the whole logits peak at $whole_peak GiB, chunks of 64 tokens at $chunked_peak (rows of $shortest tokens at least)"
report="$report --loss-chunk-tokens 16: the 8 losses within 1e-5; vocabulary 128,256: peak $whole_peak GiB whole, $chunked_peak in chunks of 64;"

HPCTRAIN_RUN_DIR="$work/held" "$dpo" --from llama --data pairs.jsonl --local 1 --precision fp32 --batch-size 32 \
  --max-steps 1 --eval-every 0 --checkpoint-every 0 --ref-model llama --loss-type sigmoid:0.8,sft:0.2 \
  --label-smoothing 0.1 --rpo-alpha 0.5 > held.log 2>&1 || log=held.log fail "dpo with --ref-model exited $?"
grep -q "the reference: the model of llama, held in memory" held.log || log=held.log fail "no held reference said"
config='{"loss_type": ["sigmoid", "sft"], "loss_weights": [0.8, 0.2], "rpo_alpha": 0.5, "label_smoothing": 0.1}'
"$python" "$here/dpo_oracle.py" evaluate llama pairs.jsonl llama:train "--config=$config" > trl-rpo.json \
  2> trl-rpo.log || log=trl-rpo.log fail "TRL could not evaluate with RPO and a loss list"
rpo_trl="$(grep '^{"' trl-rpo.json | sed -n 1p)"
for key in loss nll_loss; do
  ours="$(value held/metrics.jsonl "$key" first)" theirs="$(trl "$rpo_trl" "$key")"
  close "$ours" "$theirs" 1e-4 || fail "held reference, sigmoid:0.8,sft:0.2, rpo 0.5: first $key $ours, TRL's $theirs"
  report="$report held reference + loss list + RPO: first $key $ours (TRL $theirs);"
done

"$python" "$here/sft_oracle.py" make-sharded "$work" 6 1024 2816 > make-sharded.log 2>&1 ||
  log=make-sharded.log fail "the oracle could not make the 70M model"
parameters="$(sed -n 's/^\([0-9]*\) parameters.*/\1/p' make-sharded.log)"
for mode in mem-lora mem-held; do
  extra=()
  [ "$mode" = mem-held ] && extra=(--ref-model sharded)
  HPCTRAIN_RUN_DIR="$work/$mode" "$dpo" --from sharded --data pairs.jsonl --local 1 --precision fp32 --batch-size 4 \
    --max-steps 1 --eval-every 0 --checkpoint-every 0 --lora-r 8 "${extra[@]}" > "$mode.log" 2>&1 ||
    log="$mode.log" fail "dpo --lora-r 8 ${extra[*]} exited $?"
done
one="$(steps_peak mem-lora.log)" two="$(steps_peak mem-held.log)"
[ -n "$one" ] && [ -n "$two" ] || fail "no peak memory printed"
awk -v a="$one" -v b="$two" -v p="$parameters" 'BEGIN { exit !((b - a) * 1073741824 >= 0.5 * 4 * p) }' ||
  fail "LoRA's peak $one GiB against $two GiB with the $parameters-parameter model held: not one model's weights apart"
report="$report LoRA peak $one GiB, with a held reference $two GiB ($parameters parameters, fp32);"
# Resume: preempted and resumed equals uninterrupted, bit for bit (fp32, the same ranks).
after_resume() { "$python" -c 'import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "loss" in r and "eval_loss" not in r and r["step"] > int(sys.argv[2]):
        print(r["step"], repr(r["loss"]), repr(r["rewards/margins"]))' "$1" "$2" | sort -un; }
for leg in "zero3" "zero2 --lora-r 8"; do
  name="resume-${leg%% *}"
  # shellcheck disable=SC2086  # the leg's words are options
  resume_args=(--report-digest --from llama --data pairs.jsonl --local 2 --precision fp32 --batch-size 4 --epochs 4 --lr 1e-3
    --eval-every 0 --checkpoint-every 0 --export-dtype fp32 --sharding $leg)
  HPCTRAIN_RUN_DIR="$work/$name-whole" "$dpo" "${resume_args[@]}" > "$name-whole.log" 2>&1 ||
    log="$name-whole.log" fail "dpo $leg exited $?"
  whole="$(sed -n 's/^parameters_crc32c=//p' "$name-whole.log")"
  if [ "$name" = resume-zero2 ]; then  # LoRA: the reference is the adapters off, which the first step's policy is
    grep -q "^hpctrain: pairs.jsonl: 32 pairs (prepared by the job: .*); the reference: the model with its adapters off" \
      "$name-whole.log" || log="$name-whole.log" fail "LoRA: the ranks did not read the prepared pairs, or the reference is not the adapters off"
    first="$(value "$name-whole/metrics.jsonl" loss first)"
    close "$first" 0.69314718 1e-4 || fail "LoRA's first loss is $first, not log 2 (the adapters off are the policy)"
    "$python" "$here/sft_oracle.py" peft-check llama "$name-whole/export" > peft.log 2>&1 ||
      log=peft.log fail "PEFT's view of the DPO adapter differs from our merged export"
    report="$report LoRA first loss $first, $(tail -1 peft.log);"
  fi
  preempt_at_step 10 "$name" "$name-preempted.log" env HPCTRAIN_RUN_DIR="$work/$name" "$dpo" "${resume_args[@]}"
  [ -n "$stopped_at" ] && [ "$stopped_at" -lt 32 ] || log="$name-preempted.log" fail "dpo $leg was not preempted"
  HPCTRAIN_RUN_DIR="$work/$name" "$dpo" "${resume_args[@]}" > "$name-resumed.log" 2>&1 ||
    log="$name-resumed.log" fail "the resumed dpo $leg exited $?"
  grep -q "^resumed from .* at step $stopped_at " "$name-resumed.log" ||
    log="$name-resumed.log" fail "dpo $leg did not resume at step $stopped_at"
  resumed="$(sed -n 's/^parameters_crc32c=//p' "$name-resumed.log")"
  [ -n "$whole" ] && [ "$resumed" = "$whole" ] ||
    fail "dpo $leg preempted at step $stopped_at and resumed: parameters $resumed, uninterrupted $whole"
  after_resume "$name-whole/metrics.jsonl" "$stopped_at" > "$name-whole.losses"
  after_resume "$name/metrics.jsonl" "$stopped_at" > "$name-resumed.losses"
  [ -s "$name-whole.losses" ] && cmp -s "$name-whole.losses" "$name-resumed.losses" ||
    fail "dpo $leg: the losses after the resume differ: $(diff "$name-whole.losses" "$name-resumed.losses" | head -4)"
  report="$report $leg preempted at step $stopped_at resumes bit-identical ($whole);"
done
cd / && rm -rf "${work:?}"
echo "PASS:$report"
