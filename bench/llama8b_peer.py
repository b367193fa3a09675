"""The PEFT peers of the suite's llama8b rows (bench/gpu_suite/llama8b_rows.hpp): transformers' LlamaForCausalLM at
Llama 3.1 8B's shape (the public config: 32 layers, width 4096, SwiGLU 14336, 32 heads over 8 KV heads, vocabulary
128,256, rope_theta 500000 with Llama 3.1's "llama3" rope scaling, rms_norm_eps 1e-5, an untied head) built from
its config in bf16 on the device (random weights: no download), PEFT LoRA r 16, alpha 32, no dropout on every
projection (q, k, v, o, gate, up, down), the adapters in fp32 (get_peft_model's autocast_adapter_dtype), SDPA
attention, gradient checkpointing as TRL's SFTTrainer sets it (use_reentrant False), bf16 autocast, clipping at 1
and AdamW (fused on CUDA) over the adapters; packed rows: the suite's random tokens, each row several examples
whose position_ids restart at 0 (transformers then keeps attention inside each example, masking_utils'
find_packed_sequence_indices) and whose first token is no target (-100, as TRL's padding-free collator marks it).
Modes: eager; liger (Liger's RMSNorm, rotary, SwiGLU and fused linear cross entropy, apply_liger_kernel_to_llama
before the model is built); compile (torch.compile of the PEFT model, as the Trainer's torch_compile does).

Prints one JSON line: the figures, or {"skip": reason} where the mode cannot run here (Liger not importable or no
CUDA). MFU with hpctrain's formula (models/llama_config.hpp flops_per_token: 6 N + attention, N the base model's
parameters without the untied input embedding) counted alike for every row: for LoRA the backward skips the frozen
weights' gradient products, which full recomputation's second forward makes up (docs/gpu.md).

  llama8b_peer.py --mode eager|liger|compile --device cuda --preset llama3.1-8b --batch 8 --seq 2048 --steps 4 --warmup 2
"""
import argparse
import json
import math
import resource
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

# Llama 3.1 8B's config.json, the fields that shape the model and its math.
ROPE_SCALING = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192)
SHAPE = dict(max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=ROPE_SCALING,
             tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
PRESETS = {  # llama8b_rows.hpp model_config(true) and model_config(false)
    "llama3.1-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, bos_token_id=128000, eos_token_id=128001,
                        **SHAPE),
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, **SHAPE),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Each packed row's examples, in sixteenths of the row, rotated by the row's index (llama8b_rows.hpp example_lengths).
PATTERN = [5, 3, 6, 2]


