#!/usr/bin/env python3
"""The reference tokenizers for tests/text: Hugging Face `tokenizers` and `tiktoken` (venv, test-time only).

  oracle.py train OUT.json FORTUNE_FILE...      train a byte-level BPE on fortunes (vocab 4000) with HF
  oracle.py train-split OUT.json FORTUNE_FILE... the same shaped like Llama 3's: Split(regex) then
                                                 ByteLevel(use_regex=False), ignore_merges, two specials
  oracle.py encode KIND TOKENIZER INPUT OUTPUT   KIND: hf | tiktoken | tiktoken-special
      INPUT: one hex-encoded byte string per line; OUTPUT: the ids of each, space-separated, one line each.

Invalid UTF-8 has no reference behaviour to copy: HF's Python API takes str (a lone surrogate from
surrogateescape is refused), tiktoken's _encode_bytes handles only an invalid tail and merges it into the
last piece. hpctrain encodes each run of invalid bytes as one BPE piece and the valid runs between them as
usual; the oracle composes exactly that from the references' own parts: encode() on each valid run,
the model's BPE of one piece (HF model.tokenize, tiktoken _encode_single_piece) on each invalid run.
"""
import sys


def runs(data: bytes):
    """Splits bytes into (is_invalid, bytes) runs the way Python's UTF-8 decoder flags invalid bytes."""
    text = data.decode("utf-8", "surrogateescape")
    out = []
    for ch in text:
        bad = 0xDC80 <= ord(ch) <= 0xDCFF
        if out and out[-1][0] == bad:
            out[-1][1].append(ch)
        else:
            out.append((bad, [ch]))
    return [(bad, "".join(chars).encode("utf-8", "surrogateescape")) for bad, chars in out]


def byte_level(raw: bytes) -> str:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, map(chr, cs)))
    return "".join(table[b] for b in raw)


LLAMA3 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def train(out, files, split=False):
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, decoders, trainers

    if split:
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        specials = ["<|endoftext|>"]
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4000, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train(files, trainer)
    tok.save(out)


def encode(kind, tokenizer, input_path, output_path):
    if kind == "hf":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(tokenizer)

        def ordinary(s):
            return tok.encode(s, add_special_tokens=False).ids

        def piece(raw):
            return [t.id for t in tok.model.tokenize(byte_level(raw))]
    else:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        r50k = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
        enc = tiktoken.Encoding("gpt2", pat_str=r50k, mergeable_ranks=load_tiktoken_bpe(tokenizer),
                                special_tokens={"<|endoftext|>": 50256})
        if kind == "tiktoken-special":
            def ordinary(s):
                return enc.encode(s, allowed_special="all")
        else:
            ordinary = enc.encode_ordinary

        def piece(raw):
            return enc._encode_single_piece(raw)

    with open(input_path) as source, open(output_path, "w") as sink:
        for line in source:
            data = bytes.fromhex(line.strip())
            ids = []
            for bad, raw in runs(data):
                ids += piece(raw) if bad else ordinary(raw.decode("utf-8"))
            sink.write(" ".join(map(str, ids)) + "\n")


if __name__ == "__main__":
    if sys.argv[1] in ("train", "train-split"):
        train(sys.argv[2], sys.argv[3:], split=sys.argv[1] == "train-split")
    else:
        encode(*sys.argv[2:6])
