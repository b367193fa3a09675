#!/usr/bin/env python3
"""The loss-curve oracle of issue 19: the first 20 training losses of examples/roberta (fp32, CPU, --local 2, no
dropout) equal those of a PyTorch loop over transformers' RobertaForMaskedLM started from the same step-0 weights
(the example's own export after a step at lr 1e-30: loss_curve.py), fed the same blocks in the same order with the same masks, with
the same AdamW groups (β 0.9/0.98, ε 1e-6), warmup + linear decay and clipping, within 1e-4 relative.

The masks are drawn from the specification in lm/masked_lm.hpp — a splitmix64 hash of (seed, epoch, block,
position, stream), 15% of the non-special tokens, 80% <mask>, 10% random, 10% kept — written again in Python
(bench/roberta_peer.py), not read from hpctrain; the block order is the DistributedSampler's.

  roberta_loss_curve_test.py BUILD/examples/roberta   (python: the venv's, with torch and transformers)
Exit 0 when every loss agrees, 1 otherwise (with the table), 77 (skip) when the corpus or the tokenizer is absent."""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
sys.path.insert(0, HERE)
from loss_curve import compare, initial_weights, run_example, training_losses  # noqa: E402

STEPS, WORLD, TOLERANCE = 20, 2, 1e-4
SEED, GLOBAL_BATCH, LR, WEIGHT_DECAY, WARMUP, LENGTH = 1, 16, 2e-3, 0.01, 5, 64
TOKENIZER = os.path.expanduser("~/.cache/hpctrain/roberta-fortunes/tokenizer.json")


def reference(initial, tokens_path):
    import torch
    import torch.nn.functional as F
    from gpt_peer import read_tokens
    from roberta_peer import adamw, lr_factor, rank_blocks
    from transformers import RobertaForMaskedLM

    torch.set_num_threads(1)
    tokens = read_tokens(tokens_path)
    model = RobertaForMaskedLM.from_pretrained(initial, attn_implementation="eager").train()
    optimizer = adamw(model, LR, WEIGHT_DECAY)
    per_rank = GLOBAL_BATCH // WORLD
    losses = []
    for step in range(STEPS):
        for group in optimizer.param_groups:
            group["lr"] = LR * lr_factor(step, STEPS, WARMUP)
        optimizer.zero_grad()
        rank_sums, masked = [], 0
        for rank in range(WORLD):  # the mean over every masked token of the global batch (num_items_in_batch)
            inputs, labels = rank_blocks(tokens, LENGTH, model.config.vocab_size, SEED, step, per_rank, WORLD, rank)
            logits = model(input_ids=inputs).logits
            rank_sums.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100,
                                             reduction="sum"))
            masked += int((labels != -100).sum())
        loss = sum(rank_sums) / masked
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
    command = [binary, "--local", str(WORLD), "--precision", "fp32", "--log-every", "1",
               "--eval-every", "0", "--checkpoint-every", "0", "--dropout", "0",
               "--layers", "2", "--hidden", "64", "--heads", "2", "--max-length", str(LENGTH), "--warmup-steps", str(WARMUP)]
    initial = initial_weights(command, work)
    if initial is None or not run_example(command + ["--max-steps", str(STEPS), "--lr", str(LR)], work, run_dir):
        return 1
    ours = training_losses(run_dir, STEPS)
    tokens = os.path.join(work, "hpctrain-jobs", "roberta", "local", "prepare", "tokens", "train.tokens")
    theirs = reference(initial, tokens)

    return compare(ours, theirs, TOLERANCE)


if __name__ == "__main__":
    sys.exit(main())