def example_lengths(seq, row):
    shift = row % len(PATTERN)
    return [seq * part // 16 for part in PATTERN[shift:] + PATTERN[:shift]]


def packed_batch(vocab, batch, seq, device):
    """Random tokens (the suite's: seed 2, drawn on the device), position_ids restarting per example, and labels: the
    tokens with each example's first one ignored, so that transformers' shift (labels[t + 1] is token t's target)
    never crosses from one example into the next."""
    torch.manual_seed(2)
    tokens = torch.randint(vocab, (batch, seq), device=device)
    positions = torch.cat([torch.cat([torch.arange(n) for n in example_lengths(seq, r)]).unsqueeze(0)
                           for r in range(batch)]).to(device)
    labels = tokens.masked_fill(positions == 0, -100)
    return tokens, positions, labels


def llama3_inv_freq(c):
    """The rotary frequencies Llama 3.1's scaling gives (transformers' _compute_llama3_parameters), to check that the
    config reached the model."""
    dim = c["hidden_size"] // c["num_attention_heads"]
    base = 1.0 / (c["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    s = c["rope_scaling"]
    low_wavelen = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wavelen = s["original_max_position_embeddings"] / s["high_freq_factor"]
    wavelen = 2 * math.pi / base
    scaled = torch.where(wavelen > low_wavelen, base / s["factor"], base)
    smooth = (s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"]) / (
        s["high_freq_factor"] - s["low_freq_factor"])
    smoothed = (1 - smooth) / s["factor"] * scaled + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def flops_per_token(c, parameters, seq):
    """hpctrain's models::flops_per_token: 6 N + 12 layers heads head_dim seq, N without the input embedding when the
    head is untied."""
    embedding = 0 if c["tie_word_embeddings"] else c["vocab_size"] * c["hidden_size"]
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    return 6.0 * (parameters - embedding) + 12.0 * c["num_hidden_layers"] * c["num_attention_heads"] * head_dim * seq


def skip(reason):
    print(json.dumps({"skip": reason}), flush=True)


def build(c, device):
    """LlamaForCausalLM from its config in bf16, built on the device (transformers' _init_weights there: N(0, 0.02),
    the norms 1), SDPA attention."""
    config = LlamaConfig(**c, use_cache=False)
    with torch.device(device):
        try:  # transformers 5 (and 4.56+) name it dtype, before them torch_dtype
            model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.bfloat16)
        except TypeError:
            model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", torch_dtype=torch.bfloat16)
    model = model.to(device)  # a no-op where the context reached the constructor
    assert model.config._attn_implementation == "sdpa" and model.dtype == torch.bfloat16
    inv_freq = model.model.rotary_emb.inv_freq.float().cpu()
    assert torch.allclose(inv_freq, llama3_inv_freq(c), rtol=1e-5), "the llama3 rope scaling did not reach the model"
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["eager", "liger", "compile"], default="eager")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="llama3.1-8b")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    a = parser.parse_args()
    assert a.seq % 16 == 0, "--seq: a multiple of 16 (the packed rows' examples are sixteenths of it)"
    c = PRESETS[a.preset]
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    if a.mode == "liger":
        if not cuda:
            return skip("Liger's kernels are Triton's: CUDA only")
        try:
            import liger_kernel
            from liger_kernel.transformers import apply_liger_kernel_to_llama
        except Exception as error:  # ImportError, or Triton failing at import
            return skip(f"liger_kernel not importable: {type(error).__name__}: {error}")
        # Before the model is built: its classes (RMSNorm, SwiGLU MLP), rotary and LlamaForCausalLM.forward (the fused
        # linear cross entropy: no logits in memory) are patched in transformers' module.
        apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                    fused_linear_cross_entropy=True)
    import peft

    started = time.perf_counter()
    torch.manual_seed(0)
    model = build(c, device)
    parameters = sum(p.numel() for p in model.parameters())  # the base model's: what 6 N counts
    # TRL's SFTTrainer: gradient checkpointing on, non-reentrant (no enable_input_require_grads needed), then PEFT.
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS, bias="none",
                           task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, lora)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    adapter_dtypes = sorted({str(p.dtype).replace("torch.", "") for p in trainable})
    frozen_dtypes = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters() if not p.requires_grad})
    optimizer = torch.optim.AdamW(trainable, lr=a.lr, weight_decay=0.0, **({"fused": True} if cuda else {}))
    forward = torch.compile(model) if a.mode == "compile" else model
    inputs, positions, labels = packed_batch(c["vocab_size"], a.batch, a.seq, device)
    build_s = time.perf_counter() - started

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = forward(input_ids=inputs, position_ids=positions, labels=labels, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        return loss

    # The peak from here: the model in place (its bf16 base, the fp32 adapters), then the optimizer state, the
    # activations and the head's logits of the steps, as the C++ rows count theirs after their strategy's setup.
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    warmup_started = time.perf_counter()
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
    tokens_per_s = a.batch * a.seq * a.steps / seconds
    # CUDA: the allocator's peak since the reset; CPU: the process's peak RSS (Linux: KiB).
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    flops = flops_per_token(c, parameters, a.seq)
    figures = {"impl": f"peft-{a.mode}", "device": a.device, "preset": a.preset, "batch": a.batch, "seq": a.seq,
               "steps": a.steps, "warmup": a.warmup, "tokens_per_s": round(tokens_per_s, 1),
               "ms_per_step": round(1e3 * seconds / a.steps, 2), "flops_per_token": flops,
               "mfu": round(tokens_per_s * flops / (a.peak_tflops * 1e12), 4), "peak_bytes": peak,
               "loss": round(loss.item(), 4), "parameters": parameters,
               "trainable_parameters": sum(p.numel() for p in trainable), "adapter_dtype": ",".join(adapter_dtypes),
               "base_dtype": ",".join(frozen_dtypes), "build_s": round(build_s, 1),
               "warmup_s": round(start - warmup_started, 1), "transformers": transformers.__version__,
               "peft": peft.__version__, "torch": torch.__version__}
    if a.mode == "liger":
        figures["liger_kernel"] = getattr(liger_kernel, "__version__", None) or _distribution_version("liger-kernel")
    print(json.dumps(figures), flush=True)


def _distribution_version(name):
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
