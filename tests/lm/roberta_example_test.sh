#!/usr/bin/env bash
# examples/roberta and examples/fill_mask end to end (issue 19, seed 002), checked by transformers:
#  - roberta --local 2 (a small encoder, 60 steps) prepares the fortunes once with the RoBERTa tokenizer, trains
#    two ranks on masked blocks, evaluates (val_loss, masked_accuracy) and exports a Hugging Face directory;
#    val_loss ends below the loss of a uniform guess (ln of the vocabulary) by a clear margin;
#  - a second run in the same place (other arguments: its preparation runs again) finds the tokens and prepares
#    nothing again;
#  - transformers loads the export, and pipeline("fill-mask") on it gives the ids and probabilities that
#    build/examples/fill_mask prints (tests/lm/fill_mask_oracle.py);
#  - fill_mask on a text without <mask> exits 2 naming --text.
# Usage: roberta_example_test.sh <roberta binary> <fill_mask binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
roberta="$(realpath "$1")"
fill_mask="$(realpath "$2")"
here="$(cd "$(dirname "$0")" && pwd)"
python="${HPCTRAIN_PYTHON:-$HOME/.cache/hpctrain/venv/bin/python}"
tokenizer="$HOME/.cache/hpctrain/roberta-fortunes/tokenizer.json"
[ -f "$tokenizer" ] || { echo "SKIP: no RoBERTa tokenizer at $tokenizer (scripts/setup makes it)"; exit 77; }
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/roberta-example-test.XXXXXX")"
cd "$work"
unset HPCTRAIN_RUN_DIR

small=(--layers 2 --hidden 64 --heads 2 --max-length 64 --warmup-steps 5 --eval-every 30 --log-every 5)
HPCTRAIN_RUN_DIR="$work/run" "$roberta" --local 2 --max-steps 60 --lr 2e-3 "${small[@]}" > run.log 2>&1 || fail "roberta --local 2 exited $?"
grep -q '^hpctrain: prepared [0-9]* training and [0-9]* validation tokens' run.log || fail "the preparation step did not tokenize"
grep -q '^hpctrain: 2 rank(s) on cpu (gloo)' run.log || fail "not 2 Gloo ranks"
grep -q "^step 60/60 " run.log || fail "no step 60"
grep -q 'masked_accuracy' run.log || fail "no masked_accuracy in the evaluation"
val_loss="$(sed -n 's/^val_loss=\([0-9.]*\).*/\1/p' run.log | tail -1)"
[ -n "$val_loss" ] || fail "no val_loss= line"
vocab="$("$python" -c "import json; print(len(json.load(open('$tokenizer'))['model']['vocab']))")"
awk -v l="$val_loss" -v v="$vocab" 'BEGIN { exit !(l < log(v) - 1.0) }' ||
  fail "val_loss $val_loss is not clearly below a uniform guess over $vocab tokens ($(awk -v v="$vocab" 'BEGIN { print log(v) }'))"
export_dir="$work/run/export"
for file in config.json model.safetensors tokenizer.json tokenizer_config.json special_tokens_map.json; do
  [ -f "$export_dir/$file" ] || fail "the export lacks $file"
done

HPCTRAIN_RUN_DIR="$work/again" "$roberta" --local 1 --max-steps 1 "${small[@]}" > again.log 2>&1 || fail "the second run exited $?"
grep -q '^hpctrain: .*/prepare/tokens already holds these tokens; not preparing again' again.log &&
  ! grep -q '^hpctrain: prepared [0-9]* training' again.log || fail "the second run prepared the tokens again"

"$python" "$here/fill_mask_oracle.py" "$export_dir" "$fill_mask" > oracle.log 2>&1 || fail "fill_mask differs from transformers: $(tail -3 oracle.log)"
cat oracle.log

status=0
"$fill_mask" --model "$export_dir" --text "no mask here" > nomask.log 2>&1 || status=$?
[ "$status" = 2 ] || fail "fill_mask without a mask exited $status, not 2"
grep -q -- '--text' nomask.log || fail "the error does not name --text"
echo "PASS: roberta trained 2 ranks to val_loss=$val_loss (uniform: ln $vocab), exported; fill_mask equals transformers' pipeline"
