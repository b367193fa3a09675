#!/usr/bin/env python3
"""The loss-curve oracle of issue 10: the first 20 training losses of examples/gpt (fp32, CPU, --local 2) equal
those of a PyTorch (Python) loop — bench/gpt_peer.py's `reference`, the same GPT-2 written in plain PyTorch —
started from the same step-0 weights (the example writes them with --save-initial), fed the same windows
in the same order, with the same AdamW groups, warmup + cosine schedule and clipping, within 1e-4 relative.

  gpt_loss_curve_test.py BUILD/examples/gpt   (python: the venv's, with torch and safetensors)
Exit 0 when every loss agrees, 1 otherwise (with the table), 77 (skip) when the corpus or the tokenizer is absent."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "..", "..", "bench", "gpt_peer.py")
STEPS, WORLD, TOLERANCE = 20, 2, 1e-4
TOKENIZER = os.path.expanduser("~/.cache/hpctrain/gpt2.tiktoken")


def main():
    binary = os.path.abspath(sys.argv[1])
    if not os.path.isdir("/usr/share/games/fortunes") or not os.path.isfile(TOKENIZER):
        print("skip: needs Debian's fortunes and ~/.cache/hpctrain/gpt2.tiktoken (scripts/setup)")
        return 77
    work = tempfile.mkdtemp(prefix="gpt-loss-curve-")
    run_dir = os.path.join(work, "run")
    # The example's defaults (model, batch, schedule), in fp32 so that both sides compute the same thing.
    command = [binary, "--local", str(WORLD), "--max-steps", str(STEPS), "--precision", "fp32", "--log-every", "1",
               "--eval-every", "0", "--checkpoint-every", "0", "--sample-tokens", "0", "--save-initial"]
    env = dict(os.environ, HPCTRAIN_RUN_DIR=run_dir)
    done = subprocess.run(command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(done.stdout[-4000:])
    if done.returncode != 0:
        print(f"FAIL: {' '.join(command)} exited {done.returncode}")
        return 1
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    ours = {r["step"]: r["loss"] for r in records if "loss" in r and "eval_loss" not in r}
    ours = [ours[s] for s in range(1, STEPS + 1)]

    tokens = os.path.join(work, "hpctrain-jobs", "gpt", "local", "prepare", "tokens", "train.tokens")
    reference = subprocess.run([sys.executable, PEER, "reference", "--init", os.path.join(run_dir, "initial"),
                                "--tokens", tokens, "--steps", str(STEPS), "--world", str(WORLD)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if reference.returncode != 0:
        print(f"FAIL: the Python reference exited {reference.returncode}\n{reference.stderr[-3000:]}")
        return 1
    theirs = json.loads(reference.stdout.strip().splitlines()[-1])["losses"]

    worst = 0.0
    print(f"{'step':>4} {'hpctrain':>12} {'pytorch':>12} {'rel. diff':>10}")
    for step, (a, b) in enumerate(zip(ours, theirs), start=1):
        rel = abs(a - b) / abs(b)
        worst = max(worst, rel)
        print(f"{step:>4} {a:>12.6f} {b:>12.6f} {rel:>10.2e}")
    if not ours[-1] < ours[0] - 0.5:
        print(f"FAIL: the loss did not fall ({ours[0]:.4f} -> {ours[-1]:.4f}): the comparison would prove little")
        return 1
    if worst > TOLERANCE:
        print(f"FAIL: largest relative difference {worst:.2e} > {TOLERANCE:.0e}")
        return 1
    print(f"OK: {STEPS} losses agree, largest relative difference {worst:.2e} (tolerance {TOLERANCE:.0e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
