"""The oracle of tests/text/sft_data_test.cpp: HF tokenizers and transformers' AutoTokenizer, never hpctrain.

  pretrained_oracle.py make DIR
      four tokenizer directories saved by transformers (DIR/<kind>: plain byte-level BPE, a Llama-3-shaped
      TemplateProcessing BOS, RoBERTa's RobertaProcessing, BERT's BertProcessing), each a small BPE trained on
      some fortunes, and DIR/expected.json: for each kind and text, AutoTokenizer's ids with and without
      special tokens, and tokenizers' encode(add_special_tokens=True).
"""
import json
import os
import sys

TEXTS = ["Q: Why?\nA: Because.", "  leading spaces and <s> inside", "ünïcödé — “quotes”", "x", "<|begin|>already there"]


def make(directory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    corpus = os.path.join(directory, "corpus.txt")
    with open("/usr/share/games/fortunes/fortunes", encoding="utf-8", errors="replace") as f:
        text = f.read()[:200000]
    with open(corpus, "w") as f:
        f.write(text)
    kinds = {
        "plain": (["<|end|>"], None, dict(eos_token="<|end|>")),
        "llama3": (["<|end|>", "<|begin|>"], lambda t: processors.TemplateProcessing(
            single="<|begin|> $A", pair="<|begin|> $A <|begin|> $B", special_tokens=[("<|begin|>", t.token_to_id("<|begin|>"))]),
            dict(bos_token="<|begin|>", eos_token="<|end|>")),
        "roberta": (["<s>", "<pad>", "</s>", "<unk>", "<mask>"], lambda t: processors.RobertaProcessing(
            ("</s>", t.token_to_id("</s>")), ("<s>", t.token_to_id("<s>"))),
            dict(bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>", mask_token="<mask>")),
        "bert": (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], lambda t: processors.BertProcessing(
            ("[SEP]", t.token_to_id("[SEP]")), ("[CLS]", t.token_to_id("[CLS]"))),
            dict(cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]")),
    }
    expected = {}
    for kind, (specials, post, tokens) in kinds.items():
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train([corpus], trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        if post:
            tok.post_processor = post(tok)
        out = os.path.join(directory, kind)
        PreTrainedTokenizerFast(tokenizer_object=tok, **tokens).save_pretrained(out)
        auto = AutoTokenizer.from_pretrained(out)
        expected[kind] = [{"text": t, "with": auto(t)["input_ids"], "without": auto(t, add_special_tokens=False)["input_ids"],
                           "tokenizers": tok.encode(t, add_special_tokens=True).ids} for t in TEXTS]
    with open(os.path.join(directory, "expected.json"), "w") as f:
        json.dump(expected, f, ensure_ascii=False)


if __name__ == "__main__":
    if sys.argv[1:2] == ["make"] and len(sys.argv) == 3:
        make(sys.argv[2])
    else:
        raise SystemExit(__doc__)
