"""The oracle of tests/models/roberta_test.cpp: transformers' RobertaForMaskedLM, never hpctrain.

  roberta_oracle.py make CONFIG_JSON DIR
      a random RobertaForMaskedLM (transformers' config fields) saved to DIR/model, and for one right-padded
      batch (DIR/batch.safetensors: input_ids, attention_mask, labels with -100 off the masked positions) its
      fp32 logits (DIR/logits.safetensors) and masked-LM loss (DIR/loss.json).
  roberta_oracle.py expect MODEL_DIR DIR OUT_DIR
      the logits of MODEL_DIR (an export of ours) on DIR's batch: OUT_DIR/logits.safetensors.
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import RobertaConfig, RobertaForMaskedLM

IDS = [[0, 5, 17, 300, 42, 9, 250, 2], [0, 77, 128, 3, 2, 1, 1, 1]]
MASK = [[1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0, 0]]
LABELS = [[-100, -100, 17, -100, 42, -100, -100, -100], [-100, 77, -100, -100, -100, -100, -100, -100]]


def make(config_json, directory):
    torch.manual_seed(4321)
    model = RobertaForMaskedLM(RobertaConfig(**json.loads(config_json)))
    with torch.no_grad():  # sharper than transformers' init (std 0.02), so comparisons mean something
        for name, parameter in model.named_parameters():
            if parameter.dim() == 1 and name.endswith("weight"):
                parameter.copy_(1 + 0.1 * torch.randn_like(parameter))
            elif parameter.dim() == 1:
                parameter.normal_(0, 0.05)
            else:
                parameter.normal_(0, 0.1)
    model.eval()
    model.save_pretrained(os.path.join(directory, "model"), safe_serialization=True)
    batch = {"input_ids": torch.tensor(IDS), "attention_mask": torch.tensor(MASK), "labels": torch.tensor(LABELS)}
    save_file(batch, os.path.join(directory, "batch.safetensors"))
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    save_file({"logits": out.logits.float().contiguous()}, os.path.join(directory, "logits.safetensors"))
    with open(os.path.join(directory, "loss.json"), "w") as f:
        json.dump({"loss": out.loss.item()}, f)


def expect(model_dir, directory, out_dir):
    model = RobertaForMaskedLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    batch = load_file(os.path.join(directory, "batch.safetensors"))
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    os.makedirs(out_dir, exist_ok=True)
    save_file({"logits": logits.float().contiguous()}, os.path.join(out_dir, "logits.safetensors"))


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["make"] and len(args) == 3:
        make(args[1], args[2])
    elif args[:1] == ["expect"] and len(args) == 4:
        expect(*args[1:])
    else:
        raise SystemExit(__doc__)
