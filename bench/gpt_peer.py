"""The Python side of examples/gpt.cpp: the same GPT-2 written in plain PyTorch (nanoGPT's shape, transformers'
parameter names), the same data (hpctrain token files, the same windows and the same per-epoch permutation as
hpctrain's DistributedSampler), the same AdamW with weight-decay groups, warmup + cosine schedule and gradient
clipping. Two uses:

  gpt_peer.py reference --init DIR --tokens FILE [...]   (tests/models: the loss-curve oracle) one process,
      starting from the step-0 weights in DIR (examples/gpt's export: tests/lm/loss_curve.py), prints a JSON line
      {"losses": [...]} with the mean training loss of each step over the whole global batch.
  torchrun --nproc-per-node 2 gpt_peer.py ddp --tokens FILE [...]   (bench/gpt_vs_torchrun) DDP over Gloo,
      rank 0 prints a JSON line with tokens/s of the timed steps. With --init DIR it starts from those weights,
      with --val FILE it ends with the validation loss over every window of FILE, as hpctrain evaluates
      (bench/gpt_budget).
"""
import argparse
import functools
import json
import math
import os
import struct
import time

import numpy as np
import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln_1 = torch.nn.LayerNorm(d, eps=1e-5)
        self.c_attn = torch.nn.Linear(d, 3 * d)
        self.attn_proj = torch.nn.Linear(d, d)
        self.ln_2 = torch.nn.LayerNorm(d, eps=1e-5)
        self.c_fc = torch.nn.Linear(d, 4 * d)
        self.mlp_proj = torch.nn.Linear(4 * d, d)
        self.drop = torch.nn.Dropout(dropout)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        x = x + self.drop(self.attn_proj(y.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))


class GPT(torch.nn.Module):
    def __init__(self, vocab, positions, d, layers, heads, dropout=0.0):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, d)
        self.wpe = torch.nn.Embedding(positions, d)
        self.drop = torch.nn.Dropout(dropout)
        self.h = torch.nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(d, eps=1e-5)
        # GPT-2's initialisation, as models/gpt2.hpp: N(0, 0.02), residual projections / sqrt(2 * layers).
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                torch.nn.init.zeros_(p)
            elif "ln_" in name:
                torch.nn.init.ones_(p)
            else:
                torch.nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if name.endswith("_proj.weight") else 0.02)

    def forward(self, ids):
        x = self.drop(self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device)))
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied head

    def load_hf(self, directory):
        """The weights of a transformers GPT-2 directory (Conv1D weights stored transposed)."""
        from safetensors.torch import load_file
        hf = load_file(os.path.join(directory, "model.safetensors"))
        renames = {".attn.c_attn.": ".c_attn.", ".attn.c_proj.": ".attn_proj.", ".mlp.c_fc.": ".c_fc.", ".mlp.c_proj.": ".mlp_proj."}
        ours = {}
        for name, tensor in hf.items():
            if name == "lm_head.weight" or name.endswith(".attn.bias") or name.endswith(".attn.masked_bias"):
                continue
            key = name.removeprefix("transformer.")
            conv1d = key.endswith(".weight") and any(part in key for part in renames)
            for old, new in renames.items():
                key = key.replace(old, new)
            ours[key] = tensor.t().contiguous() if conv1d else tensor
        self.load_state_dict(ours, strict=True)


def read_tokens(path):
    """An hpctrain token file (text/token_file.hpp): 64-byte header, then little-endian uint16 or uint32 ids."""
    with open(path, "rb") as f:
        header = f.read(64)
        assert header[:8] == b"HPCTOKEN", f"{path}: not an hpctrain token file"
        width, count = struct.unpack_from("<IQ", header, 12)
        ids = np.frombuffer(f.read(), dtype=np.uint16 if width == 2 else np.uint32, count=count)
    return torch.from_numpy(ids.astype(np.int64))


@functools.lru_cache(maxsize=2)
def epoch_order(size, seed, epoch):
    """hpctrain's DistributedSampler permutation of (seed, epoch): randperm from its own CPU generator."""
    generator = torch.Generator().manual_seed((seed + 0x9E3779B97F4A7C15 * (epoch + 1)) % 2**64)
    return torch.randperm(size, generator=generator)


