#!/usr/bin/env bash
# The export's peak host memory: sft --from a ~157M-parameter bf16 Llama made by transformers (14 layers of width
# 1024, MLP 2816, in shards with an index), one step under --sharding zero3 at --local 1, 2 and 4, then
# lm::hf_export. Prints each run's peak resident memory (VmHWM) on rank 0, which writes the export, and the highest
# of the other ranks — the Trainer's "run ended" line, and its "finish hooks" line: the peak during the export
# alone (VmHWM started again before it) — and the highest rank's by GNU time, beside the model's bytes in fp32 and bf16, and the peak
# once the model was ready (the load). With a second binary (an sft built before the streaming export), runs it
# the same way for the "before" column. Not a test: the figures depend on the machine and what else runs on it.
# Usage: [WORLDS="1 2 4"] [LAYERS=14] bench/export_memory.sh <sft binary> [<sft binary before>]
set -euo pipefail
sft="$(realpath "$1")"
before="${2:+$(realpath "$2")}"
here="$(cd "$(dirname "$0")/.." && pwd)"
python="${HPCTRAIN_PYTHON:-$HOME/.cache/hpctrain/venv/bin/python}"
work="$(mktemp -d /tmp/export-memory.XXXXXX)"
trap 'rm -rf "$work"' EXIT
cd "$work"
oracle() { "$python" "$here/tests/lm/sft_oracle.py" "$@"; }
oracle make "$work" /usr/share/games/fortunes > make.log 2>&1 || { cat make.log; exit 1; }
oracle make-sharded "$work" "${LAYERS:-14}" 1024 2816 > make-sharded.log 2>&1 || { cat make-sharded.log; exit 1; }
parameters="$(sed -n 's/^\([0-9]*\) parameters in bf16.*/\1/p' make-sharded.log)"
awk -v n="$parameters" 'BEGIN { printf "model: %d parameters, %.2f GiB in fp32, %.2f GiB in bf16\n", n, 4 * n / 2^30, 2 * n / 2^30 }'

measure() {  # measure LABEL BINARY WORLD
  local log="$1-$3.log"
  HPCTRAIN_MEASURE_FINISH_HOOKS=1 HPCTRAIN_RUN_DIR="$work/$1-$3" /usr/bin/time -f 'max_rss_kb=%M' "$2" --from sharded --data conversations.jsonl --local "$3" --sharding zero3 \
    --max-steps 1 --max-length 64 > "$log" 2>&1 || { printf '%-6s --local %d: failed (%s)\n' "$1" "$3" "$(grep -m1 -o 'exited with non-zero status [0-9]*\|Killed' "$log")"; return 0; }
  local ready ended hooks largest
  ready="$(sed -n 's/^hpctrain: model ready: peak host memory \([0-9.]*\) GiB.*/\1/p' "$log")"
  ended="$(sed -n 's/^hpctrain: run ended: peak host memory \(.*\)$/\1/p' "$log")"
  hooks="$(sed -n 's/^hpctrain: finish hooks: peak host memory \(.*\)$/\1/p' "$log")"
  # GNU time's maximum resident set size of a process with children is the largest of any one of them: the
  # highest rank's peak over the whole run (the launcher is small). A binary that prints "run ended" has reset its
  # ranks' peak before the finish hooks (HPCTRAIN_MEASURE_FINISH_HOOKS), which GNU time then sees: its own line says.
  largest="$(sed -n 's/^max_rss_kb=//p' "$log" | awk '{ printf "%.2f GiB for the highest rank", $1 / 2^20 }')"
  [ -z "$ended" ] || largest="$ended"
  printf '%-6s --local %d: model ready %s GiB a rank at most; whole run %s%s; export: %s\n' "$1" "$3" \
    "$ready" "$largest" "${hooks:+; the finish hooks (export) alone: $hooks}" \
    "$(ls "$work/$1-$3/export" | tr '\n' ' ')"
  rm -rf "${work:?}/$1-$3"
}
for world in ${WORLDS:-1 2 4}; do
  [ -z "$before" ] || measure before "$before" "$world"
  measure after "$sft" "$world"
done
