"""The oracle of tests/models: transformers makes, saves and runs small random models.

  hf_oracle.py make FAMILY CONFIG_JSON DIR IDS [--shard BYTES] [--long LONG_IDS]
      makes a random FAMILY (gpt2 | llama | qwen2 | qwen3 | mistral | phi3 | gemma | gemma2 | gemma3_text) model from CONFIG_JSON (transformers' config fields), saves it
      with save_pretrained into DIR/model (sharded when --shard is given), then runs `expect` on it.
  hf_oracle.py expect MODEL_DIR IDS OUT_DIR [--long LONG_IDS]
      loads MODEL_DIR with from_pretrained and writes OUT_DIR/logits.safetensors (fp32 logits of IDS,
      [1, T, vocab]) and OUT_DIR/generated.json (the 32 tokens of generate(do_sample=False)); with --long, also
      OUT_DIR/long_logits.safetensors, the logits of LONG_IDS: a rotary base or scaling read wrongly shows at
      long positions (the lowest frequencies barely turn within a short prompt).

  hf_oracle.py expect-packed MODEL_DIR IDS POSITIONS DOCUMENTS OUT_DIR
      OUT_DIR/logits.safetensors of one packed row: IDS with position_ids POSITIONS and a 4-D attention mask
      that is causal within each DOCUMENTS id (transformers' custom 4-D masks; one per layer type where layers slide),
      comma-separated lists each.

  hf_oracle.py gradients MODEL_DIR IDS OUT_DIR
      OUT_DIR/gradients.safetensors: the gradient of every parameter (transformers' names, a tied head once, as its
      embedding) of one training step's loss on IDS: the mean cross entropy of each next token, in fp32.

IDS is a comma-separated list of token ids, or `text:PROMPT`: then `make` also trains a byte-level BPE
with HF `tokenizers` (vocabulary = the model's), saves it as DIR/model/tokenizer.json, encodes PROMPT with
it, and writes DIR/prompt_ids.json and DIR/generated.txt (the decoded continuation).
Everything runs in fp32 on the CPU. The same script runs under transformers 4.57 and 5.x (the second oracle leg).
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

NEW_TOKENS = 32


def make(family, config_json, directory, ids, shard=None, long_ids=None):
    torch.manual_seed(1234)
    fields = json.loads(config_json)
    if family == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(**fields))
    elif family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**fields))
    elif family == "qwen2":
        from transformers import Qwen2Config, Qwen2ForCausalLM
        model = Qwen2ForCausalLM(Qwen2Config(**fields))
    elif family == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM
        model = Qwen3ForCausalLM(Qwen3Config(**fields))
    elif family == "mistral":
        from transformers import MistralConfig, MistralForCausalLM
        model = MistralForCausalLM(MistralConfig(**fields))
    elif family == "phi3":
        from transformers import Phi3Config, Phi3ForCausalLM
        model = Phi3ForCausalLM(Phi3Config(**fields))
    elif family == "gemma":
        from transformers import GemmaConfig, GemmaForCausalLM
        model = GemmaForCausalLM(GemmaConfig(**fields))
    elif family == "gemma2":
        from transformers import Gemma2Config, Gemma2ForCausalLM
        model = Gemma2ForCausalLM(Gemma2Config(**fields))
    elif family == "gemma3_text":
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig
        model = Gemma3ForCausalLM(Gemma3TextConfig(**fields))
    else:
        raise SystemExit(f"unknown family {family}")
    # transformers' init (std 0.02) leaves logits near zero, where greedy decoding hangs on near-ties;
    # larger random weights make every comparison sharper.
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 1 and name.endswith("weight"):
                parameter.copy_(1 + 0.1 * torch.randn_like(parameter))
            else:
                parameter.normal_(0.0, 0.1)
    model_dir = os.path.join(directory, "model")
    kwargs = {}  # safetensors is the default of both releases (5.x dropped safe_serialization)
    if shard:
        kwargs["max_shard_size"] = int(shard)
    model.save_pretrained(model_dir, **kwargs)
    tokenizer = None
    if ids.startswith("text:"):
        tokenizer = train_tokenizer(model.config.vocab_size, os.path.join(model_dir, "tokenizer.json"))
        prompt_ids = tokenizer.encode(ids[len("text:"):]).ids
        with open(os.path.join(directory, "prompt_ids.json"), "w") as out:
            json.dump(prompt_ids, out)
        ids = ",".join(str(i) for i in prompt_ids)
    expect(model_dir, ids, directory, long_ids)
    if tokenizer is not None:
        with open(os.path.join(directory, "generated.json")) as generated:
            text = tokenizer.decode(json.load(generated))
        with open(os.path.join(directory, "generated.txt"), "w", encoding="utf-8") as out:
            out.write(text)


def train_tokenizer(vocab_size, path):
    """A byte-level BPE (GPT-2's pre-tokenizer) trained on this file's own text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    with open(__file__, encoding="utf-8") as source:
        tokenizer.train_from_iterator(source.read().splitlines(), trainer)
    tokenizer.save(path)
    return tokenizer


def load(model_dir):
    """The model of MODEL_DIR in fp32. Gemma 2 through transformers' eager attention: its SDPA path skips the
    attention soft-capping its config asks for (eager, flash and flex apply it)."""
    with open(os.path.join(model_dir, "config.json")) as config:
        model_type = json.load(config).get("model_type")
    options = {"attn_implementation": "eager"} if model_type == "gemma2" else {}
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **options)


