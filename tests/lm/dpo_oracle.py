"""The oracle of tests/lm/dpo_test.sh: TRL's DPOTrainer (trl 0.24, pinned in scripts/pins.sh) itself.

  pairs WORK N            from WORK/conversations.jsonl (sft_oracle.py make): WORK/pairs.jsonl, N conversational
                          preference rows with implicit prompts (chosen: the conversation's first answer; rejected:
                          another conversation's), and WORK/bad.jsonl whose line 3 prefers nothing (chosen == rejected)
  evaluate REF PAIRS POLICY:SPLIT...
                          for each POLICY:SPLIT, DPOTrainer(POLICY, ref_model=REF).evaluate() on the pairs of PAIRS that
                          examples/dpo.cpp
                          keeps in SPLIT (train: all but every 16th, validation: every 16th, as lm::Split), in fp32 on
                          the CPU, all pairs in one batch, TRL's defaults (beta 0.1, sigmoid, max_length 1024,
                          max_prompt_length 512): prints its metrics as JSON, a line each (eval_loss,
                          eval_rewards/chosen, ...); an argument --config=JSON sets DPOConfig fields (loss_type,
                          loss_weights, rpo_alpha, reference_free, label_smoothing, ...)
  train REF PAIRS STEPS LR WARMUP FINAL
                          a PyTorch loop from REF's weights: TRL's DPOTrainer (REF as the policy and the reference, its
                          data pipeline and get_batch_loss_metrics) on all the pairs lm::Split::train keeps as one batch,
                          STEPS steps of torch.optim.AdamW (betas 0.9/0.999, eps 1e-8, no decay) at LR times
                          LrSchedule::warmup_cosine(WARMUP, FINAL)'s factor (train/optim/schedule.hpp), the gradient's
                          norm clipped to 1: prints each step's loss and metrics as JSON, a line each
  wide WORK               WORK/wide: the Llama of WORK/llama (sft_oracle.py make) with Llama 3's vocabulary of 128,256
                          (random weights, its tokenizer files: the ids stay below the small vocabulary's); prints the
                          fewest tokens of any row of WORK/pairs.jsonl (prompt and completion as the chat template
                          renders them)
  losses IN OUT           TRL's DPOTrainer.dpo_loss itself (called on a stand-in for the trainer's attributes it reads)
                          summed over each case's loss_type list with its loss_weights, plus rpo_alpha times the nll,
                          as get_batch_loss_metrics does: IN holds chosen, rejected, ref_chosen, ref_rejected (lists),
                          nll and cases (beta, label_smoothing, loss_type, loss_weights, reference_free, rpo_alpha,
                          discopop_tau); OUT gets, per case, losses, chosen_rewards and rejected_rewards
"""
import json
import math
import os
import sys


def pairs(work, n):
    rows = [json.loads(line) for line in open(os.path.join(work, "conversations.jsonl"))]
    firsts = []
    for row in rows:
        messages = row["messages"]
        answer = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        firsts.append(messages[: answer + 1])
    out = []
    for i in range(n):
        chosen = firsts[i % len(firsts)]
        other = firsts[(i + 7) % len(firsts)][-1]["content"]
        if other == chosen[-1]["content"]:
            other = other + " Or not."
        rejected = chosen[:-1] + [{"role": "assistant", "content": other}]
        out.append(json.dumps({"chosen": chosen, "rejected": rejected}, ensure_ascii=False))
    with open(os.path.join(work, "pairs.jsonl"), "w") as f:
        f.write("\n".join(out) + "\n")
    bad = out[:6]
    row = json.loads(bad[2])
    bad[2] = json.dumps({"chosen": row["chosen"], "rejected": row["chosen"]}, ensure_ascii=False)
    with open(os.path.join(work, "bad.jsonl"), "w") as f:
        f.write("\n".join(bad) + "\n")
    print(f"{n} pairs")


def trainer_for(policy_dir, ref_dir, rows, split, config=None):
    """DPOTrainer(POLICY, ref_model=REF) in fp32 on the CPU over the pairs examples/dpo.cpp keeps in SPLIT (train: all
    but every 16th, validation: every 16th), evaluated in one batch of them all."""
    import logging
    import warnings

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    tokenizer = AutoTokenizer.from_pretrained(ref_dir)
    kept = [r for i, r in enumerate(rows) if (i % 16 == 8) == (split == "validation")]
    policy = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32)
    args = DPOConfig(output_dir=os.path.join(os.getcwd(), "trl-out"), per_device_eval_batch_size=len(kept),
                     report_to=[], use_cpu=True, bf16=False, fp16=False, dataloader_num_workers=0,
                     disable_tqdm=True, **(config or {}))
    data = Dataset.from_list(kept)
    return DPOTrainer(model=policy, ref_model=ref, args=args, train_dataset=data, eval_dataset=data,
                      processing_class=tokenizer)


