#!/usr/bin/env python3
"""The peers of bench/tokenize_bench: tiktoken (ranks) or HF tokenizers (tokenizer.json), single-threaded.

  tokenize_peer.py tiktoken RANKS_FILE REPEAT TEXT_FILE...   -> "tiktoken encode <MB/s> <tokens>"
  tokenize_peer.py hf TOKENIZER_JSON REPEAT TEXT_FILE...     -> "hf-tokenizers encode <MB/s> <tokens>"

Each file is encoded as one string; the best of REPEAT runs counts (as for hpctrain).
"""
import os
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # HF: no thread pool, single-threaded like the others
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

kind, tokenizer, repeat, files = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
texts = [open(f, "rb").read().decode("utf-8") for f in files]
size = sum(len(t.encode("utf-8")) for t in texts)
if kind == "tiktoken":
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    r50k = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
    enc = tiktoken.Encoding("gpt2", pat_str=r50k, mergeable_ranks=load_tiktoken_bpe(tokenizer),
                            special_tokens={"<|endoftext|>": 50256})
    encode = enc.encode_ordinary
    name = "tiktoken"
else:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)

    def encode(text):
        return tok.encode(text, add_special_tokens=False).ids

    name = "hf-tokenizers"
best = float("inf")
for _ in range(repeat):
    start = time.perf_counter()
    tokens = sum(len(encode(t)) for t in texts)
    best = min(best, time.perf_counter() - start)
print(f"{name} encode {size / 1e6 / best:.2f} {tokens}")
