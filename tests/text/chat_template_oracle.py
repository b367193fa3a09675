"""The oracle of tests/text/chat_template_test.cpp: jinja2 and transformers, never hpctrain.

  chat_template_oracle.py TEMPLATES_DIR OUT_JSON
      renders every tests/data/chat_templates/*.jinja for every conversation below, with and without the
      generation prompt, twice: with jinja2 in transformers' environment (trim_blocks, lstrip_blocks,
      loopcontrols, raise_exception, tojson) and with transformers' apply_chat_template(tokenize=False); exits 1
      if they differ. Writes {"conversations": [...], "renderings": [{template, conversation, generation_prompt,
      text | error, spans}]}, spans being transformers' {% generation %} byte ranges (return_assistant_tokens_mask).
"""
import json
import os
import sys

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi. How can I help?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Q: Why is the sky blue?"},
     {"role": "assistant", "content": "Rayleigh scattering."}, {"role": "user", "content": "And sunsets?\nBriefly."},
     {"role": "assistant", "content": "  Longer path, more red.  "}],
    [{"role": "user", "content": "quotes ' and \" and \\ backslash, {{ braces }} and {% tags %}"},
     {"role": "assistant", "content": "ünïcödé — “smart” ✓ 日本語"}],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": "empty question"}],
    [{"role": "user", "content": "one"}, {"role": "user", "content": "two in a row"}],
    [{"role": "system", "content": "sys"}, {"role": "user", "content": "Question?", "name": "ada lovelace"},
     {"role": "tool", "content": "tool output"}, {"role": "assistant", "content": "Answer.\n"}],
]


def jinja_env():
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def tokenizer_for(template):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2}, unk_token="<unk>")),
                                  bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tok.chat_template = template
    return tok


def main(templates_dir, out_json):
    from transformers.utils.chat_template_utils import _compile_jinja_template, render_jinja_template

    env = jinja_env()
    renderings, failures = [], 0
    for name in sorted(n for n in os.listdir(templates_dir) if n.endswith(".jinja")):
        source = open(os.path.join(templates_dir, name), encoding="utf-8").read()
        # jinja2 itself, in the environment transformers compiles templates with (its {% generation %} extension
        # included); the template is checked to compile in the plain environment too where it has no such tag.
        template = _compile_jinja_template(source)
        if "generation" not in source:
            env.from_string(source)
        tok = tokenizer_for(source)
        for c, conversation in enumerate(CONVERSATIONS):
            for prompt in (False, True):
                entry = {"template": name, "conversation": c, "generation_prompt": prompt}
                try:
                    text = template.render(messages=conversation, add_generation_prompt=prompt, bos_token="<s>", eos_token="</s>",
                                           tools=None, documents=None)
                    entry["text"] = text
                except Exception as error:  # noqa: BLE001 - the oracle records what jinja2 raised
                    entry["error"] = str(error)
                try:
                    theirs = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=prompt)
                    if theirs != entry.get("text"):
                        print(f"jinja2 and transformers differ: {name} conversation {c} prompt {prompt}")
                        failures += 1
                except Exception as error:  # noqa: BLE001
                    if "error" not in entry:
                        print(f"transformers raised where jinja2 did not: {name} {c}: {error}")
                        failures += 1
                if "text" in entry and "generation" in source:
                    rendered, indices = render_jinja_template([conversation], chat_template=source, return_assistant_tokens_mask=True,
                                                              add_generation_prompt=prompt, bos_token="<s>", eos_token="</s>")
                    text = rendered[0]
                    entry["spans"] = [[len(text[:a].encode()), len(text[:b].encode())] for a, b in indices[0]]
                renderings.append(entry)
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump({"conversations": CONVERSATIONS, "renderings": renderings}, f, ensure_ascii=False)
    print(f"{len(renderings)} renderings, {sum('error' in r for r in renderings)} rejected conversations")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
