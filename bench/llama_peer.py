"""The transformers peer of the suite's Llama rows (bench/gpu_suite/llama_rows.hpp): transformers'
LlamaForCausalLM at the same shape (TinyLlama's 1.1B on CUDA, the suite's tiny CPU model otherwise), built
from a LlamaConfig (no download), SDPA attention, fp32 weights, the same random tokens, bf16 autocast, gradient
clipping and AdamW (fused on CUDA), every parameter training, no activation checkpointing; in eager mode or
under torch.compile. Prints one JSON line like the suite's rows; MFU with hpctrain's formula
(models/llama_config.hpp flops_per_token: 6 N + attention, N without the untied input embedding).

  llama_peer.py --mode eager|compile --device cuda --preset tinyllama --batch 8 --seq 1024 --steps 5 --warmup 2
  ... --profile trace.json   (then 3 more steps under torch.profiler, as a Chrome trace)

Works with transformers 4.x and 5.x (rope_theta becomes rope_parameters in 5; both read it).
"""
import argparse
import json
import resource
import time

import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

SHAPE = dict(max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
             attention_bias=False, mlp_bias=False)
PRESETS = {  # llama_rows.hpp model_config(true) and model_config(false)
    "tinyllama": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                      num_attention_heads=32, num_key_value_heads=4, **SHAPE),
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, **SHAPE),
}


def rope_theta(config):
    """transformers 4 keeps rope_theta on the config; 5 moves it into rope_parameters."""
    parameters = getattr(config, "rope_parameters", None)
    return parameters["rope_theta"] if isinstance(parameters, dict) and "rope_theta" in parameters else config.rope_theta


def flops_per_token(c, parameters, seq):
    """hpctrain's models::flops_per_token: 6 N + 12 layers heads head_dim seq, N without the input embedding
    when the head is untied."""
    embedding = 0 if c["tie_word_embeddings"] else c["vocab_size"] * c["hidden_size"]
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    return 6.0 * (parameters - embedding) + 12.0 * c["num_hidden_layers"] * c["num_attention_heads"] * head_dim * seq


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["eager", "compile"], default="eager")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tinyllama")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--profile", help="after the timed steps, profile 3 more and save a Chrome trace here")
    a = parser.parse_args()
    c = PRESETS[a.preset]
    seq = min(a.seq, c["max_position_embeddings"])
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    config = LlamaConfig(**c, use_cache=False)
    assert rope_theta(config) == c["rope_theta"], "rope_theta did not reach the config"
    torch.manual_seed(0)
    # The attention implementation through _from_config: the same call in transformers 4 and 5.
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    assert model.config._attn_implementation == "sdpa" and model.dtype == torch.float32
    parameters = sum(p.numel() for p in model.parameters())
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    model = model.to(device).train()
    params = list(model.parameters())
    # hpctrain's full row steps with a fused AdamW kernel on CUDA; on the CPU the default (foreach).
    optimizer = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0, **({"fused": True} if cuda else {}))
    forward = torch.compile(model) if a.mode == "compile" else model
    torch.manual_seed(2)
    tokens = torch.randint(c["vocab_size"], (a.batch, seq + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = forward(input_ids=inputs, use_cache=False).logits
            loss = F.cross_entropy(logits.float().view(-1, c["vocab_size"]), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        return loss

    for _ in range(a.warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens_per_s = a.batch * seq * a.steps / seconds
    # CUDA: the allocator's peak since the move to the device; CPU: the process's peak RSS (Linux: KiB).
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    flops = flops_per_token(c, parameters, seq)
    print(json.dumps({"impl": f"transformers-{a.mode}", "device": a.device, "preset": a.preset, "batch": a.batch, "seq": seq,
                      "steps": a.steps, "tokens_per_s": round(tokens_per_s, 1), "ms_per_step": round(1e3 * seconds / a.steps, 2),
                      "flops_per_token": flops, "mfu": round(tokens_per_s * flops / (a.peak_tflops * 1e12), 4),
                      "peak_bytes": peak, "loss": round(loss.item(), 4), "parameters": parameters,
                      "transformers": transformers.__version__}))
    if a.profile:
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        with torch.profiler.profile(activities=activities) as profiler:
            for _ in range(3):
                step()
            if cuda:
                torch.cuda.synchronize()
        profiler.export_chrome_trace(a.profile)


if __name__ == "__main__":
    main()
