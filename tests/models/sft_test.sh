#!/usr/bin/env bash
# examples/sft end to end, checked by transformers and HF tokenizers (tests/models/sft_oracle.py):
#  - the start: a small random GPT2LMHeadModel saved by transformers with a byte-level BPE trained on the
#    fortunes by HF tokenizers (and a Llama config with the same tokenizer, for the BOS rule);
#  - the data: sft --list-pairs finds the same Q/A pairs as the oracle's own reading; every example's ids are
#    HF tokenizers' ids of prompt then response (+ EOS; BOS first for Llama); the loss mask is 0 on every
#    prompt target and 1 on every response target;
#  - bad --from (missing, without config.json) exits 2 naming the path, with nothing written;
#  - sft --local 2 trains: the masked response loss on the validation pairs falls, and equals what
#    transformers computes on the start model and on the exported model (1e-4 relative, fp32);
#  - the export loads in transformers (the loss above) and build/examples/generate continues a prompt with it.
# Usage: sft_test.sh <sft binary> <generate binary>
set -euo pipefail
sft="$(realpath "$1")"
generate="$(realpath "$2")"
here="$(cd "$(dirname "$0")" && pwd)"
python="${HPCTRAIN_PYTHON:-$HOME/.cache/hpctrain/venv/bin/python}"
fortunes=/usr/share/games/fortunes
if [ ! -x "$python" ] || ! "$python" -c 'import transformers, tokenizers' 2>/dev/null; then
  echo "SKIP: no Python with transformers and tokenizers at $python (scripts/setup makes it)"; exit 77
fi
[ -d "$fortunes" ] || { echo "SKIP: no fortunes corpus at $fortunes (Debian package fortunes)"; exit 77; }
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/sft-test.XXXXXX")"
cd "$work"
fail() { echo "FAIL: $*" >&2; for f in run.log bad.log; do [ -f "$f" ] && cat "$f" >&2; done; exit 1; }
oracle() { "$python" "$here/sft_oracle.py" "$@"; }

oracle make "$work" "$fortunes" || fail "the oracle could not make the start model"

# The data and the masks, before any training.
"$sft" --from gpt2 --max-length 128 --list-pairs > gpt2.jsonl 2> list.log || fail "--list-pairs exited $?"
oracle check-pairs "$fortunes" gpt2.jsonl || fail "the pairs differ from the oracle's reading"
oracle check-examples gpt2 gpt2.jsonl 128 || fail "GPT-2 examples: ids or masks wrong"
"$sft" --from llama --max-length 128 --list-pairs > llama.jsonl 2>> list.log || fail "--list-pairs (llama) exited $?"
oracle check-examples llama llama.jsonl 128 || fail "Llama examples: ids, BOS or masks wrong"
"$python" -c 'import json, sys; rows = [json.loads(l) for l in open(sys.argv[1])]; sys.exit(0 if all(r["ids"][0] == 1 for r in rows) else 1)' llama.jsonl \
  || fail "a Llama example does not start with BOS"

# Bad --from: exit 2 before anything is written, naming the path.
mkdir -p bad/no-config
for from in bad/missing bad/no-config; do
  status=0
  (cd bad && HPCTRAIN_RUN_DIR="$work/bad/run" "$sft" --from "../$from" --local 2) > bad.log 2>&1 || status=$?
  [ "$status" = 2 ] || fail "--from $from: exit status $status, not 2"
  grep -q "\[hpctrain.spec.knob\] --from = ../$from: " bad.log || fail "--from $from: the message does not name the path"
  [ ! -e bad/run ] && [ ! -e bad/hpctrain-jobs ] || fail "--from $from: something was written"
done
"$sft" --from gpt2 --dry-run > dry-run.sh 2>&1 || fail "--dry-run exited $?"
grep -q -- '--from=gpt2' dry-run.sh || fail "--dry-run does not forward --from to the workers"

# Train: 2 ranks, 2 epochs.
HPCTRAIN_RUN_DIR="$work/run" "$sft" --from gpt2 --local 2 --max-length 128 --lr 1e-3 --epochs 2 > run.log 2>&1 || fail "sft exited $?"
grep -q '^hpctrain: 2 rank(s) on cpu (gloo)' run.log || fail "not 2 Gloo ranks"
before="$(sed -n 's/^response_loss_before=\([^ ]*\).*/\1/p' run.log | tail -1)"
after="$(sed -n 's/^response_loss_after=\([^ ]*\).*/\1/p' run.log | tail -1)"
[ -n "$before" ] && [ -n "$after" ] || fail "no response_loss_before/after"
awk -v b="$before" -v a="$after" 'BEGIN { exit !(a < b - 0.2) }' || fail "the response loss did not fall: $before -> $after"
[ -f run/export/config.json ] && [ -f run/export/model.safetensors ] && [ -f run/export/tokenizer.json ] || fail "no export in run/export"

# The masking, by the oracle: transformers' masked loss on the same validation pairs.
close() { awk -v x="$1" -v y="$2" 'BEGIN { d = x - y; if (d < 0) d = -d; exit !(d <= 1e-4 * (y < 0 ? -y : y)) }'; }
expected_before="$(oracle loss gpt2 gpt2.jsonl 128 2>/dev/null)" || fail "transformers could not compute the start model's loss"
close "$before" "$expected_before" || fail "response_loss_before=$before but transformers says $expected_before"
expected_after="$(oracle loss run/export gpt2.jsonl 128 2>/dev/null)" || fail "transformers could not load the export"
close "$after" "$expected_after" || fail "response_loss_after=$after but transformers says $expected_after"

# The export generates.
"$generate" --model run/export --prompt $'Q: What is the difference?\nA:' --max-new-tokens 8 > generated.txt 2>&1 || fail "generate exited $?"
echo "PASS: response loss $before -> $after (transformers: $expected_before -> $expected_after)"
