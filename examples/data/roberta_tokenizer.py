"""A RoBERTa-style tokenizer for examples/roberta.cpp, made once by scripts/setup (no model hub here): GPT-2's
byte-level BPE scheme trained on Debian's fortunes, RoBERTa's specials <s> <pad> </s> <unk> <mask> as ids 0-4,
its post-processor (<s> $A </s>), saved as transformers saves roberta-base's (tokenizer.json and its config).
A user of seed 002 points the example at roberta-base's own directory instead.

  roberta_tokenizer.py OUT_DIR [VOCAB_SIZE]      (default vocabulary: 8192)
"""
import glob
import os
import sys


def main(out, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    files = sorted(f for f in glob.glob("/usr/share/games/fortunes/*")
                   if os.path.isfile(f) and not os.path.islink(f) and not f.endswith(".dat"))
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train(files, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")))
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                            mask_token="<mask>", cls_token="<s>", sep_token="</s>", model_max_length=512).save_pretrained(out)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 8192)
