#!/usr/bin/env bash
# Where a step's GPU time goes, hpctrain beside its peers: Chrome traces of 3 steps each, summed side by side by
# bench/trace_summary.py into OUT/traces.md. Run after scripts/gpu-check on the same build, with the llama rows'
# traces already written there (HPCTRAIN_SUITE_TRACES=TRACES scripts/gpu-check ...: llama.full.json and the rest).
#   bench/gpu_traces.sh BUILD_DIR TRACES OUT
set -u
build=$1 traces=$2 out=$3
root=$(cd "$(dirname "$0")/.." && pwd)
python=${HPCTRAIN_PYTHON:-python3}
mkdir -p "$traces" "$out"
"$build/bench/hpctrain_model_bench" --steps 5 --warmup 5 --profile "$traces/gpt2.hpctrain.json" >>"$out/traces.log" 2>&1
"$python" "$root/bench/model_peer.py" --mode eager --steps 5 --warmup 5 --profile "$traces/gpt2.eager.json" >>"$out/traces.log" 2>&1
"$python" "$root/bench/llama_peer.py" --mode eager --steps 2 --warmup 2 --profile "$traces/llama.eager.json" >>"$out/traces.log" 2>&1
{
  echo "## GPT-2 124M, 16 x 1024, bf16"
  "$python" "$root/bench/trace_summary.py" --steps 3 hpctrain="$traces/gpt2.hpctrain.json" eager="$traces/gpt2.eager.json"
  echo
  echo "## Llama 1.1B (TinyLlama's shape), 8 x 1024, bf16"
  args=()
  for row in llama.full llama.full.selective llama.lora; do
    [ -f "$traces/$row.json" ] && args+=("$row=$traces/$row.json")
  done
  "$python" "$root/bench/trace_summary.py" --steps 3 "${args[@]}" eager="$traces/llama.eager.json"
} >"$out/traces.md" 2>>"$out/traces.log"
