"""The PEFT oracle of tests/models/lora_test.cpp: peft and transformers, never hpctrain.

  lora_oracle.py expect BASE_DIR ADAPTER_DIR IDS OUT_DIR
      PeftModel.from_pretrained(base, ADAPTER_DIR): OUT_DIR/logits.safetensors (fp32 logits of IDS); then
      merge_and_unload(): OUT_DIR/merged.safetensors (its state dict, for comparing with our merged export).
  lora_oracle.py make BASE_DIR IDS OUT_DIR
      a LoRA adapter made by PEFT (r 4, alpha 12, q_proj/v_proj/up_proj, B random so it changes the logits)
      saved to OUT_DIR/adapter, and the adapted model's logits of IDS in OUT_DIR/logits.safetensors.
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM


def logits_of(model, ids):
    input_ids = torch.tensor([[int(i) for i in ids.split(",")]], dtype=torch.long)
    with torch.no_grad():
        return model(input_ids).logits.float().contiguous()


def expect(base_dir, adapter_dir, ids, out_dir):
    from peft import PeftModel
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    os.makedirs(out_dir, exist_ok=True)
    save_file({"logits": logits_of(model, ids)}, os.path.join(out_dir, "logits.safetensors"))
    merged = model.merge_and_unload()
    save_file({k: v.contiguous() for k, v in merged.state_dict().items()}, os.path.join(out_dir, "merged.safetensors"))


def make(base_dir, ids, out_dir):
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(11)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=12, target_modules=["q_proj", "v_proj", "up_proj"], lora_dropout=0.0))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05)
    model.eval()
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(os.path.join(out_dir, "adapter"))
    save_file({"logits": logits_of(model, ids)}, os.path.join(out_dir, "logits.safetensors"))


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["expect"] and len(args) == 5:
        expect(*args[1:])
    elif args[:1] == ["make"] and len(args) == 4:
        make(*args[1:])
    else:
        raise SystemExit(__doc__)
