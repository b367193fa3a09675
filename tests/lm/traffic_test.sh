#!/usr/bin/env bash
# Issue 54, item 10: the bytes a sharded step moves, counted at the collectives (dist/traffic.hpp: each collective's
# payload, the whole buffer it works on), against FSDP2's per-parameter formula. gpt --local 4 trains 2 steps in bf16
# (--precision bf16 stated: auto is fp32 on a CPU without AMX) and rank 0 prints the steps' share; P is the number
# of parameters in the export (read by safetensors, not by hpctrain). Per step:
#  - zero3, reduce dtype fp32: all-gathers 2 + 2 bytes a parameter (the blocks in bf16, in forward and again in
#    backward: resharded after forward; GPT-2's tied embedding, 89% of this model, is kept whole as ZeRO-2 keeps a
#    parameter outside the units, one fp32 all-gather after the step: 4 bytes, the same total) and reduce-scatters
#    4 (fp32): FSDP2's 2 + 2 + 4;
#  - zero3, reduce dtype bf16: the same gathers and a reduce-scatter of 2 bytes a parameter: FSDP2's 2 + 2 + 2;
#  - hsdp (2 groups of 2): the same within each group, and an all-reduce across the replicas of each rank's reduced
#    shard, P / 2 parameters in fp32: 2 bytes a parameter of the model.
# Bound: 2% of FSDP2's figure (each unit's flat is padded to a multiple of the group's ranks: a few elements a unit).
# Usage: traffic_test.sh <gpt binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
fail_tail=40
gpt="$(realpath "$1")"
transformers_test_setup traffic-test

# steps NAME ARGS...: gpt --local 4 ARGS in NAME/, two steps in bf16, nothing between them.
steps() {
  local name="$1" status=0
  shift
  HPCTRAIN_RUN_DIR="$work/$name" "$gpt" --local 4 --precision bf16 --max-steps 2 --eval-every 0 --checkpoint-every 0 \
    --max-eval-examples 8 "$@" > "$name.log" 2>&1 || status=$?
  [ "$status" = 0 ] || fail "$name exited $status"
  grep -q "^hpctrain: collectives per step on rank 0 over 2 steps:" "$name.log" || fail "$name: no collectives line"
}
# bytes NAME KIND: rank 0's payload of KIND per step.
bytes() { sed -n "s/^hpctrain: collectives per step.* $2=\([0-9]*\) bytes.*/\1/p" "$1.log"; }
# per_parameter NAME KIND EXPECTED: KIND's payload is EXPECTED bytes a parameter within 2%.
per_parameter() {
  local measured
  measured="$(bytes "$1" "$2")"
  [ -n "$measured" ] || fail "$1: no $2 in $(grep 'collectives per step' "$1.log")"
  awk -v m="$measured" -v p="$parameters" -v e="$3" 'BEGIN { d = m / p - e; if (d < 0) d = -d; exit !(d <= 0.02 * e) }' ||
    fail "$1: $2 moves $measured bytes a step: $(awk -v m="$measured" -v p="$parameters" 'BEGIN { printf "%.3f", m / p }') a parameter, FSDP2's formula says $3"
  report="$report $1 $2 $(awk -v m="$measured" -v p="$parameters" 'BEGIN { printf "%.3f", m / p }') (FSDP2 $3);"
}

steps zero3-fp32 --sharding zero3 --reduce-dtype fp32
parameters="$("$python" -c '
import glob, math, sys
from safetensors import safe_open
total = 0
for path in glob.glob(sys.argv[1] + "/export/*.safetensors"):
    with safe_open(path, "pt") as tensors:
        total += sum(math.prod(tensors.get_slice(name).get_shape()) for name in tensors.keys())
print(total)' "$work/zero3-fp32")"
[ -n "$parameters" ] && [ "$parameters" -gt 1000000 ] || fail "no parameter count from the export: '$parameters'"
steps zero3-bf16 --sharding zero3 --reduce-dtype bf16
steps hsdp --sharding hsdp --hsdp-group-size 2

report="bytes a parameter a step, P = $parameters:"
per_parameter zero3-fp32 all_gather 4
per_parameter zero3-fp32 reduce_scatter 4
per_parameter zero3-bf16 all_gather 4
per_parameter zero3-bf16 reduce_scatter 2
per_parameter hsdp all_gather 4
per_parameter hsdp reduce_scatter 4
# hsdp's all-reduces: the replicas' shards (2 bytes a parameter) and the step's few scalars (the loss's token count,
# the gradient norm): bytes, not a share of the model.
per_parameter hsdp all_reduce 2
echo "ok: $report"
