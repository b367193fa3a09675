"""The oracle of the SFT test (tests/models/sft_test.sh): transformers and HF tokenizers, never hpctrain.

  sft_oracle.py make DIR FORTUNES
      trains a byte-level BPE (1024 ids, <|endoftext|> = 0, <|begin_of_text|> = 1) on the fortune files with
      HF `tokenizers`, saves a small random GPT2LMHeadModel with it into DIR/gpt2, and a Llama config
      (no weights) with the same tokenizer into DIR/llama.
  sft_oracle.py pairs FORTUNES
      prints the number of Q/A pairs found by this file's own reading of the fortune files.
  sft_oracle.py check-pairs FORTUNES LIST_JSONL
      checks that sft found the same pairs (text) as this file's own reading, and held out the same
      validation pairs (every 16th, from the 9th).
  sft_oracle.py check-examples MODEL_DIR LIST_JSONL MAX_LENGTH
      checks sft --list-pairs' output: ids are HF tokenizers' ids of prompt then response (then EOS; BOS
      first for a Llama config), and the loss mask is 0 on every target in the prompt, 1 on the response.
  sft_oracle.py loss MODEL_DIR LIST_JSONL MAX_LENGTH
      prints the mean cross entropy over the response tokens of the validation pairs, in fp32, with
      transformers' model and HF tokenizers' ids, built here from the pairs' text.
"""
import json
import os
import re
import sys


def fortune_files(directory):
    names = sorted(n for n in os.listdir(directory) if "." not in n)
    return [os.path.join(directory, n) for n in names
            if os.path.isfile(os.path.join(directory, n)) and not os.path.islink(os.path.join(directory, n))]


def collapse(text):
    """Runs of spaces, tabs and line breaks (only those: not Unicode's other spaces) become one space."""
    return " ".join(part for part in re.split(r"[ \t\r\n]+", text) if part)


def read_pairs(directory):
    """Q/A pairs: a line starting "Q:", its continuation, blank lines, an "A:" line and its continuation up to a
    blank line, a "Q:" line or an attribution ("-- ...")."""
    pairs = []
    for path in fortune_files(directory):
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
        for fortune in re.split(r"^%\n", text, flags=re.M):
            lines = fortune.split("\n")
            if lines and lines[-1] == "":
                lines.pop()
            i = 0
            while i < len(lines):
                if not lines[i].startswith("Q:"):
                    i += 1
                    continue
                question = [lines[i][2:]]
                j = i + 1
                while j < len(lines) and lines[j].strip(" \t\r") and not lines[j].startswith(("Q:", "A:")):
                    question.append(lines[j])
                    j += 1
                while j < len(lines) and not lines[j].strip(" \t\r"):
                    j += 1
                if j == len(lines) or not lines[j].startswith("A:"):
                    i = j
                    continue
                answer = [lines[j][2:]]
                k = j + 1
                while (k < len(lines) and lines[k].strip(" \t\r") and not lines[k].startswith("Q:")
                       and not lines[k].lstrip(" \t").startswith("--")):
                    answer.append(lines[k])
                    k += 1
                q = collapse("\n".join(question))
                a = collapse("\n".join(answer))
                if q and a:
                    pairs.append((q, a))
                i = k
    return pairs


def make(directory, fortunes):
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|begin_of_text|>"], show_progress=False)
    lines = []
    for path in fortune_files(fortunes):
        with open(path, encoding="utf-8", errors="replace") as f:
            lines.extend(f.read().splitlines())
    tokenizer.train_from_iterator(lines, trainer)
    vocab = tokenizer.get_vocab_size()

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=128, n_embd=64, n_layer=2, n_head=4,
                                      bos_token_id=0, eos_token_id=0))
    gpt2.save_pretrained(os.path.join(directory, "gpt2"), safe_serialization=True)
    tokenizer.save(os.path.join(directory, "gpt2", "tokenizer.json"))

    llama = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=0)
    llama.save_pretrained(os.path.join(directory, "llama"))
    tokenizer.save(os.path.join(directory, "llama", "tokenizer.json"))


def expected_ids(model_dir, prompt, response, max_length):
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    vocab = config["vocab_size"]
    if config["model_type"] == "gpt2":
        max_length = min(max_length, config.get("n_positions", 1024))
    bos, eos = config.get("bos_token_id"), config.get("eos_token_id")
    ids = [bos] if config["model_type"] == "llama" and bos is not None and 0 <= bos < vocab else []
    ids += tokenizer.encode(prompt, add_special_tokens=False).ids
    prompt_tokens = len(ids)
    ids += tokenizer.encode(response, add_special_tokens=False).ids
    if eos is not None and 0 <= eos < vocab:
        ids.append(eos)
    return ids[:max_length + 1], prompt_tokens


def read_listing(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    validation = [r for r in rows if r["split"] == "validation"]
    texts = [(r["prompt"], r["response"]) for r in validation]
    train = [r for r in rows if r["split"] == "train"]
    return train, validation, texts


def check_examples(model_dir, listing, max_length):
    train, validation, texts = read_listing(listing)
    assert len(validation) > 0 and len(train) > len(validation), (len(train), len(validation))
    for row in train + validation:
        mask, ids, p = row["loss_mask"], row["ids"], row["prompt_tokens"]
        assert len(mask) == len(ids) - 1
        # target t is ids[t + 1]: a prompt token when t + 1 < prompt_tokens
        assert all(m == 0 for m in mask[:p - 1]), row
        assert all(m == 1 for m in mask[p - 1:]), row
        assert sum(mask) >= 1, row
        ids, p = expected_ids(model_dir, row["prompt"], row["response"], max_length)
        assert row["ids"] == ids, (row["prompt"], row["response"], row["ids"], ids)
        assert row["prompt_tokens"] == p, (row["prompt"], row["prompt_tokens"], p)
    print(f"ok: {len(train) + len(validation)} examples equal HF tokenizers' ids, masks 0 on prompts and 1 on responses")


def check_pairs(fortunes, listing):
    pairs = read_pairs(fortunes)
    train, validation, texts = read_listing(listing)
    assert len(train) + len(validation) == len(pairs), (len(train) + len(validation), len(pairs))
    expected = [(f"Q: {q}\nA:", f" {a}") for i, (q, a) in enumerate(pairs) if i % 16 == 8]
    assert [tuple(t) for t in texts] == expected, "the validation pairs differ"
    rest = [(f"Q: {q}\nA:", f" {a}") for i, (q, a) in enumerate(pairs) if i % 16 != 8]
    assert [(r["prompt"], r["response"]) for r in train] == rest, "the training pairs differ"
    print(f"ok: {len(pairs)} pairs, {len(expected)} held out")


def loss(model_dir, listing, max_length):
    import torch
    from transformers import AutoModelForCausalLM
    _, _, texts = read_listing(listing)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for prompt, response in texts:
            ids, p = expected_ids(model_dir, prompt, response, max_length)
            logits = model(torch.tensor([ids[:-1]])).logits[0].float()
            per_token = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="none")
            total += per_token[p - 1:].double().sum().item()
            count += len(ids) - p
    print(f"{total / count:.10g}")


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "make":
        make(sys.argv[2], sys.argv[3])
    elif command == "pairs":
        print(len(read_pairs(sys.argv[2])))
    elif command == "check-pairs":
        check_pairs(sys.argv[2], sys.argv[3])
    elif command == "check-examples":
        check_examples(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif command == "loss":
        loss(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        raise SystemExit(f"unknown command {command}")
