#!/usr/bin/env python3
"""Issue 53: the same global batch gives the same loss and gradients however it is split.

A small Llama made by transformers (sft_oracle.py make) is fine-tuned for one step on 32 conversations whose
responses are one word or a few hundred tokens (the trained tokens per example differ by up to ~100x), by
tests/lm/programs/sgd_sft.cpp: SGD at lr 1, so the fp32 export after the step is p0 - g and shows every parameter's
gradient g. The global batch is the whole training split (32 examples), so every split holds the same examples:
  - 1 rank x 32, 2 x 16, 4 x 8, and 1 rank x 8 per micro-batch x 4 accumulation steps, under Replicated, zero2 and
    zero3 (and the packed rows, 8 a step, under Replicated and zero3): the step's loss and every gradient agree;
  - the oracle: a plain PyTorch loop over transformers' model from the same weights, summing the token losses of all
    32 examples (apply_chat_template's assistant mask, truncated as hpctrain truncates) and dividing by their count,
    gives the same loss and gradients;
  - --micro-batch-mean-loss (the old mean of the micro-batches' means) differs, so the comparison can fail;
  - --reduce-dtype bf16 (issue 54: FSDP2's reduce_dtype) under zero2, zero3 and hsdp at 4 ranks gives the oracle's
    gradients within the bound of bf16 sums below, and not within fp32's (the bf16 reduction did happen).

The bound: each side sums the same ~3,000 token losses (and each gradient element the same products) in fp32 in
another order: the rounding of a sum of n terms is below n*eps relative in the worst case and about sqrt(n)*eps
(eps = 2^-24 = 6e-8; sqrt(3000)*eps = 3.3e-6) in practice. The checks allow 2e-5 relative for the loss (6x the
practical figure, the issue asks 1e-5 of --local 1/2/4 and is met with room in the log) and 1e-4 relative to each
tensor's gradient norm (the export's p0 - p1 adds an fp32 rounding of p0, ~1e-9 absolute). The old mode differs by
percents.

The bf16 reduction's bound: each rank's contribution g_r / W (its weighted sum of its examples' gradients) is rounded
to bf16 (8 significant bits: at most 2^-9 of itself), then the W contributions are summed in bf16, each partial sum
rounded (W - 1 additions, each at most 2^-9 of a partial sum, itself at most sum_r |g_r| / W), and converted to fp32
exactly. Per element: |error| <= W * 2^-9 * sum_r |g_r| / W <= W * 2^-9 * A, with A = sum over the examples of
|each example's gradient| (the oracle computes it: whatever the split, sum_r |g_r| / W <= A). hsdp (2 groups of 2)
adds its all-reduce across the replicas in bf16: one more rounding of the shard, 2^-9 * A, so W + 1 covers both. The
check: |g_ours - g| <= (W + 1) * 2^-9 * |A| as a norm, per tensor, plus the fp32 allowance above.

  split_invariance_test.py BUILD/tests/lm/sgd_sft   (python: the venv's, with torch, transformers, safetensors)
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FORTUNES = "/usr/share/games/fortunes"
MAX_LENGTH = 256
LOSS_BOUND, GRADIENT_BOUND = 2e-5, 1e-4


def uneven_conversations(path):
    """34 conversations (the training split, every 16th held out from the 9th, keeps 32): short and long answers."""
    sys.path.insert(0, HERE)
    from sft_oracle import fortunes
    texts = [" ".join(lines) for lines in fortunes(FORTUNES)]
    records = []
    for i in range(34):
        question = texts[3 * i][:80]
        if i % 3 == 0:
            answer = texts[3 * i + 1].split()[0]  # one word: a handful of trained tokens
        else:
            answer = " ".join(texts[3 * i + 1: 3 * i + 1 + (i % 7) + 1])[: 60 * (i % 11) + 40]
        records.append({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]})
    with open(path, "w") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def oracle(model_dir, jsonl):
    """{loss, gradients by name}: the token-weighted loss of the whole training split in one PyTorch loop, fp32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    records = [json.loads(line) for line in open(jsonl) if line.strip()]
    train = [r for i, r in enumerate(records) if i % 16 != 8]
    count, sums, per_example, inputs = 0, [], [], []
    for record in train:
        rendered = tokenizer.apply_chat_template(record["messages"], tokenize=True, return_dict=True,
                                                 return_assistant_tokens_mask=True)
        ids = rendered["input_ids"][:MAX_LENGTH]
        mask = rendered["assistant_masks"][:MAX_LENGTH]
        labels = torch.tensor([i if m else -100 for i, m in zip(ids, mask)])
        inputs.append((ids, labels))
        per_example.append(int((labels[1:] != -100).sum()))
        count += per_example[-1]
    # One backward an example: the gradient is their sum, and A (the bf16 bound's) the sum of their absolute values.
    gradients = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    absolute = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for ids, labels in inputs:
        model.zero_grad(set_to_none=True)
        logits = model(torch.tensor([ids])).logits[0].float()
        example = torch.nn.functional.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="sum")
        sums.append(example.detach())
        (example / count).backward()
        for n, p in model.named_parameters():
            gradients[n] += p.grad
            absolute[n] += p.grad.abs()
    loss = torch.stack(sums).sum() / count
    return float(loss), gradients, count, per_example, absolute


