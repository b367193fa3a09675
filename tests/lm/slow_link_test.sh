#!/usr/bin/env bash
# --plan's step time against a measured one, over a simulated slow link (HPCTRAIN_SIMULATED_LINK_GBPS: every rank's
# collectives cross one link of that bus bandwidth, one after another, and a wait sleeps until its collective has
# crossed: dist/simulated_link.hpp). sft under zero3 in fp32 (stated: the plan's bytes are the fp32 gathers) on a
# small Llama made by transformers, at --local 2 and 4, each:
#  - without the link (the faster of a run before and one after the slow one): the median step's seconds give the TFLOP/s this CPU reaches at that world on the plan's own
#    FLOPs (--plan with HPCTRAIN_PLAN_CPU_TFLOPS=1 prints the compute's seconds at 1 TFLOP/s): the plan's compute is
#    then the measured step's, whatever the CPU;
#  - the link is set so that the plan's communication is 1.5 times that compute: a step that overlapped nothing would
#    take compute + communication, 2.5 times the compute, one that overlapped everything 1.5 times;
#  - with the link: the median step's seconds within 20% of --plan's step time at that link and TFLOP/s (the
#    issue's bound: what the plan is for is choosing between settings whose steps differ by more).
# A timing test, so it runs alone (RUN_SERIAL): a test beside it would slow one run and not the other. Measured on the
# 2-core Intel Xeon: measured/planned 0.93 at --local 2, 0.90 at 4 (a step that overlapped nothing: 1.53 and 1.57).
# Usage: slow_link_test.sh <sft binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
fail_tail=30
sft="$(realpath "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
transformers_test_setup slow-link-test
"$python" "$here/sft_oracle.py" make "$work" "$fortunes" > make.log 2>&1 || fail "the oracle could not make the tokenizer and data"
"$python" "$here/sft_oracle.py" make-sharded "$work" 4 256 688 > make-sharded.log 2>&1 ||
  fail "the oracle could not make the model"
steps=8
micro_batch=4
length=128

# train NAME WORLD [VARIABLE=VALUE...]: zero3 in fp32, a train record every step; prints the median step's seconds
# (steps 3 to the last: the first two build the kernels' caches).
train() {
  local name="$1" world="$2"
  shift 2
  env "$@" HPCTRAIN_RUN_DIR="$work/$name" "$sft" --from sharded --data conversations.jsonl --local "$world" \
    --sharding zero3 --precision fp32 --max-steps "$steps" --max-length "$length" --batch-size "$((micro_batch * world))" \
    --log-every 1 --eval-every 0 --checkpoint-every 0 > "$name.log" 2>&1 || log="$name.log" fail "$name: sft exited $?"
  python3 - "$work/$name/metrics.jsonl" "$((micro_batch * world))" <<'PY'
import json, statistics, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "samples_per_s" in r]
seconds = [int(sys.argv[2]) / r["samples_per_s"] for r in sorted(rows, key=lambda r: r["step"])][2:]
print(f"{statistics.median(seconds):.6f}")
PY
}
# plan WORLD [VARIABLE=VALUE...]: --plan's step-time line for WORLD ranks on one node.
plan() {
  local world="$1"
  shift
  env "$@" "$sft" --from sharded --plan --nodes 1 --tasks-per-node "$world" --sharding zero3 --precision fp32 \
    --max-length "$length" --batch-size "$((micro_batch * world))" > "plan-$world.log" 2>&1 || true
  grep -m1 ' s a micro-batch of ' "plan-$world.log" || log="plan-$world.log" fail "--plan at $world ranks printed no step time"
}
field() { sed -n "s/.*$1 \([0-9.e+-]*\) s.*/\1/p"; }  # field NAME: the seconds after NAME in a plan's line

for world in 2 4; do
  first="$(train "fast-$world" "$world")"
  at_one="$(plan "$world" HPCTRAIN_PLAN_CPU_TFLOPS=1 HPCTRAIN_SIMULATED_LINK_GBPS=1)"
  gbps="$(awk -v m="$(field communication <<< "$at_one")" -v t="$first" 'BEGIN { printf "%.6g", m / (1.5 * t) }')"
  slow="$(train "slow-$world" "$world" HPCTRAIN_SIMULATED_LINK_GBPS="$gbps")"
  again="$(train "fast-again-$world" "$world")"
  measured="$(awk -v a="$first" -v b="$again" 'BEGIN { print (b < a ? b : a) }')"
  tflops="$(awk -v c="$(field compute <<< "$at_one")" -v t="$measured" 'BEGIN { printf "%.6g", c / t }')"
  planned_line="$(plan "$world" HPCTRAIN_PLAN_CPU_TFLOPS="$tflops" HPCTRAIN_SIMULATED_LINK_GBPS="$gbps")"
  planned="$(sed -n 's/^ *\([0-9.e+-]*\) s a micro-batch.*/\1/p' <<< "$planned_line")"
  echo "--local $world: a step ${first} and ${again} s without the link; at ${gbps} GB/s planned ${planned} s ($planned_line), measured ${slow} s"
  awk -v p="$planned" -v m="$slow" 'BEGIN { d = (m - p) / p; if (d < 0) d = -d; printf "  measured/planned %.3f\n", m / p; exit !(d <= 0.2) }' ||
    fail "--local $world: the step over the simulated link took $slow s, the plan says $planned s (bound 20%)"
done
echo "PASS"
