"""What bench/gpt_vs_torchrun and bench/gpt_budget share: the venv, the CPU's bf16 test, running a side."""
import os
import subprocess
import sys
import time

VENV = os.path.expanduser("~/.cache/hpctrain/venv")
TORCHRUN = os.path.join(VENV, "bin", "torchrun")
PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt_peer.py")


def cpu_has_bf16():
    with open("/proc/cpuinfo") as f:
        flags = next((line for line in f if line.startswith("flags")), "")
    return " avx512_bf16" in flags or " amx_bf16" in flags


def run(command, cwd, env_extra=None):
    """Runs one side with one thread per rank; returns its output and its wall-clock seconds."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env_extra or {}))
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(command)}\n{done.stdout[-3000:]}")
    return done.stdout, time.perf_counter() - start


def logged_throughput(metrics_path, after_step, tokens_per_step):
    """tokens/s of the train records of a run's metrics.jsonl logged after `after_step`, each interval weighed
    by its steps (the intervals are equal but the last may be shorter), and the last such record; None when
    there is none (or no file)."""
    import json
    try:
        with open(metrics_path) as f:
            records = [json.loads(line) for line in f]
    except OSError:
        return None
    timed = [r for r in records if "tokens_per_s" in r and r["step"] > after_step]
    if not timed:
        return None
    steps, seconds, previous = 0, 0.0, after_step
    for r in timed:
        n = r["step"] - previous
        previous = r["step"]
        steps += n
        seconds += n * tokens_per_step / r["tokens_per_s"]
    return steps * tokens_per_step / seconds, timed[-1]


def json_line(out, what):
    """The JSON result line a side printed."""
    import json
    for line in out.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    sys.exit(f"no result line from {what}\n{out[-3000:]}")