def rank_batch(tokens, seq_len, seed, step, per_rank, world, rank):
    """Rank `rank`'s windows of optimizer step `step`: the sampler deals the permutation round-robin."""
    size = (tokens.numel() - 1) // seq_len
    steps_per_epoch = (size // world) // per_rank
    epoch, within = divmod(step, steps_per_epoch)
    order = epoch_order(size, seed, epoch)[: (size // world) * world].view(-1, world)[:, rank]
    starts = order[within * per_rank:(within + 1) * per_rank] * seq_len
    window = starts[:, None] + torch.arange(seq_len + 1)
    chunk = tokens[window]
    return chunk[:, :-1], chunk[:, 1:]


def lr_factor(step, total, warmup, final_fraction):
    """hpctrain's LrSchedule::warmup_cosine."""
    if step < warmup:
        return (step + 1) / warmup
    if total - warmup <= 0:
        return 1.0
    progress = min(1.0, (step - warmup) / (total - warmup))
    return final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress))


def adamw(model, lr, weight_decay):
    """AdamW over the two groups of hpctrain::weight_decay_groups: matrices decay; biases and norms do not."""
    named = list(model.named_parameters())
    decayed = [p for n, p in named if p.dim() >= 2 and not n.endswith("bias")]
    other = [p for n, p in named if not (p.dim() >= 2 and not n.endswith("bias"))]
    groups = [{"params": decayed, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def add_common(parser):
    parser.add_argument("--tokens", required=True)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--warmup-steps", type=int, default=30)
    parser.add_argument("--min-lr-fraction", type=float, default=0.1)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--pad-vocab-to", type=int, default=64,
                        help="round the vocabulary up to a multiple of this, as examples/gpt's knob (default 64)")


def reference(args):
    """One process, the whole global batch: at any world size hpctrain's mean loss and averaged gradient
    are this batch's (equal per-rank batches)."""
    torch.set_num_threads(1)
    tokens = read_tokens(args.tokens)
    model = GPT(model_vocab(args), args.seq_len, args.n_embd, args.n_layer, args.n_head)
    model.load_hf(args.init)
    optimizer = adamw(model, args.lr, args.weight_decay)
    per_rank = args.global_batch // args.world
    losses = []
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = args.lr * lr_factor(step, args.total_steps or args.steps, args.warmup_steps, args.min_lr_fraction)
        parts = [rank_batch(tokens, args.seq_len, args.seed, step, per_rank, args.world, r) for r in range(args.world)]
        inputs, targets = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        optimizer.zero_grad()
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        losses.append(loss.item())
    print(json.dumps({"losses": losses}), flush=True)


def read_vocab(path):
    with open(path, "rb") as f:
        return struct.unpack_from("<Q", f.read(64), 24)[0]


def model_vocab(args):
    """The model's vocabulary: the saved model's (its config.json) when starting from one, else the token
    file's rounded up as examples/gpt's --pad-vocab-to does."""
    if getattr(args, "init", None):
        with open(os.path.join(args.init, "config.json")) as f:
            return int(json.load(f)["vocab_size"])
    multiple = max(args.pad_vocab_to, 1)
    return (int(read_vocab(args.tokens)) + multiple - 1) // multiple * multiple


def ddp(args):
    """torchrun + DDP over Gloo: the example's training step (bf16 autocast when asked), timed."""
    import torch.distributed as dist
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tokens = read_tokens(args.tokens)
    torch.manual_seed(args.seed)
    model = GPT(model_vocab(args), args.seq_len, args.n_embd, args.n_layer, args.n_head)
    if args.init:
        model.load_hf(args.init)
    model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = adamw(model.module, args.lr, args.weight_decay)
    per_rank = args.global_batch // world
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")
    start = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            dist.barrier()
            start = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = args.lr * lr_factor(step, args.warmup + args.steps, args.warmup_steps, args.min_lr_fraction)
        inputs, targets = rank_batch(tokens, args.seq_len, args.seed, step, per_rank, world, rank)
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
    dist.barrier()
    seconds = time.perf_counter() - start
    result = {"side": "torchrun", "world": world, "steps": args.steps,
              "tokens_per_s": round(args.steps * args.global_batch * args.seq_len / seconds, 1),
              "last_loss": round(loss.item(), 4)}
    if args.val:
        result["val_loss"] = round(validation_loss(model.module, args.val, args.seq_len, autocast, rank, world), 4)
    if rank == 0:
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()


def validation_loss(model, path, seq_len, autocast, rank, world, batch=16):
    """hpctrain's evaluation (train/evaluation.hpp): every window of the file, dealt to the ranks strided,
    in batches of 16, the mean loss per target token over all ranks."""
    import torch.distributed as dist
    tokens = read_tokens(path)
    mine = list(range(rank, (tokens.numel() - 1) // seq_len, world))
    total = torch.zeros(2, dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        for begin in range(0, len(mine), batch):
            window = torch.tensor(mine[begin:begin + batch])[:, None] * seq_len + torch.arange(seq_len + 1)
            chunk = tokens[window]
            with autocast:
                logits = model(chunk[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), chunk[:, 1:].reshape(-1))
            total += torch.tensor([loss.item() * chunk[:, 1:].numel(), chunk[:, 1:].numel()], dtype=torch.float64)
    model.train()
    dist.all_reduce(total)
    return (total[0] / total[1]).item()


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    ref = sub.add_parser("reference")
    add_common(ref)
    ref.add_argument("--init", required=True, help="the step-0 weights: examples/gpt's fp32 export after one step at lr 1e-30")
    ref.add_argument("--world", type=int, default=1, help="the world size of the hpctrain run (data order)")
    ref.add_argument("--total-steps", type=int, default=0, help="the hpctrain run's step budget (default --steps)")
    par = sub.add_parser("ddp")
    add_common(par)
    par.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    par.add_argument("--threads", type=int, default=1)
    par.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    par.add_argument("--init", help="start from these weights (a Hugging Face directory: examples/gpt's fp32 export)")
    par.add_argument("--val", help="end with the validation loss over this token file")
    args = parser.parse_args()
    reference(args) if args.mode == "reference" else ddp(args)


if __name__ == "__main__":
    main()