def run(binary, work, name, world, accumulation, sharding, packing=False, extra=()):
    import torch
    from safetensors.torch import load_file
    run_dir = os.path.join(work, name)
    command = [binary, "--from", "llama", "--data", "uneven.jsonl", "--local", str(world), "--gradient-accumulation",
               str(accumulation), "--sharding", sharding, "--precision", "fp32", "--export-dtype", "fp32",
               "--max-length", str(MAX_LENGTH)] + (["--packing", "--batch-size", "8"] if packing else []) + list(extra)
    done = subprocess.run(command, cwd=work, env=dict(os.environ, HPCTRAIN_RUN_DIR=run_dir),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        print(f"FAIL: {name}: {' '.join(command)} exited {done.returncode}\n{done.stdout[-4000:]}")
        sys.exit(1)
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    loss = next(r["loss"] for r in records if r.get("step") == 1 and "loss" in r)
    start = load_file(os.path.join(work, "llama", "model.safetensors"))
    after = load_file(os.path.join(run_dir, "export", "model.safetensors"))
    return loss, {n: (start[n].double() - after[n].double()) for n in start}  # SGD at lr 1: p0 - p1 = g


def gradient_distance(ours, theirs, start, bf16_bound=None):
    """The largest, over tensors, of |g_ours - g_theirs| over its allowance: GRADIENT_BOUND * |g_theirs| for the sums'
    order, plus the fp32 rounding of the two exports' p1 = p0 - g (half an ulp an element each: 2^-24 * |p0| as a norm,
    twice). 1 is the bound. Norm weights (p0 = 1, small g) are the tensors that need the second term."""
    worst, where = 0.0, ""
    for name, g in theirs.items():
        allowance = GRADIENT_BOUND * float(g.double().norm()) + 2 * 2.0**-24 * float(start[name].double().norm())
        if bf16_bound is not None:
            allowance += bf16_bound[name]
        d = float((ours[name] - g.double()).norm()) / max(allowance, 1e-30)
        if d > worst:
            worst, where = d, name
    return worst, where


def main():
    binary = os.path.abspath(sys.argv[1])
    if not os.path.isdir(FORTUNES):
        print("skip: needs Debian's fortunes")
        return 77
    work = tempfile.mkdtemp(prefix="split-invariance-", dir=os.environ.get("HPCTRAIN_BUILD_DIR"))
    made = subprocess.run([sys.executable, os.path.join(HERE, "sft_oracle.py"), "make", work, FORTUNES],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if made.returncode != 0:
        print(f"FAIL: the oracle could not make the model\n{made.stdout[-3000:]}")
        return 1
    uneven_conversations(os.path.join(work, "uneven.jsonl"))
    from safetensors.torch import load_file
    start = load_file(os.path.join(work, "llama", "model.safetensors"))
    expected_loss, expected_gradients, tokens, per_example, absolute = oracle(os.path.join(work, "llama"),
                                                                              os.path.join(work, "uneven.jsonl"))
    print(f"oracle: loss {expected_loss:.9g} over {tokens} trained tokens of 32 examples "
          f"({min(per_example)} to {max(per_example)} an example)")

    failures = []
    splits = [("replicated", 1, 1), ("replicated", 2, 1), ("replicated", 4, 1), ("replicated", 1, 4),
              ("zero2", 2, 1), ("zero2", 4, 1), ("zero3", 2, 1), ("zero3", 4, 1), ("zero3", 1, 4)]
    print(f"{'run':<28} {'loss':>14} {'vs oracle':>10} {'gradients vs oracle (1: the bound)':>34}")
    for sharding, world, accumulation in splits:
        name = f"{sharding}-{world}x{32 // world // accumulation}x{accumulation}"
        loss, gradients = run(binary, work, name, world, accumulation, "none" if sharding == "replicated" else sharding)
        loss_distance = abs(loss - expected_loss) / abs(expected_loss)
        distance, where = gradient_distance(gradients, expected_gradients, start)
        print(f"{name:<28} {loss:>14.9g} {loss_distance:>10.2e} {distance:>12.2e} {where}")
        if loss_distance > LOSS_BOUND:
            failures.append(f"{name}: loss {loss} against the oracle's {expected_loss} ({loss_distance:.2e} relative)")
        if distance > 1:
            failures.append(f"{name}: the gradient of {where} is {distance:.2e} from the oracle's (relative norm)")

    # Packed rows (8 a step): the same rows at every split.
    packed = {}
    for sharding, world, accumulation in [("replicated", 1, 1), ("replicated", 4, 1), ("replicated", 1, 4),
                                          ("zero3", 2, 1)]:
        name = f"packed-{sharding}-{world}x{8 // world // accumulation}x{accumulation}"
        packed[name] = run(binary, work, name, world, accumulation, "none" if sharding == "replicated" else sharding,
                           packing=True)
    reference_name = next(iter(packed))
    reference_loss, reference_gradients = packed[reference_name]
    for name, (loss, gradients) in packed.items():
        loss_distance = abs(loss - reference_loss) / abs(reference_loss)
        distance, where = gradient_distance(gradients, reference_gradients, start)
        print(f"{name:<28} {loss:>14.9g} {loss_distance:>10.2e} {distance:>12.2e} {where} (vs {reference_name})")
        if loss_distance > LOSS_BOUND or distance > 1:
            failures.append(f"{name}: loss {loss_distance:.2e}, gradients {distance:.2e} from {reference_name}")

    # A bf16 reduction (--reduce-dtype bf16) at 4 ranks: within the bf16 bound of the oracle, not within fp32's.
    world = 4
    bf16_bound = {n: (world + 1) * 2.0**-9 * float(a.double().norm()) for n, a in absolute.items()}
    # hsdp (2 shard groups of 2) in fp32 first: its all-reduce across the replicas, started as each unit's
    # reduce-scatter ends, gives the oracle's gradients within fp32's bound.
    for sharding, extra, dtype in [("hsdp", ["--hsdp-group-size", "2"], "fp32"), ("zero2", [], "bf16"),
                                   ("zero3", [], "bf16"), ("hsdp", ["--hsdp-group-size", "2"], "bf16")]:
        name = f"{sharding}-{world}x{32 // world}x1-{dtype}-reduce"
        loss, gradients = run(binary, work, name, world, 1, sharding, extra=["--reduce-dtype", dtype] + extra)
        loss_distance = abs(loss - expected_loss) / abs(expected_loss)
        distance, where = gradient_distance(gradients, expected_gradients, start,
                                            bf16_bound if dtype == "bf16" else None)
        fp32_distance, _ = gradient_distance(gradients, expected_gradients, start)
        print(f"{name:<28} {loss:>14.9g} {loss_distance:>10.2e} {distance:>12.2e} {where} "
              f"(fp32's bound: {fp32_distance:.2e})")
        if loss_distance > LOSS_BOUND:
            failures.append(f"{name}: loss {loss} against the oracle's {expected_loss} ({loss_distance:.2e} relative)")
        if distance > 1:
            failures.append(f"{name}: the gradient of {where} is {distance:.2e} of its reduction's bound away")
        if dtype == "bf16" and fp32_distance <= 1:
            failures.append(f"{name}: within fp32's bound ({fp32_distance:.2e}): was the reduction in bf16?")

    # The old mode: the mean of the micro-batches' means depends on the split.
    old_loss, old_gradients = run(binary, work, "micro-batch-mean-1x8x4", 1, 4, "none",
                                  extra=["--micro-batch-mean-loss"])
    old_loss_distance = abs(old_loss - expected_loss) / abs(expected_loss)
    old_distance, _ = gradient_distance(old_gradients, expected_gradients, start)
    print(f"{'micro-batch-mean-1x8x4':<28} {old_loss:>14.9g} {old_loss_distance:>10.2e} {old_distance:>12.2e}")
    # At the random start every token's loss is near log(vocabulary), so weighting moves the loss little (3e-4 here)
    # and the gradients much (30%).
    if old_loss_distance < 5 * LOSS_BOUND or old_distance < 100:
        failures.append(f"--micro-batch-mean-loss at 1x8x4 is within 5x (loss) or 100x (gradients) the bounds "
                        f"of the token-weighted step (loss {old_loss_distance:.2e}, gradients {old_distance:.2e}): the test could not fail")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
