#!/usr/bin/env python3
"""The peer of bench/sft_prepare_bench: TRL's way to tokenize a conversational JSONL file, `datasets.map` over
`apply_chat_template(..., return_assistant_tokens_mask=True)` with the same tokenizer directory and template.

  sft_prepare_peer.py JSONL TOKENIZER_DIR TEMPLATE NUM_PROC REPEAT
  -> "datasets.map <MB/s> <examples/s> <num_proc> <ids> <trained ids>"

The clock covers what hpctrain's step does: reading the JSON lines, rendering, tokenizing, masking (the best of
REPEAT runs); no cache (datasets.disable_caching, kept in memory), so every run does the work.
"""
import os
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # datasets' processes, not tokenizers' threads
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import datasets  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

jsonl, tokenizer_dir, template, num_proc, repeat = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
datasets.disable_caching()
datasets.disable_progress_bars()
tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
tokenizer.chat_template = open(template).read()


def tokenize(example):
    out = tokenizer.apply_chat_template(example["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    return {"input_ids": out["input_ids"], "assistant_masks": out["assistant_masks"]}


best = None
for _ in range(repeat):
    start = time.perf_counter()
    data = datasets.load_dataset("json", data_files=jsonl, split="train", keep_in_memory=True)
    data = data.map(tokenize, remove_columns=data.column_names, num_proc=num_proc if num_proc > 1 else None, keep_in_memory=True)
    seconds = time.perf_counter() - start
    best = seconds if best is None else min(best, seconds)
ids = sum(len(x) for x in data["input_ids"])
trained = sum(sum(m) for m in data["assistant_masks"])
size = os.path.getsize(jsonl)
print(f"datasets.map {size / 1e6 / best:.3f} {len(data) / best:.1f} {num_proc} {ids} {trained}")
