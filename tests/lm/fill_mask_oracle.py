"""The oracle of tests/lm/roberta_example_test.sh: transformers' pipeline("fill-mask") on the directory that
examples/roberta exported, against build/examples/fill_mask on the same directory and texts.

  fill_mask_oracle.py EXPORT_DIR FILL_MASK_BINARY
      for each text: the top 5 ids of every mask equal, in order, and their probabilities within 1e-4; the
      export loads as a RobertaForMaskedLM whose tied decoder is the word embedding. Exit 0 when all agree.
"""
import re
import subprocess
import sys

TEXTS = ["The best way to predict the future is to <mask> it.", "A <mask> in time saves <mask>.", "<mask>"]
LINE = re.compile(r'^<mask> (\d+): ([0-9.]+) ".*" \(id (\d+)\)$')


def ours(binary, directory, text):
    done = subprocess.run([binary, "--model", directory, "--text", text, "--top-k", "5"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"fill_mask exited {done.returncode}: {done.stderr}")
    masks = {}
    for line in done.stdout.splitlines():
        match = LINE.match(line)
        if not match:
            raise SystemExit(f"fill_mask printed a line of another shape: {line!r}")
        masks.setdefault(int(match[1]), []).append((int(match[3]), float(match[2])))
    return [masks[k] for k in sorted(masks)]


def main(directory, binary):
    from transformers import RobertaForMaskedLM, pipeline

    model = RobertaForMaskedLM.from_pretrained(directory)
    assert model.lm_head.decoder.weight.data_ptr() == model.roberta.embeddings.word_embeddings.weight.data_ptr()
    fill = pipeline("fill-mask", model=directory, tokenizer=directory, top_k=5, device="cpu")
    worst = 0.0
    for text in TEXTS:
        theirs = fill(text)
        if text.count("<mask>") == 1:
            theirs = [theirs]
        mine = ours(binary, directory, text)
        if len(mine) != len(theirs):
            raise SystemExit(f"{text!r}: fill_mask filled {len(mine)} masks, the pipeline {len(theirs)}")
        for m, (a, b) in enumerate(zip(mine, theirs)):
            their_ids = [c["token"] for c in b]
            if [i for i, _ in a] != their_ids:
                raise SystemExit(f"{text!r} mask {m + 1}: fill_mask's ids {[i for i, _ in a]}, the pipeline's {their_ids}")
            worst = max(worst, max(abs(p - c["score"]) for (_, p), c in zip(a, b)))
    if worst > 1e-4:
        raise SystemExit(f"probabilities differ by {worst:.2e} (> 1e-4)")
    print(f"fill-mask: {len(TEXTS)} texts, the same top-5 ids as transformers' pipeline, probabilities within {worst:.1e}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
