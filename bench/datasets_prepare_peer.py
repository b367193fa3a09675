#!/usr/bin/env python3
"""The peer of bench/datasets_prepare: what a user of `datasets` writes to tokenize a Parquet text corpus —
load_dataset("parquet") (its Arrow cache written first), then .map with the fast tokenizer, batched, num_proc =
PROCESSES — counting the ids and one end-of-text token a document, as hpctrain's preparation appends.

  datasets_prepare_peer.py CORPUS.parquet TOKENIZER_JSON PROCESSES CACHE_DIR  -> "datasets.map <s> <tokens> <docs>"
"""
import sys
import time

import datasets
from transformers import PreTrainedTokenizerFast

corpus, tokenizer_file, processes, cache = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
datasets.disable_progress_bars()
start = time.perf_counter()
tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_file)
ds = datasets.load_dataset("parquet", data_files=corpus, split="train", cache_dir=cache)
ids = ds.map(lambda batch: {"input_ids": tok(batch["text"], add_special_tokens=False)["input_ids"]}, batched=True,
             num_proc=processes, remove_columns=ds.column_names)
seconds = time.perf_counter() - start  # the ids are in the cache: what the training then reads
tokens = sum(len(row) for part in ids.iter(batch_size=10_000) for row in part["input_ids"]) + len(ids)
print(f"datasets.map {seconds:.2f} {tokens} {len(ids)}")
