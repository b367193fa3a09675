#!/usr/bin/env bash
# --float8 end to end through examples/gpt on this CPU machine (issue 58, item 5):
#  - refused before the run: exit 2, the message naming the device ("cpu"): nothing of a run written (the run
#    directory the launcher named stays empty: no metrics.jsonl, no checkpoint); with --precision fp32 naming the
#    precision, and with LoRA, by the login command: nothing prepared, no run directory named;
#  - under the test seam HPCTRAIN_FLOAT8_EMULATED (docs/seams.md) the same command trains, GPT-2's projections in
#    float8 with the products emulated, and each of its 3 steps' losses is within 2^-4 of bf16's from the same weights
#    and batches (the bound of tests/models/float8_projections_test.cpp's tiny Llama: one e4m3 rounding's worst
#    relative error, generous: rounding errors of random sign shrink as they add up).
# Usage: float8_example_test.sh <gpt binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
gpt="$(realpath "$1")"
[ -f "$HOME/.cache/hpctrain/gpt2.tiktoken" ] || { echo "SKIP: needs ~/.cache/hpctrain/gpt2.tiktoken (scripts/setup)"; exit 77; }
[ -d /usr/share/games/fortunes ] || { echo "SKIP: needs Debian's fortunes"; exit 77; }
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/float8-example-test.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cd "$work"
small=(--local 1 --max-steps 3 --log-every 1 --eval-every 0 --checkpoint-every 0 --max-eval-examples 8 --n-layer 2
       --n-embd 64 --seq-len 64 --batch-size 4 --sample-tokens 0)

# refused NAME MESSAGE ARGS...: gpt ARGS exits 2 with MESSAGE on its output, and no run wrote anything.
refused() {
  local name=$1 message=$2 status=0
  shift 2
  "$gpt" "${small[@]}" "$@" > "$name.log" 2>&1 || status=$?
  [ "$status" = 2 ] || log="$name.log" fail "$name: exited $status, not 2"
  grep -qF -- "$message" "$name.log" || log="$name.log" fail "$name: no '$message'"
  # The launcher names the run's directory before a worker starts (hpctrain-jobs/gpt/local-<time>): it stays empty.
  [ -z "$(find hpctrain-jobs/gpt -mindepth 2 -path '*/local-*' 2> /dev/null)" ] || fail "$name: a run wrote $(find hpctrain-jobs/gpt -mindepth 2 -path '*/local-*')"
  rm -rf hpctrain-jobs/gpt/local-*
}
# A stated precision other than bf16, and LoRA, are refused by the login command: nothing prepared, no run named.
refused in-fp32 "[hpctrain.spec.training.float8] training.float8 = on, with --precision fp32:" --float8 --precision fp32
refused with-lora "[hpctrain.spec.training.float8] training.float8 = on, with LoRA:" --float8 --precision bf16 --lora-r 4
[ ! -e hpctrain-jobs ] || fail "refused at login, yet $(find hpctrain-jobs | head -3) was written"
refused on-cpu "[hpctrain.spec.training.float8] training.float8 = on, with the device cpu: float8 products" \
  --float8 --precision bf16
echo "refused before the run: $(grep -hF '[hpctrain.spec.training.float8]' on-cpu.log | head -1)"

# losses RUN: the train records' losses of RUN's metrics.jsonl, one a line.
losses() { grep -v '"eval_loss"' "$1/metrics.jsonl" | sed -n 's|.*"loss":\([^,}]*\).*|\1|p'; }
HPCTRAIN_RUN_DIR="$work/bf16" "$gpt" "${small[@]}" --precision bf16 > bf16.log 2>&1 || log=bf16.log fail "bf16 exited $?"
HPCTRAIN_FLOAT8_EMULATED=1 HPCTRAIN_RUN_DIR="$work/float8" "$gpt" "${small[@]}" --precision bf16 --float8 \
  > float8.log 2>&1 || log=float8.log fail "float8 (emulated) exited $?"
paste <(losses bf16) <(losses float8) > losses.txt
[ "$(wc -l < losses.txt)" = 3 ] || fail "expected 3 train losses each: $(cat losses.txt)"
report=""
while read -r ours emulated; do
  [ "$ours" != "$emulated" ] || fail "float8's loss $emulated equals bf16's: the float8 products did not run"
  close "$emulated" "$ours" 0.0625 || fail "float8's loss $emulated is not within 2^-4 of bf16's $ours"
  report="$report $ours/$emulated ($(difference "$emulated" "$ours"))"
done < losses.txt
echo "emulated float8 against bf16, 3 steps (bf16/float8):$report"
