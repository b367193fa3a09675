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
                          eval_rewards/chosen, ...)
"""
import json
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


def evaluate(ref_dir, jsonl, runs):
    import logging
    import warnings

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    rows = [json.loads(line) for line in open(jsonl) if line.strip()]
    tokenizer = AutoTokenizer.from_pretrained(ref_dir)
    for run in runs:
        policy_dir, split = run.rsplit(":", 1)
        kept = [r for i, r in enumerate(rows) if (i % 16 == 8) == (split == "validation")]
        policy = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
        ref = AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32)
        args = DPOConfig(output_dir=os.path.join(os.getcwd(), "trl-out"), per_device_eval_batch_size=len(kept),
                         report_to=[], use_cpu=True, bf16=False, fp16=False, dataloader_num_workers=0,
                         disable_tqdm=True)
        data = Dataset.from_list(kept)
        trainer = DPOTrainer(model=policy, ref_model=ref, args=args, train_dataset=data, eval_dataset=data,
                             processing_class=tokenizer)
        print(json.dumps(trainer.evaluate()), flush=True)


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "pairs":
        pairs(sys.argv[2], int(sys.argv[3]))
    elif command == "evaluate":
        evaluate(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        sys.exit(f"unknown command {command}")
