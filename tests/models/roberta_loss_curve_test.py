#!/usr/bin/env python3
"""The loss-curve oracle of issue 19: the first 20 training losses of examples/roberta (fp32, CPU, --local 2, no
dropout) equal those of a PyTorch loop over transformers' RobertaForMaskedLM started from the same step-0 weights
(the example writes them with --save-initial), fed the same blocks in the same order with the same masks, with
the same AdamW groups (β 0.9/0.98, ε 1e-6), warmup + linear decay and clipping, within 1e-4 relative.

The masks are drawn here from the specification in lm/masked_lm.hpp — a splitmix64 hash of (seed, epoch,
block, position, stream), 15% of the non-special tokens, 80% <mask>, 10% random, 10% kept — written again in
Python, not read from hpctrain; the block order is the DistributedSampler's (bench/gpt_peer.py's epoch_order).

  roberta_loss_curve_test.py BUILD/examples/roberta   (python: the venv's, with torch and transformers)
Exit 0 when every loss agrees, 1 otherwise (with the table), 77 (skip) when the corpus or the tokenizer is absent."""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
sys.path.insert(0, HERE)
from loss_curve import compare, run_example, training_losses  # noqa: E402
STEPS, WORLD, TOLERANCE = 20, 2, 1e-4
SEED, GLOBAL_BATCH, LR, WEIGHT_DECAY, WARMUP, LENGTH = 1, 16, 2e-3, 0.01, 5, 64
TOKENIZER = os.path.expanduser("~/.cache/hpctrain/roberta-fortunes/tokenizer.json")
M64 = (1 << 64) - 1


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


def mask_block(ids, epoch, example, mask_id, vocab, special, seed=0):
    """lm::mask_tokens with RoBERTa's defaults: (inputs, labels)."""
    inputs, labels = list(ids), [-100] * len(ids)
    for t, token in enumerate(ids):
        if token in special or uniform(seed, epoch, example, t, 0) >= 0.15:
            continue
        labels[t] = token
        what = uniform(seed, epoch, example, t, 1)
        if what < 0.8:
            inputs[t] = mask_id
        elif what < 0.9:
            attempt = 2
            while True:
                drawn = int(uniform(seed, epoch, example, t, attempt) * vocab)
                if drawn not in special:
                    break
                attempt += 1
            inputs[t] = drawn
    return inputs, labels


def lr_factor(step, total, warmup):
    """LrSchedule::warmup_linear(warmup) with final fraction 0."""
    if step < warmup:
        return (step + 1) / warmup
    if total - warmup <= 0:
        return 1.0
    return 1.0 - min(1.0, (step - warmup) / (total - warmup))


def reference(initial, tokens_path):
    import torch
    import torch.nn.functional as F
    from gpt_peer import epoch_order, read_tokens
    from transformers import RobertaForMaskedLM

    torch.set_num_threads(1)
    tokens = read_tokens(tokens_path)
    body = LENGTH - 2
    size = (tokens.numel() - 1) // body
    model = RobertaForMaskedLM.from_pretrained(initial, attn_implementation="eager").train()
    named = list(model.named_parameters())
    decayed = [p for n, p in named if p.dim() >= 2 and not n.endswith("bias")]
    other = [p for n, p in named if not (p.dim() >= 2 and not n.endswith("bias"))]
    optimizer = torch.optim.AdamW([{"params": decayed, "weight_decay": WEIGHT_DECAY}, {"params": other, "weight_decay": 0.0}],
                                  lr=LR, betas=(0.9, 0.98), eps=1e-6)
    special, mask_id, vocab = {0, 1, 2, 3, 4}, 4, model.config.vocab_size
    per_rank = GLOBAL_BATCH // WORLD
    steps_per_epoch = (size // WORLD) // per_rank
    losses = []
    for step in range(STEPS):
        for group in optimizer.param_groups:
            group["lr"] = LR * lr_factor(step, STEPS, WARMUP)
        epoch, within = divmod(step, steps_per_epoch)
        order = epoch_order(size, SEED, epoch)[: (size // WORLD) * WORLD].view(-1, WORLD)
        optimizer.zero_grad()
        rank_losses = []
        for rank in range(WORLD):  # each rank's mean over its own masked tokens; DDP averages the gradients
            blocks = order[within * per_rank:(within + 1) * per_rank, rank].tolist()
            rows = [mask_block([0] + tokens[b * body:(b + 1) * body].tolist() + [2], epoch, b, mask_id, vocab, special) for b in blocks]
            inputs = torch.tensor([r[0] for r in rows])
            labels = torch.tensor([r[1] for r in rows])
            logits = model(input_ids=inputs).logits
            rank_losses.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100))
        loss = sum(rank_losses) / WORLD
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses


def main():
    binary = os.path.abspath(sys.argv[1])
    if not os.path.isdir("/usr/share/games/fortunes") or not os.path.isfile(TOKENIZER):
        print(f"skip: needs Debian's fortunes and {TOKENIZER} (scripts/setup)")
        return 77
    work = tempfile.mkdtemp(prefix="roberta-loss-curve-")
    run_dir = os.path.join(work, "run")
    command = [binary, "--local", str(WORLD), "--max-steps", str(STEPS), "--lr", str(LR), "--precision", "fp32", "--log-every", "1",
               "--eval-every", "0", "--checkpoint-every", "0", "--save-initial", "--dropout", "0",
               "--layers", "2", "--hidden", "64", "--heads", "2", "--max-length", str(LENGTH), "--warmup-steps", str(WARMUP)]
    if not run_example(command, work, run_dir):
        return 1
    ours = training_losses(run_dir, STEPS)
    tokens = os.path.join(work, "hpctrain-jobs", "roberta", "local", "prepare", "tokens", "train.tokens")
    theirs = reference(os.path.join(run_dir, "initial"), tokens)

    return compare(ours, theirs, TOLERANCE)


if __name__ == "__main__":
    sys.exit(main())
