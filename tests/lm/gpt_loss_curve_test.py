#!/usr/bin/env python3
"""The loss-curve oracle of issue 10: the first 12 training losses of examples/gpt (fp32, CPU, --local 2) equal
those of a PyTorch (Python) loop — bench/gpt_peer.py's `reference`, the same GPT-2 written in plain PyTorch —
started from the same step-0 weights (the example's own export after a step at lr 1e-30: loss_curve.py), fed the same windows
in the same order, with the same AdamW groups, warmup + cosine schedule and clipping, within 1e-4 relative.

  gpt_loss_curve_test.py BUILD/examples/gpt   (python: the venv's, with torch and safetensors)
Exit 0 when every loss agrees, 1 otherwise (with the table), 77 (skip) when the corpus or the tokenizer is absent."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from loss_curve import compare, initial_weights, run_example, training_losses  # noqa: E402

PEER = os.path.join(HERE, "..", "..", "bench", "gpt_peer.py")
STEPS, WORLD, TOLERANCE = 12, 2, 1e-4
# The example's model, batch and optimizer at half its window, with a 4-step warmup: the 12 steps cross the
# warmup into the cosine decay, and take a third of the time the defaults' 20 steps of warmup did.
SHORTER = ["--seq-len", "64", "--warmup-steps", "4"]
TOKENIZER = os.path.expanduser("~/.cache/hpctrain/gpt2.tiktoken")


def main():
    binary = os.path.abspath(sys.argv[1])
    if not os.path.isdir("/usr/share/games/fortunes") or not os.path.isfile(TOKENIZER):
        print("skip: needs Debian's fortunes and ~/.cache/hpctrain/gpt2.tiktoken (scripts/setup)")
        return 77
    work = tempfile.mkdtemp(prefix="gpt-loss-curve-")
    run_dir = os.path.join(work, "run")
    # In fp32, so that both sides compute the same thing.
    command = [binary, "--local", str(WORLD), "--precision", "fp32", "--log-every", "1",
               "--eval-every", "0", "--checkpoint-every", "0", "--sample-tokens", "0"] + SHORTER
    initial = initial_weights(command, work)
    if initial is None or not run_example(command + ["--max-steps", str(STEPS)], work, run_dir):
        return 1
    ours = training_losses(run_dir, STEPS)

    tokens = os.path.join(work, "hpctrain-jobs", "gpt", "local", "prepare", "tokens", "train.tokens")
    reference = subprocess.run([sys.executable, PEER, "reference", "--init", initial,
                                "--tokens", tokens, "--steps", str(STEPS), "--world", str(WORLD)] + SHORTER,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if reference.returncode != 0:
        print(f"FAIL: the Python reference exited {reference.returncode}\n{reference.stderr[-3000:]}")
        return 1
    theirs = json.loads(reference.stdout.strip().splitlines()[-1])["losses"]

    return compare(ours, theirs, TOLERANCE)


if __name__ == "__main__":
    sys.exit(main())
