"""What the loss-curve oracles share (gpt_loss_curve_test.py, roberta_loss_curve_test.py): run an example with
--local, read its training losses from metrics.jsonl, and compare them with a PyTorch loop's, step by step."""
import json
import os
import subprocess


def run_example(command, work, run_dir):
    """Runs `command` in `work` with HPCTRAIN_RUN_DIR=run_dir; prints the end of its output; True when it exits 0."""
    done = subprocess.run(command, cwd=work, env=dict(os.environ, HPCTRAIN_RUN_DIR=run_dir),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(done.stdout[-4000:])
    if done.returncode != 0:
        print(f"FAIL: {' '.join(command)} exited {done.returncode}")
    return done.returncode == 0


def initial_weights(command, work):
    """The example's step-0 weights in Hugging Face format, where the PyTorch loop starts from: `command` (the
    example with the run's arguments, without --max-steps and --lr) trains one step at a learning rate of 1e-30 and
    exports in fp32 (its lm::hf_export). The step leaves every weight as the seed initialised it: AdamW's decay
    multiplies by 1 - 1e-31, which is 1 in fp32, and its update (at most the step size, 1e-29 after bias
    correction) is below half a unit in the last place of any weight above 1e-21; a zero bias becomes at most
    1e-29. Returns the export's directory, or None when the run failed."""
    run_dir = os.path.join(work, "initial-run")
    if not run_example(command + ["--max-steps", "1", "--lr", "1e-30", "--export-dtype", "fp32"], work, run_dir):
        return None
    return os.path.join(run_dir, "export")


def training_losses(run_dir, steps):
    """The logged training loss of steps 1..steps (the run logs every step: --log-every 1)."""
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    losses = {r["step"]: r["loss"] for r in records if "loss" in r and "eval_loss" not in r}
    return [losses[s] for s in range(1, steps + 1)]


def compare(ours, theirs, tolerance):
    """Prints the two curves side by side; 0 when every loss agrees within `tolerance` (relative) and the loss
    fell by more than 0.5 (else the comparison proves little), 1 otherwise."""
    worst = 0.0
    print(f"{'step':>4} {'hpctrain':>12} {'pytorch':>12} {'rel. diff':>10}")
    for step, (a, b) in enumerate(zip(ours, theirs), start=1):
        rel = abs(a - b) / abs(b)
        worst = max(worst, rel)
        print(f"{step:>4} {a:>12.6f} {b:>12.6f} {rel:>10.2e}")
    if not ours[-1] < ours[0] - 0.5:
        print(f"FAIL: the loss did not fall ({ours[0]:.4f} -> {ours[-1]:.4f}): the comparison would prove little")
        return 1
    if worst > tolerance:
        print(f"FAIL: largest relative difference {worst:.2e} > {tolerance:.0e}")
        return 1
    print(f"OK: {len(ours)} losses agree, largest relative difference {worst:.2e} (tolerance {tolerance:.0e})")
    return 0
