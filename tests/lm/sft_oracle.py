"""The oracle of the SFT test (tests/lm/sft_test.sh): transformers and HF tokenizers, never hpctrain.

  sft_oracle.py make DIR FORTUNES
      DIR/llama: a small random LlamaForCausalLM (a config no other test uses) saved by transformers, with a
      byte-level BPE trained on the fortunes by HF tokenizers (BOS added by a TemplateProcessing post-processor,
      as Llama 3's is) and a chat template of its own with {% generation %} markers, as TRL's
      assistant_only_loss wants; DIR/conversations.jsonl: conversations made from the fortunes (system prompts,
      several turns, quotes and non-ASCII text) that no other test reads; DIR/broken.jsonl: the same with
      line 7 broken.
  sft_oracle.py make-sharded DIR LAYERS HIDDEN INTERMEDIATE
      DIR/sharded: a larger random Llama (after `make`, with DIR/llama's tokenizer and chat template) saved by
      transformers in bf16 as several safetensors shards with an index (model.safetensors.index.json).
  sft_oracle.py make-family DIR FAMILY
      DIR/FAMILY: a small random model of another family (after `make`, with DIR/llama's tokenizer and chat
      template) saved by transformers in fp32, and DIR/FAMILY-bf16 the same weights in bf16 (the base a LoRA run in
      bf16 holds under zero3, so that PEFT's view of its adapter starts from the same weights): `qwen3` (query and key norms, a head dimension of 16 that is not
      hidden / heads), `llama3.2` (Llama 3.2's shape: the head tied to the embedding, llama3 rope scaling of
      factor 32) or `phi3` (Phi-3's modules: q/k/v in one qkv_proj, gate/up in one gate_up_proj; grouped-query
      attention and Phi-3-mini's sliding window of 2047). The norms' weights are drawn around 1 so that a norm read
      wrongly shows in the losses.
  sft_oracle.py loss MODEL_DIR JSONL MAX_LENGTH
      the mean cross entropy over the assistant tokens of the held-out conversations (every 16th, from the
      9th), fp32: transformers' apply_chat_template (assistant mask from the template), truncated to
      MAX_LENGTH, and transformers' model.
  sft_oracle.py from-config-losses MODEL_DIR JSONL MAX_LENGTH SEEDS
      the same loss for MODEL_DIR's config built by AutoModelForCausalLM.from_config with random weights, once per
      seed 0..SEEDS-1: their mean and standard deviation.
  sft_oracle.py export-check FP32_DIR BF16_DIR
      two exports of the same trained model by hpctrain (--export-dtype fp32 and bf16): each index names exactly
      the tensors of its shards and their total size; every bf16 tensor is the fp32 one rounded to bf16
      (round-to-nearest-even, as torch rounds); config.json states each dtype; transformers'
      AutoModelForCausalLM loads both, and the bf16 export's logits (computed in fp32) are the fp32 export's
      within the first-order bound of bf16's rounding (below).
  sft_oracle.py peft-check BASE_DIR EXPORT_DIR
      PeftModel.from_pretrained(BASE_DIR, EXPORT_DIR) (our adapter) gives the logits of transformers' model
      loaded from EXPORT_DIR/merged (our merged export) and of its own merge_and_unload(), within 1e-4.
"""
import json
import os
import sys

TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}[SYS] {{ message['content'] | trim }}\n"
    "{% elif message['role'] == 'user' %}[USER] {{ message['content'] | trim }}\n"
    "{% elif message['role'] == 'assistant' %}[BOT] {% generation %}{{ message['content'] | trim }}{{ eos_token }}{% endgeneration %}\n"
    "{% else %}{{ raise_exception('unknown role: ' + message['role']) }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}[BOT] {% endif %}"
)


def fortunes(directory):
    names = sorted(n for n in os.listdir(directory) if "." not in n)
    for name in names:
        path = os.path.join(directory, name)
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                for fortune in f.read().split("\n%\n"):
                    lines = [line.strip() for line in fortune.strip().split("\n") if line.strip()]
                    if len(lines) >= 3:
                        yield lines