def read_rows(jsonl):
    return [json.loads(line) for line in open(jsonl) if line.strip()]


def evaluate(ref_dir, jsonl, runs, config=None):
    rows = read_rows(jsonl)
    for run in runs:
        policy_dir, split = run.rsplit(":", 1)
        print(json.dumps(trainer_for(policy_dir, ref_dir, rows, split, config).evaluate()), flush=True)


def warmup_cosine(step, total, warmup, final):
    """LrSchedule::warmup_cosine's factor for the 0-based step `step` of `total` (its comment): (step + 1) /
    warmup during the warmup, then a cosine from 1 down to `final` over the remaining steps."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / (total - warmup))
    return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * progress))


def train(ref_dir, jsonl, steps, lr, warmup, final):
    import torch

    trainer = trainer_for(ref_dir, ref_dir, read_rows(jsonl), "train")
    batch = next(iter(trainer.get_eval_dataloader()))  # every pair of the split, TRL's tokenization and collation
    policy = trainer.model
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    policy.train()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr * warmup_cosine(step, steps, warmup, final)
        loss, metrics = trainer.get_batch_loss_metrics(policy, batch, train_eval="train")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        print(json.dumps({"step": step + 1, "loss": loss.item(), **{k: float(v) for k, v in metrics.items()}}),
              flush=True)


def wide(work):
    import shutil

    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    source, target = os.path.join(work, "llama"), os.path.join(work, "wide")
    os.makedirs(target, exist_ok=True)
    for name in os.listdir(source):
        if not name.endswith(".safetensors") and name != "config.json":
            shutil.copy(os.path.join(source, name), target)
    config = LlamaConfig.from_pretrained(source)
    config.vocab_size = 128256
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(target, safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(source)
    rows = read_rows(os.path.join(work, "pairs.jsonl"))
    print(min(len(tokenizer.apply_chat_template(r[side], tokenize=True)) for r in rows for side in ("chosen", "rejected")))


def losses(in_path, out_path):
    from types import SimpleNamespace

    import torch
    from trl import DPOTrainer
    from trl.trainer.dpo_config import FDivergenceType

    given = json.load(open(in_path))
    tensor = lambda key: torch.tensor(given[key], dtype=torch.float64)
    chosen, rejected, ref_chosen, ref_rejected = (tensor(k) for k in ("chosen", "rejected", "ref_chosen",
                                                                         "ref_rejected"))
    nll = torch.tensor(given["nll"], dtype=torch.float64)
    out = []
    for case in given["cases"]:
        trainer = SimpleNamespace(
            accelerator=SimpleNamespace(device=torch.device("cpu")), reference_free=case["reference_free"],
            f_divergence_type=FDivergenceType.REVERSE_KL, f_divergence_params=None, beta=case["beta"],
            label_smoothing=case["label_smoothing"], args=SimpleNamespace(discopop_tau=case["discopop_tau"]),
            loss_type=case["loss_type"])
        total, chosen_rewards, rejected_rewards = 0, 0, 0
        for i, loss_type in enumerate(case["loss_type"]):
            weight = case["loss_weights"][i] if case["loss_weights"] else 1.0
            part, c, r = DPOTrainer.dpo_loss(trainer, chosen, rejected, ref_chosen, ref_rejected, loss_type,
                                             {"nll_loss": nll})
            total, chosen_rewards, rejected_rewards = total + part * weight, chosen_rewards + c * weight, \
                rejected_rewards + r * weight
        if case["rpo_alpha"] is not None:
            total = total + case["rpo_alpha"] * nll
        out.append({"losses": total.tolist(), "chosen_rewards": chosen_rewards.tolist(),
                    "rejected_rewards": rejected_rewards.tolist()})
    json.dump(out, open(out_path, "w"))
    print(f"{len(out)} cases")


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "pairs":
        pairs(sys.argv[2], int(sys.argv[3]))
    elif command == "evaluate":
        rest = [a for a in sys.argv[4:] if not a.startswith("--config=")]
        configs = [json.loads(a[len("--config="):]) for a in sys.argv[4:] if a.startswith("--config=")]
        evaluate(sys.argv[2], sys.argv[3], rest, configs[0] if configs else None)
    elif command == "train":
        train(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7]))
    elif command == "wide":
        wide(sys.argv[2])
    elif command == "losses":
        losses(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown command {command}")
