"""The Python side of examples/roberta.cpp: transformers' RobertaForMaskedLM fed the same blocks (hpctrain token
files grouped as lm::prepared_masked_blocks groups them: <s>, max_length - 2 tokens, </s>), in the same order
(hpctrain's DistributedSampler, gpt_peer.epoch_order), masked as lm::mask_tokens masks — its splitmix64 draw of
(seed, epoch, block, position, stream) written again here from the specification in lm/masked_lm.hpp — with the
same AdamW (β 0.9/0.98, ε 1e-6, weight-decay groups), warmup + linear decay and clipping. Two uses:

  tests/lm/roberta_loss_curve_test.py imports mask_block, rank_blocks and lr_factor (the loss-curve oracle);
  torchrun --nproc-per-node 2 roberta_peer.py ddp --tokens FILE --vocab V [...]   (bench/roberta_vs_torchrun)
      DDP over Gloo; rank 0 prints a JSON line with tokens/s of the timed steps. The blocks are masked before
      the clock starts (hpctrain masks in its prefetch thread, off the step's path; a Python user would mask in
      DataLoader workers), so both sides time the training step alone.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_peer import epoch_order, read_tokens  # noqa: E402

M64 = (1 << 64) - 1
BOS, PAD, EOS, MASK = 0, 1, 2, 4  # RoBERTa's ids in the tokenizer scripts/setup trains (and roberta-base's but <mask>)
SPECIAL = {0, 1, 2, 3, 4}


def mix(x):
    """splitmix64, as lm::detail::mix."""
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def uniform(seed, epoch, example, position, stream):
    h = mix(seed ^ 0x6D61736B6C6D)
    for v in (epoch, example, position, stream):
        h = mix(h ^ (v & M64))
    return (h >> 11) * 2.0 ** -53


def mask_block(ids, epoch, example, vocab, seed=0):
    """lm::mask_tokens with RoBERTa's defaults (15%; 80% <mask>, 10% random, 10% kept): (inputs, labels)."""
    inputs, labels = list(ids), [-100] * len(ids)
    for t, token in enumerate(ids):
        if token in SPECIAL or uniform(seed, epoch, example, t, 0) >= 0.15:
            continue
        labels[t] = token
        what = uniform(seed, epoch, example, t, 1)
        if what < 0.8:
            inputs[t] = MASK
        elif what < 0.9:
            attempt = 2
            while True:
                drawn = int(uniform(seed, epoch, example, t, attempt) * vocab)
                if drawn not in SPECIAL:
                    break
                attempt += 1
            inputs[t] = drawn
    return inputs, labels


def rank_blocks(tokens, length, vocab, seed, step, per_rank, world, rank):
    """Rank `rank`'s masked blocks of optimizer step `step`: (inputs, labels), each [per_rank, length]."""
    body = length - 2
    size = (tokens.numel() - 1) // body
    steps_per_epoch = (size // world) // per_rank
    epoch, within = divmod(step, steps_per_epoch)
    order = epoch_order(size, seed, epoch)[: (size // world) * world].view(-1, world)[:, rank]
    rows = [mask_block([BOS] + tokens[b * body:(b + 1) * body].tolist() + [EOS], epoch, b, vocab)
            for b in order[within * per_rank:(within + 1) * per_rank].tolist()]
    return torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows])


def lr_factor(step, total, warmup):
    """LrSchedule::warmup_linear(warmup) with final fraction 0."""
    if step < warmup:
        return (step + 1) / warmup
    if total - warmup <= 0:
        return 1.0
    return 1.0 - min(1.0, (step - warmup) / (total - warmup))


def adamw(model, lr, weight_decay):
    """AdamW over hpctrain::weight_decay_groups' two groups, with RoBERTa's betas and epsilon."""
    named = list(model.named_parameters())
    decayed = [p for n, p in named if p.dim() >= 2 and not n.endswith("bias")]
    other = [p for n, p in named if not (p.dim() >= 2 and not n.endswith("bias"))]
    return torch.optim.AdamW([{"params": decayed, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.98), eps=1e-6)


def model_like_the_example(vocab, args):
    """examples/roberta.cpp's model for these knobs, random, in transformers."""
    from transformers import RobertaConfig, RobertaForMaskedLM
    config = RobertaConfig(vocab_size=vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                           num_attention_heads=args.heads, intermediate_size=4 * args.hidden,
                           max_position_embeddings=args.max_length + PAD + 1, pad_token_id=PAD, bos_token_id=BOS,
                           eos_token_id=EOS, type_vocab_size=1, hidden_dropout_prob=args.dropout,
                           attention_probs_dropout_prob=args.dropout, layer_norm_eps=1e-5)
    return RobertaForMaskedLM(config)


def ddp(args):
    """torchrun + DDP over Gloo: the example's training step (bf16 autocast when asked), timed."""
    import torch.distributed as dist
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tokens = read_tokens(args.tokens)
    torch.manual_seed(args.seed)
    model = torch.nn.parallel.DistributedDataParallel(model_like_the_example(args.vocab, args))
    optimizer = adamw(model.module, args.lr, args.weight_decay)
    per_rank = args.global_batch // world
    total = args.warmup + args.steps
    batches = [rank_blocks(tokens, args.max_length, args.vocab, args.seed, step, per_rank, world, rank) for step in range(total)]
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")
    model.train()
    start = None
    for step, (inputs, labels) in enumerate(batches):
        if step == args.warmup:
            dist.barrier()
            start = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = args.lr * lr_factor(step, total, args.warmup_steps)
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = model(input_ids=inputs).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    dist.barrier()
    seconds = time.perf_counter() - start
    if rank == 0:
        print(json.dumps({"side": "torchrun", "world": world, "steps": args.steps,
                          "tokens_per_s": round(args.steps * args.global_batch * args.max_length / seconds, 1),
                          "last_loss": round(loss.item(), 4)}), flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["ddp"])
    parser.add_argument("--tokens", required=True)
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--warmup-steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ddp(parser.parse_args())


if __name__ == "__main__":
    main()