def make(work, directory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    import torch

    files = [os.path.join(directory, n) for n in sorted(os.listdir(directory)) if "." not in n
             and os.path.isfile(os.path.join(directory, n)) and not os.path.islink(os.path.join(directory, n))]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|end|>", "<|begin|>", "<|pad|>"]
    tok.train(files, trainers.BpeTrainer(vocab_size=768, special_tokens=specials,
                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<|begin|> $A", pair="<|begin|> $A <|begin|> $B",
                                                       special_tokens=[("<|begin|>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin|>", eos_token="<|end|>", pad_token="<|pad|>")
    fast.chat_template = TEMPLATE
    out = os.path.join(work, "llama")
    fast.save_pretrained(out)
    torch.manual_seed(7)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=3, max_position_embeddings=512,
                         rope_theta=20000.0, bos_token_id=1, eos_token_id=0, pad_token_id=2, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)

    systems = [None, "You answer in the style of a fortune cookie.", None, "Réponds brièvement — «merci»."]
    lines_out = []
    for i, lines in enumerate(fortunes(directory)):
        if i % 37 != 0:
            continue
        messages = []
        system = systems[(i // 37) % len(systems)]
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": lines[0]})
        messages.append({"role": "assistant", "content": " ".join(lines[1:3])})
        if len(lines) > 4:
            messages.append({"role": "user", "content": "And then? \"" + lines[3] + "\""})
            messages.append({"role": "assistant", "content": " ".join(lines[4:6])})
        lines_out.append(json.dumps({"messages": messages}, ensure_ascii=False))
    with open(os.path.join(work, "conversations.jsonl"), "w") as f:
        f.write("\n".join(lines_out) + "\n")
    broken = list(lines_out[:12])
    broken[6] = broken[6][:-3]  # line 7: cut inside the JSON
    with open(os.path.join(work, "broken.jsonl"), "w") as f:
        f.write("\n".join(broken) + "\n")
    print(f"{len(lines_out)} conversations, vocabulary {len(fast)}")


def load_model(model_dir):
    """MODEL_DIR in fp32; Gemma 2 through eager attention, which applies its attention soft-capping (SDPA skips it)."""
    import torch
    from transformers import AutoModelForCausalLM

    with open(os.path.join(model_dir, "config.json")) as config:
        eager = json.load(config).get("model_type") == "gemma2"
    options = {"attn_implementation": "eager"} if eager else {}
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **options)


def loss(model_dir, jsonl, max_length):
    from transformers import AutoTokenizer

    print(f"{masked_loss(load_model(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir), jsonl, max_length):.8g}")


def from_config_losses(model_dir, jsonl, max_length, seeds):
    """The start loss of MODEL_DIR's config built by AutoModelForCausalLM.from_config (random weights, fp32), once per
    seed 0..SEEDS-1: prints their mean and standard deviation, what a model built from the config alone should fall in."""
    import statistics
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    losses = []
    for seed in range(seeds):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        losses.append(masked_loss(model, tokenizer, jsonl, max_length))
    print(f"{statistics.mean(losses):.8g} {statistics.stdev(losses):.8g}")


def masked_loss(model, tokenizer, jsonl, max_length):
    """MODEL's loss on the assistant tokens of JSONL's held-out conversations (every 16th from the 9th), rendered by
    TOKENIZER's chat template and cut at MAX_LENGTH: what sft logs as response_loss_before."""
    import torch

    records = [json.loads(line) for line in open(jsonl) if line.strip()]
    held_out = [r for i, r in enumerate(records) if i % 16 == 8]
    total, count = 0.0, 0
    for record in held_out:
        rendered = tokenizer.apply_chat_template(record["messages"], tools=record.get("tools"), tokenize=True, return_dict=True,
                                                 return_assistant_tokens_mask=True)
        ids = rendered["input_ids"][:max_length]
        mask = rendered["assistant_masks"][:max_length]
        labels = torch.tensor([i if m else -100 for i, m in zip(ids, mask)])
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        per_token = torch.nn.functional.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="sum")
        total += per_token.item()
        count += int((labels[1:] != -100).sum())
    return total / count


def make_tools(work, template_file):
    """llama-tools: the start model with a ChatML template that renders tools and tool calls (the assistant's turns,
    its calls included, in {% generation %}; tool results outside), and tools.jsonl: 32 conversations in TRL's tool
    shape (a "tools" column, assistant tool_calls with dict arguments, tool messages) built from conversations.jsonl."""
    import shutil
    from transformers import AutoTokenizer

    source, out = os.path.join(work, "llama"), os.path.join(work, "llama-tools")
    shutil.copytree(source, out, dirs_exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.chat_template = open(template_file).read()
    if os.path.exists(os.path.join(out, "chat_template.jinja")):
        os.remove(os.path.join(out, "chat_template.jinja"))
    tokenizer.save_pretrained(out)
    tools = [{"type": "function", "function": {"name": "fortune", "description": "A fortune by its number",
                                                "parameters": {"type": "object", "properties": {"n": {"type": "integer"}},
                                                               "required": ["n"]}}}]
    records = [json.loads(line) for line in open(os.path.join(work, "conversations.jsonl")) if line.strip()]
    lines = []
    for n, record in enumerate(records[:32]):
        user = next(m["content"] for m in record["messages"] if m["role"] == "user")
        answer = next(m["content"] for m in record["messages"] if m["role"] == "assistant")
        messages = [{"role": "user", "content": f"Fortune {n}, please: {user}"},
                    {"role": "assistant", "content": "",
                     "tool_calls": [{"type": "function", "function": {"name": "fortune", "arguments": {"n": n}}}]},
                    {"role": "tool", "name": "fortune", "content": answer},
                    {"role": "assistant", "content": answer}]
        lines.append(json.dumps({"messages": messages, "tools": tools}, ensure_ascii=False))
    with open(os.path.join(work, "tools.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")


def peft_check(base_dir, export_dir):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[1, 5, 17, 300, 42, 9, 250, 77, 128, 3]])
    base = load_model(base_dir)
    adapted = PeftModel.from_pretrained(base, export_dir).eval()
    merged = load_model(os.path.join(export_dir, "merged")).eval()
    with torch.no_grad():
        theirs, ours = adapted(ids).logits, merged(ids).logits
        unloaded = adapted.merge_and_unload()(ids).logits
        plain = load_model(base_dir).eval()(ids).logits
    print(f"adapter vs merged export {(theirs - ours).abs().max().item():.3g}, merge_and_unload vs merged export "
          f"{(unloaded - ours).abs().max().item():.3g}, the adapter moved the logits by {(theirs - plain).abs().max().item():.3g}")
    ok = (theirs - ours).abs().max() < 1e-4 and (unloaded - ours).abs().max() < 1e-4 and (theirs - plain).abs().max() > 1e-3
    sys.exit(0 if ok else 1)


def check_index(directory):
    """The shards of an export as its index lists them; exits naming the file when they disagree."""
    from safetensors import safe_open

    index = json.load(open(os.path.join(directory, "model.safetensors.index.json")))
    files = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))
    mapped = sorted(set(index["weight_map"].values()))
    if files != mapped:
        sys.exit(f"{directory}: the index names the shards {mapped}, the directory holds {files}")
    total, tensors = 0, {}
    for name in files:
        with safe_open(os.path.join(directory, name), framework="pt") as shard:
            for key in shard.keys():
                if index["weight_map"].get(key) != name:
                    sys.exit(f"{directory}/{name}: {key} is in the shard, the index says {index['weight_map'].get(key)}")
                tensors[key] = shard.get_tensor(key)
                total += tensors[key].numel() * tensors[key].element_size()
    if set(tensors) != set(index["weight_map"]):
        sys.exit(f"{directory}: the index lists {sorted(set(index['weight_map']) - set(tensors))} that no shard holds")
    if index["metadata"]["total_size"] != total:
        sys.exit(f"{directory}: metadata.total_size is {index['metadata']['total_size']}, the shards hold {total} bytes")
    return tensors, len(files)


def export_check(fp32_dir, bf16_dir):
    import torch
    from transformers import AutoModelForCausalLM

    fp32, fp32_shards = check_index(fp32_dir)
    bf16, bf16_shards = check_index(bf16_dir)
    for directory, dtype, tensors in ((fp32_dir, "float32", fp32), (bf16_dir, "bfloat16", bf16)):
        config = json.load(open(os.path.join(directory, "config.json")))
        if config.get("torch_dtype") != dtype or config.get("dtype") != dtype:
            sys.exit(f"{directory}/config.json: dtype {config.get('dtype')}, torch_dtype {config.get('torch_dtype')}; written: {dtype}")
        wrong = [k for k, t in tensors.items() if t.dtype != getattr(torch, dtype)]
        if wrong:
            sys.exit(f"{directory}: {wrong[0]} is {tensors[wrong[0]].dtype}, not {dtype}")
    if set(fp32) != set(bf16):
        sys.exit(f"the exports name other tensors: {sorted(set(fp32) ^ set(bf16))}")
    for key in fp32:
        if not torch.equal(fp32[key].to(torch.bfloat16), bf16[key]):
            sys.exit(f"{key}: the bf16 export is not the fp32 export rounded to bf16")
    ids = torch.tensor([[1, 5, 17, 300, 42, 9, 250, 77, 128, 3, 64, 200]])
    exact = AutoModelForCausalLM.from_pretrained(fp32_dir, dtype=torch.float32).eval()
    rounded = AutoModelForCausalLM.from_pretrained(bf16_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        reference, logits = exact(ids).logits, rounded(ids).logits
    # bf16 keeps 8 significant bits: each weight moves by at most 2^-9 of itself. To first order each rounded
    # matrix on the way to the logits (the embedding, 7 a layer: q, k, v, o, gate, up, down, and the head) moves
    # them by at most 2^-9 of their size, and these add up; second-order terms are 2^-9 times smaller.
    matrices = 7 * exact.config.num_hidden_layers + 2
    bound = matrices * 2.0 ** -9 * reference.abs().max().item()
    difference = (logits - reference).abs().max().item()
    print(f"{len(fp32)} tensors in {fp32_shards} fp32 shards and {bf16_shards} bf16 shards; bf16 logits differ by "
          f"{difference:.3g} (bound {bound:.3g}, largest logit {reference.abs().max().item():.3g})")
    sys.exit(0 if difference <= bound else 1)


def make_sharded(work, layers, hidden, intermediate):
    import shutil
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    source, out = os.path.join(work, "llama"), os.path.join(work, "sharded")
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(source):
        if name.startswith("tokenizer") or name in ("special_tokens_map.json", "chat_template.jinja"):
            shutil.copy(os.path.join(source, name), out)
    small = json.load(open(os.path.join(source, "config.json")))
    torch.manual_seed(11)
    config = LlamaConfig(vocab_size=small["vocab_size"], hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 256,
                         max_position_embeddings=512, rope_theta=500000.0, bos_token_id=1, eos_token_id=0, pad_token_id=2,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    total = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out, safe_serialization=True, max_shard_size=f"{max(1, total * 2 // 4 // 1000000)}MB")
    shards = [n for n in os.listdir(out) if n.endswith(".safetensors")]
    print(f"{total} parameters in bf16, {len(shards)} shards")


def make_family(work, family):
    import shutil
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    source, out = os.path.join(work, "llama"), os.path.join(work, family)
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(source):
        if name.startswith("tokenizer") or name in ("special_tokens_map.json", "chat_template.jinja"):
            shutil.copy(os.path.join(source, name), out)
    vocab = json.load(open(os.path.join(source, "config.json")))["vocab_size"]
    common = dict(vocab_size=vocab, intermediate_size=88, num_hidden_layers=2, max_position_embeddings=512,
                  bos_token_id=1, eos_token_id=0, pad_token_id=2)
    torch.manual_seed(13)
    if family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(hidden_size=40, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                             rope_theta=1000000.0, tie_word_embeddings=False, **common))
    elif family == "llama3.2":
        scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 64}
        model = LlamaForCausalLM(LlamaConfig(hidden_size=48, num_attention_heads=6, num_key_value_heads=2,
                                             rope_theta=500000.0, rope_scaling=scaling, tie_word_embeddings=True,
                                             **common))
    elif family == "phi3":
        from transformers import Phi3Config, Phi3ForCausalLM
        model = Phi3ForCausalLM(Phi3Config(hidden_size=48, num_attention_heads=6, num_key_value_heads=2,
                                           rope_theta=10000.0, sliding_window=2047, tie_word_embeddings=False,
                                           original_max_position_embeddings=512, **common))
    elif family == "gemma2":  # Gemma 2's own caps (50, 30), windows of 16 on layer 0 within rows of 64
        from transformers import Gemma2Config, Gemma2ForCausalLM
        model = Gemma2ForCausalLM(Gemma2Config(hidden_size=40, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                               query_pre_attn_scalar=16, sliding_window=16, **common))
    elif family == "gemma3_text":  # layer 0 slides (a window of 16, rope base 10000), layer 1 is global (1e6)
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig
        model = Gemma3ForCausalLM(Gemma3TextConfig(hidden_size=40, num_attention_heads=4, num_key_value_heads=2,
                                                   head_dim=16, query_pre_attn_scalar=16, sliding_window=16,
                                                   sliding_window_pattern=2, rope_theta=1000000.0,
                                                   rope_local_base_freq=10000.0, **common))
    else:
        sys.exit(f"unknown family {family}")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(1 + 0.1 * torch.randn_like(parameter))
    model.save_pretrained(out, safe_serialization=True)
    shutil.copytree(out, out + "-bf16", ignore=shutil.ignore_patterns("*.safetensors", "config.json"))
    model.to(torch.bfloat16).save_pretrained(out + "-bf16", safe_serialization=True)
    print(f"{family}: {sum(p.numel() for p in model.parameters())} parameters")


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "make":
        make(sys.argv[2], sys.argv[3])
    elif command == "make-tools":
        make_tools(sys.argv[2], sys.argv[3])
    elif command == "make-sharded":
        make_sharded(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif command == "make-family":
        make_family(sys.argv[2], sys.argv[3])
    elif command == "export-check":
        export_check(sys.argv[2], sys.argv[3])
    elif command == "peft-check":
        peft_check(sys.argv[2], sys.argv[3])
    elif command == "loss":
        loss(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif command == "from-config-losses":
        from_config_losses(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        sys.exit(f"unknown command {command}")
