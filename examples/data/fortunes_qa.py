#!/usr/bin/env python3
"""Writes fortunes_qa.jsonl: the "Q: ... A: ..." pairs of Debian's fortunes corpus as conversational SFT
examples (TRL's {"messages": [...]} shape), the data examples/sft.cpp fine-tunes on by default.
Kept in git (the corpus is Debian's, the file is small); re-run to regenerate:
  python3 examples/data/fortunes_qa.py /usr/share/games/fortunes > examples/data/fortunes_qa.jsonl
A pair: a line starting "Q:" and its continuation lines, optional blank lines, then a line starting "A:"
and its continuation lines up to a blank line, a "Q:" line or an "-- attribution" line; whitespace runs
collapse to one space."""
import json
import os
import re
import sys


def collapse(text):
    return re.sub(r"[ \t\r\n]+", " ", text).strip()


def pairs_in_fortune(lines):
    i = 0
    while i < len(lines):
        if not lines[i].startswith("Q:"):
            i += 1
            continue
        question = lines[i][2:]
        j = i + 1
        while j < len(lines) and lines[j].strip() and not lines[j].startswith(("Q:", "A:")):
            question += "\n" + lines[j]
            j += 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j == len(lines) or not lines[j].startswith("A:"):
            i = j
            continue
        answer = lines[j][2:]
        k = j + 1
        while k < len(lines) and lines[k].strip() and not lines[k].startswith("Q:") and not lines[k].lstrip().startswith("--"):
            answer += "\n" + lines[k]
            k += 1
        q, a = collapse(question), collapse(answer)
        if q and a:
            yield q, a
        i = k


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/games/fortunes"
    names = sorted(n for n in os.listdir(directory)
                   if os.path.isfile(os.path.join(directory, n)) and not os.path.islink(os.path.join(directory, n)) and "." not in n)
    for name in names:
        with open(os.path.join(directory, name), encoding="utf-8", errors="replace") as f:
            fortune = []
            for line in f.read().split("\n") + ["%"]:
                if line == "%":
                    for q, a in pairs_in_fortune(fortune):
                        print(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]},
                                         ensure_ascii=False))
                    fortune = []
                else:
                    fortune.append(line)


if __name__ == "__main__":
    main()