def expect(model_dir, ids, out_dir, long_ids=None):
    model = load(model_dir)
    model.eval()
    row = lambda text: torch.tensor([[int(i) for i in text.split(",")]], dtype=torch.long)
    input_ids = row(ids)
    with torch.no_grad():
        logits = model(input_ids).logits.float().contiguous()
        generated = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                                   max_new_tokens=NEW_TOKENS, pad_token_id=model.config.eos_token_id)
        long_logits = model(row(long_ids)).logits.float().contiguous() if long_ids else None
    os.makedirs(out_dir, exist_ok=True)
    save_file({"logits": logits}, os.path.join(out_dir, "logits.safetensors"))
    if long_logits is not None:
        save_file({"logits": long_logits}, os.path.join(out_dir, "long_logits.safetensors"))
    with open(os.path.join(out_dir, "generated.json"), "w") as out:
        json.dump(generated[0, input_ids.shape[1]:].tolist(), out)


def expect_packed(model_dir, ids, positions, documents, out_dir):
    model = load(model_dir).eval()
    row = lambda text: torch.tensor([[int(i) for i in text.split(",")]], dtype=torch.long)
    input_ids, position_ids, document_ids = row(ids), row(positions), row(documents)
    t = input_ids.shape[1]
    allowed = (document_ids[:, :, None] == document_ids[:, None, :]) & torch.ones(t, t, dtype=torch.bool).tril()
    additive = lambda keep: torch.zeros(1, 1, t, t).masked_fill(~keep[:, None], torch.finfo(torch.float32).min)
    mask = additive(allowed)
    window = getattr(model.config, "sliding_window", None)
    if window and "sliding_attention" in (getattr(model.config, "layer_types", None) or []):
        # A 4-D mask is taken as it is by every layer; a mapping per layer type keeps the sliding layers' band.
        i = torch.arange(t)
        mask = {"full_attention": mask, "sliding_attention": additive(allowed & (i[:, None] - i[None, :] < window))}
    with torch.no_grad():
        logits = model(input_ids, position_ids=position_ids, attention_mask=mask).logits.float().contiguous()
    os.makedirs(out_dir, exist_ok=True)
    save_file({"logits": logits}, os.path.join(out_dir, "logits.safetensors"))


def gradients(model_dir, ids, out_dir):
    model = load(model_dir).eval()  # no dropout: the step's math without its randomness
    tokens = torch.tensor([[int(i) for i in ids.split(",")]], dtype=torch.long)
    logits = model(tokens).logits
    loss = torch.nn.functional.cross_entropy(logits[0, :-1].float(), tokens[0, 1:])
    loss.backward()
    os.makedirs(out_dir, exist_ok=True)
    grads = {name: p.grad.contiguous() for name, p in model.named_parameters() if p.grad is not None}
    save_file(grads, os.path.join(out_dir, "gradients.safetensors"))
    print(f"loss {loss.item():.8g}, {len(grads)} gradients")


def split_options(args, names):
    """The positional arguments, and the values of the `--name VALUE` options among `names`."""
    positional, options = [], {}
    while args:
        if args[0] in names and len(args) >= 2:
            options[args[0][2:]] = args[1]
            args = args[2:]
        else:
            positional.append(args[0])
            args = args[1:]
    return positional, options


if __name__ == "__main__":
    args, options = split_options(sys.argv[1:], ("--shard", "--long"))
    if args[:1] == ["make"] and len(args) == 5:
        make(*args[1:], shard=options.get("shard"), long_ids=options.get("long"))
    elif args[:1] == ["expect-packed"] and len(args) == 6:
        expect_packed(*args[1:])
    elif args[:1] == ["gradients"] and len(args) == 4:
        gradients(*args[1:])
    elif args[:1] == ["expect"] and len(args) == 4:
        expect(*args[1:], long_ids=options.get("long"))
    else:
        raise SystemExit(__doc__)
