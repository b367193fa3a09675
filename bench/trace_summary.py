#!/usr/bin/env python3
"""Where a training step's GPU time goes, side by side for Chrome traces of the same steps (what
`hpctrain_model_bench --profile` and `bench/model_peer.py --profile` write; .json or .json.gz). Per trace: the
span from the first to the last kernel, the time some kernel runs (busy) and the idle rest (launch overhead,
host work, syncs), kernel and launch counts, then milliseconds per step by kind of kernel and the heaviest
kernels. Standard library only.

  bench/trace_summary.py --steps 3 hpctrain=hpctrain.json.gz eager=eager.json.gz
"""
import argparse
import collections
import gzip
import json
import re

KINDS = [  # first match wins; names of cuBLAS/CUTLASS, flash/efficient attention and ATen kernels
    ("attention", r"flash|fmha|attention|efficient"),
    ("matmul", r"gemm|sm90_xmma|cutlass|nvjet|cublas|matmul"),
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("layer norm", r"layer_norm|LayerNorm"),
    ("softmax / cross entropy", r"softmax|nll_loss|cross_entropy|log_softmax"),
    ("gelu", r"gelu|GeluCUDA"),
    ("silu", r"silu"),
    ("rms norm", r"rms_norm|RmsNorm"),
    ("reduction / norm", r"reduce_kernel|norm_kernel|Reduce"),
    ("copy / cast", r"copy|Memcpy|Memset|to_copy|direct_copy|CatArray|transpose"),
    ("embedding", r"embedding|index|gather|scatter"),
    ("elementwise", r"elementwise|vectorized|unrolled|Functor|fill"),
]


def load(path):
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return json.load(f)["traceEvents"]


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return "other"


def summarise(events, steps):
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    launches = [e for e in events if e.get("cat") == "cuda_runtime" and "Launch" in e.get("name", "")]
    if not kernels:
        return None
    intervals = sorted((e["ts"], e["ts"] + e["dur"]) for e in kernels)
    busy, end = 0.0, None
    for start, stop in intervals:
        if end is None or start >= end:
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    span = intervals[-1][1] - intervals[0][0]
    by_kind, by_name = collections.Counter(), collections.Counter()
    count_by_kind = collections.Counter()
    for e in kernels:
        kind = kind_of(e["name"])
        by_kind[kind] += e["dur"]
        count_by_kind[kind] += 1
        by_name[e["name"][:90]] += e["dur"]
    per = lambda us: us / 1e3 / steps  # noqa: E731  (ms per step)
    return {"span": per(span), "busy": per(busy), "idle": per(span - busy), "kernels": len(kernels) / steps,
            "launches": len(launches) / steps, "kinds": {k: (per(v), count_by_kind[k] / steps) for k, v in by_kind.items()},
            "top": [(n, per(v)) for n, v in by_name.most_common(12)]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="steps in each trace (default 3)")
    parser.add_argument("traces", nargs="+", help="LABEL=PATH")
    a = parser.parse_args()
    results = {}
    for item in a.traces:
        label, path = item.split("=", 1)
        results[label] = summarise(load(path), a.steps)
        if results[label] is None:
            raise SystemExit(f"{path}: no GPU kernels in the trace (profiled on the CPU?)")
    labels = list(results)
    print("| ms per step | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    for key, title in [("span", "first kernel to last"), ("busy", "some kernel running"), ("idle", "no kernel running")]:
        print(f"| {title} | " + " | ".join(f"{results[l][key]:.2f}" for l in labels) + " |")
    print("| kernels per step | " + " | ".join(f"{results[l]['kernels']:.0f}" for l in labels) + " |")
    kinds = sorted({k for r in results.values() for k in r["kinds"]}, key=lambda k: -max(r["kinds"].get(k, (0, 0))[0] for r in results.values()))
    for kind in kinds:
        print(f"| {kind} (ms, kernels) | " + " | ".join(
            "{:.2f} ({:.0f})".format(*results[l]["kinds"].get(kind, (0.0, 0))) for l in labels) + " |")
    for label in labels:
        print(f"\n{label}: heaviest kernels (ms per step)")
        for name, ms in results[label]["top"]:
            print(f"  {ms:7.2f}  {name}")


if __name__ == "__main__":
    main()
