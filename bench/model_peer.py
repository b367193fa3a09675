"""The PyTorch peer of hpctrain_model_bench: the same GPT-2 (nanoGPT's shape: pre-LayerNorm, GELU tanh,
tied head, SDPA causal attention), the same random tokens, AdamW, bf16 autocast, gradient clipping, in
eager mode or under torch.compile. Prints one JSON line like the C++ bench.

  model_peer.py --mode eager|compile --device cuda --preset gpt2 --batch 16 --seq 1024 --steps 30 --warmup 10
  ... --profile trace.json   (then 3 more steps under torch.profiler, as a Chrome trace)
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import gpt2_flops

PRESETS = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50304),
    "tiny": dict(n_layer=2, n_head=4, n_embd=128, n_positions=256, vocab_size=1024),
}


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["n_embd"]
        self.n_head = c["n_head"]
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.attn_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (y.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = nn.Embedding(c["n_positions"], c["n_embd"])
        self.h = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(c["n_embd"])
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * c["n_layer"]) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["eager", "compile"], default="eager")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="gpt2")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--vocab", type=int, help="vocabulary size instead of the preset's (GPT-2's BPE: 50257, unpadded)")
    parser.add_argument("--profile", help="after the timed steps, profile 3 more and save a Chrome trace here")
    a = parser.parse_args()
    c = dict(PRESETS[a.preset], **({"vocab_size": a.vocab} if a.vocab else {}))
    seq = min(a.seq, c["n_positions"])
    torch.manual_seed(0)
    device = torch.device(a.device)
    model = GPT(c).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    forward = torch.compile(model) if a.mode == "compile" else model
    tokens = torch.randint(c["vocab_size"], (a.batch, seq + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            logits = forward(inputs)
            loss = F.cross_entropy(logits.reshape(-1, c["vocab_size"]).float(), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss

    for _ in range(a.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens_per_s = a.batch * seq * a.steps / seconds
    flops = gpt2_flops.flops_per_token(c["vocab_size"], c["n_layer"], c["n_embd"], seq)
    print(json.dumps({"impl": f"pytorch-{a.mode}", "device": a.device, "preset": a.preset, "vocab": c["vocab_size"], "batch": a.batch, "seq": seq,
                      "steps": a.steps, "precision": a.precision, "tokens_per_s": round(tokens_per_s, 1),
                      "ms_per_step": round(1e3 * seconds / a.steps, 2), "flops_per_token": flops,
                      "mfu": round(tokens_per_s * flops / (a.peak_tflops * 1e12), 4), "loss": round(loss.item(), 4)}))
    if a.profile:
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with torch.profiler.profile(activities=activities) as profiler:
            for _ in range(3):
                step()
            if device.type == "cuda":
                torch.cuda.synchronize()
        profiler.export_chrome_trace(a.profile)


if __name__ == "__main__":
    main()
