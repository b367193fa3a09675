"""The peer of bench/dpo_vs_trl: TRL's DPOTrainer (trl 0.24, transformers, PEFT for LoRA) on the CPU, one process.

  dpo_peer.py MODEL_DIR PAIRS_JSONL OUT_DIR --mode lora|full --batch B --steps S --warmup W --precision fp32|bf16
              [--threads N] [--no-precompute]

Trains W + S steps of B pairs from PAIRS_JSONL, as examples/dpo.cpp does: lora (PEFT r 16, alpha 32 on q_proj and
v_proj, no dropout; the reference is the model with its adapters off) or full (precompute_ref_log_probs: the
reference pass over the data before training, as hpctrain does without LoRA). Prints one JSON line: pairs/s over the
steps after the first W (each step timed from the previous step's end, so the batch's collation counts as it does
on hpctrain's side), the wall time of the whole run, the peak resident memory, the last loss.
"""
import argparse
import json
import logging
import os
import resource
import time
import warnings


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("pairs")
    parser.add_argument("out")
    parser.add_argument("--mode", choices=["lora", "full"], required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--precision", choices=["fp32", "bf16"], required=True)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--no-precompute", action="store_true", help="full: DPOTrainer's default, a reference model held")
    args = parser.parse_args()
    started = time.perf_counter()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [json.loads(line) for line in open(args.pairs) if line.strip()]
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    peft_config = None
    if args.mode == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                 task_type="CAUSAL_LM")
    config = DPOConfig(output_dir=args.out, per_device_train_batch_size=args.batch, max_steps=args.warmup + args.steps,
                       learning_rate=5e-6, weight_decay=0.0, max_grad_norm=1.0, logging_steps=1, save_strategy="no",
                       report_to=[], use_cpu=True, bf16=args.precision == "bf16", fp16=False,
                       dataloader_num_workers=0, disable_tqdm=True, seed=1,
                       precompute_ref_log_probs=args.mode == "full" and not args.no_precompute)
    ends, losses = [], []

    class Clock(TrainerCallback):
        def on_step_end(self, a, state, control, **kwargs):
            ends.append(time.perf_counter())

        def on_log(self, a, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                losses.append(logs["loss"])

    trainer = DPOTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                         peft_config=peft_config, callbacks=[Clock()])
    trainer.train()
    timed = ends[args.warmup:]
    seconds = timed[-1] - ends[args.warmup - 1]
    print(json.dumps({"side": "trl", "pairs_per_s": round(len(timed) * args.batch / seconds, 3),
                      "wall_s": round(time.perf_counter() - started, 1),
                      "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
                      "threads": torch.get_num_threads(), "last_loss": losses[-1] if losses else None}), flush=True)


if __name__ == "__main__":
    main()
