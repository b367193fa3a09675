#!/usr/bin/env python3
"""docs/lm.md's program snippets are compiled code: every ```cpp block of its user guide (above the
"Interfaces" contract) stands verbatim in examples/sft.cpp, gpt.cpp, roberta.cpp, dpo.cpp or sft_dpo.cpp, which the build compiles
and the sft, GPT, RoBERTa, DPO and SFT-then-DPO tests run; and the README's LoRA walk-through shows examples/sft.cpp whole, from its
first #include.  Usage: lm_docs_test.py SOURCE_DIR"""
import re
import sys

root = sys.argv[1]
guide = open(f"{root}/docs/lm.md").read().split("## Interfaces")[0]
examples = "".join(open(f"{root}/examples/{name}.cpp").read() for name in ("sft", "gpt", "roberta", "dpo", "sft_dpo"))
blocks = re.findall(r"```cpp\n(.*?)```", guide, re.S)
if not blocks:
    sys.exit("FAIL: docs/lm.md shows no cpp snippet")
missing = [b for b in blocks if b not in examples]
for block in missing:
    print(f"FAIL: this snippet of docs/lm.md is not in examples/sft.cpp, gpt.cpp, roberta.cpp, dpo.cpp or sft_dpo.cpp:\n{block}")
print(f"{len(blocks) - len(missing)} of {len(blocks)} snippets are the examples' code")

sft = open(f"{root}/examples/sft.cpp").read()
sft = sft[sft.index("#include <hpctrain/hpctrain.hpp>"):]
readme = open(f"{root}/README.md").read()
walkthrough = readme.split("### Fine-tune a Hugging Face model with LoRA")[1].split("\n### ")[0]
shown = re.findall(r"```cpp\n(.*?)```", walkthrough, re.S)
if shown != [sft]:
    print("FAIL: the README's LoRA walk-through does not show examples/sft.cpp whole (from its first #include)")
    missing.append("README")
else:
    print("the README's walk-through shows examples/sft.cpp whole")
sys.exit(1 if missing else 0)
