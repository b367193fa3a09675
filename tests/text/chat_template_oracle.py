"""The oracle of tests/text/chat_template_test.cpp: jinja2 and transformers, never hpctrain.

  chat_template_oracle.py render TEMPLATES_DIR OUT_JSON
      renders every tests/data/chat_templates/*.jinja for every conversation below, with and without the
      generation prompt, the tool-calling ones with and without TOOLS, and once for each of a template's own
      contexts (TEMPLATE_CONTEXTS: Seed-OSS under several thinking budgets), twice: with jinja2 in transformers'
      environment (trim_blocks, lstrip_blocks, loopcontrols, raise_exception, tojson) and with transformers'
      apply_chat_template(tokenize=False); exits 1 if they differ. Writes {"conversations", "tools", "context",
      "compile_errors": {template: message}, "renderings": [{template, conversation, generation_prompt, tools,
      context, text | error + error_type, spans, prefix_spans}]}: spans are transformers' {% generation %} byte
      ranges (return_assistant_tokens_mask); prefix_spans, for templates without generation markers, the byte
      ranges each assistant turn adds to the conversation before it (what hpctrain's prefix rendering finds).
      A template jinja2 cannot compile is listed in compile_errors.

  chat_template_oracle.py masks TOKENIZER_DIR JSONL TOOLS_JSON OUT_JSON TEMPLATE...
      for each template, and each line of an SFT JSONL file ({"messages", "tools"?}; TOOLS_JSON: the file's tools,
      or "-"), the token ids and assistant mask transformers gives ({template file name: [{ids, mask}]}): apply_chat_template(messages, tools=..., tokenize=True,
      return_dict=True, return_assistant_tokens_mask=True) for a template with {% generation %} markers; for one
      without, the tokens overlapping the prefix-rendered assistant spans, found with char_to_token as
      transformers finds its mask.
"""
import json
import os
import re
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
    # 6: thinking tags in the assistant's content
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"},
     {"role": "user", "content": "And times 3?"}, {"role": "assistant", "content": "<think>Multiply.</think>12"}],
    # 7: parallel tool calls with arguments as objects (keys in no sorted order), their results, the answer
    [{"role": "system", "content": "You can call tools."}, {"role": "user", "content": "Weather in Paris and Oslo?"},
     {"role": "assistant", "content": None, "tool_calls": [
         {"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}},
         {"id": "call00002", "type": "function",
          "function": {"name": "get_weather", "arguments": {"location": "Oslo", "unit": "celsius", "days": 2, "hourly": False}}}]},
     {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
     {"role": "tool", "tool_call_id": "call00002", "name": "get_weather", "content": "{\"temperature\": 12, \"sky\": \"rain\"}"},
     {"role": "assistant", "content": "Paris: 21 °C, clear. Oslo: 12 °C, rain."}],
    # 8: a tool call with its arguments as a JSON string (OpenAI's shape), unicode and escapes inside
    [{"role": "user", "content": "Find \"ünïcödé\" docs."},
     {"role": "assistant", "content": "", "tool_calls": [
         {"id": "call00003", "type": "function", "function": {"name": "search", "arguments": "{\"query\": \"ünïcödé \\\"quotes\\\"\", \"limit\": 3}"}}]},
     {"role": "tool", "tool_call_id": "call00003", "name": "search", "content": "[\"doc1\", \"doc2\"]"},
     {"role": "assistant", "content": "Found doc1 and doc2."}],
    # 9: content as lists of text parts (transformers passes them to the template as they are)
    [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
     {"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "text", "text": "this."}]},
     {"role": "assistant", "content": [{"type": "text", "text": "A list of parts."}]}],
    # 10: the reasoning apart from the content
    [{"role": "user", "content": "Why?"}, {"role": "assistant", "reasoning_content": "Because it is.", "content": "It just is."}],
    # 11: one tool call without content or ids, a tool result named by the function
    [{"role": "user", "content": "Weather in Rome?"},
     {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"location": "Rome"}}}]},
     {"role": "tool", "name": "get_weather", "content": "sunny"}, {"role": "assistant", "content": "Sunny in Rome."}],
]

# Rendered with TOOLS as well as without: the conversations that call tools, and a plain one.
TOOL_CONVERSATIONS = [1, 7, 8, 11]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the weather for a place.",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "The city."},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "The unit."},
            "days": {"type": "integer", "description": "Days ahead."}}, "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search documents.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "What to find."},
            "tags": {"type": "array", "items": {"type": "string"}, "description": "Tags to match."},
            "limit": {"type": "integer", "description": "At most this many."}}, "required": ["query"]},
        "return": {"type": "array", "description": "Matching documents."}}},
]

# Variables every rendering gets (a fixed date for Llama 3.x), and those a template needs of its own: it renders
# every conversation once with each context of its list (none: once, with none of its own).
CONTEXT = {"date_string": "26 Jul 2024"}
TEMPLATE_CONTEXTS = {
    "firefunction-v2.jinja": [{"functions": json.dumps([t["function"] for t in TOOLS]), "datetime": "2024-07-26"}],
    # Seed-OSS looks the reflection interval up in an int-keyed dict with dictsort: no budget (-1), 0 (its own
    # branch), a tier's key exactly, one past it, and beyond the last tier (budget_reflections_v05[16384]).
    "seed-oss.jinja": [{}, {"thinking_budget": 0}, {"thinking_budget": 512}, {"thinking_budget": 513},
                       {"thinking_budget": 20000}],
}


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


def has_generation_markers(source):
    """As transformers decides it (render_jinja_template): a {% generation %} tag, not any word 'generation'."""
    return re.search(r"\{\%-?\s*generation\s*-?\%\}", source) is not None


def tokenizer_for(template):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2}, unk_token="<unk>")),
                                  bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tok.chat_template = template
    return tok


def utf8_offset(text, index):
    return len(text[:index].encode())


def prefix_spans(template, conversation, **kwargs):
    """The (character) ranges each assistant turn adds to the conversation before it, as hpctrain's prefix rendering
    finds them: after the rendering of the messages before it with the generation prompt, up to where the whole
    conversation's rendering and the rendering through it part."""
    whole = template.render(messages=conversation, add_generation_prompt=False, **kwargs)
    spans = []
    for i, message in enumerate(conversation):
        if message["role"] != "assistant":
            continue
        before = template.render(messages=conversation[:i], add_generation_prompt=True, **kwargs)
        through = template.render(messages=conversation[:i + 1], add_generation_prompt=False, **kwargs)
        end = 0
        while end < len(through) and end < len(whole) and through[end] == whole[end]:
            end += 1
        if not whole.startswith(before) or end <= len(before):
            return None
        spans.append((len(before), end))
    return whole, spans


def render(templates_dir, out_json):
    from transformers.utils.chat_template_utils import _compile_jinja_template, render_jinja_template

    env = jinja_env()
    renderings, compile_errors, failures = [], {}, 0
    for name in sorted(n for n in os.listdir(templates_dir) if n.endswith(".jinja")):
        source = open(os.path.join(templates_dir, name), encoding="utf-8").read()
        # jinja2 itself, in the environment transformers compiles templates with (its {% generation %} extension
        # included); the template is checked to compile in the plain environment too where it has no such tag.
        try:
            template = _compile_jinja_template(source)
            if not has_generation_markers(source):
                env.from_string(source)
        except Exception as error:  # noqa: BLE001 - the oracle records what jinja2 refused
            compile_errors[name] = f"{type(error).__name__}: {error}"
            continue
        tok = tokenizer_for(source)
        for own, c, tools, prompt in ((own, c, tools, prompt) for own in TEMPLATE_CONTEXTS.get(name, [{}])
                                      for c in range(len(CONVERSATIONS))
                                      for tools in ([None, TOOLS] if c in TOOL_CONVERSATIONS else [None])
                                      for prompt in (False, True)):
            conversation = CONVERSATIONS[c]
            context = {**CONTEXT, **own}
            entry = {"template": name, "conversation": c, "generation_prompt": prompt, "tools": tools is not None,
                     "context": own}
            variables = dict(bos_token="<s>", eos_token="</s>", tools=tools, documents=None, **context)
            try:
                entry["text"] = template.render(messages=conversation, add_generation_prompt=prompt, **variables)
            except Exception as error:  # noqa: BLE001 - the oracle records what jinja2 raised
                entry["error"] = str(error)
                entry["error_type"] = type(error).__name__
            try:
                theirs = tok.apply_chat_template(conversation, tools=tools, tokenize=False, add_generation_prompt=prompt, **context)
                if theirs != entry.get("text"):
                    print(f"jinja2 and transformers differ: {name} conversation {c} prompt {prompt} tools {tools is not None}")
                    failures += 1
            except Exception as error:  # noqa: BLE001
                if "error" not in entry:
                    print(f"transformers raised where jinja2 did not: {name} {c}: {error}")
                    failures += 1
            if "text" in entry and has_generation_markers(source):
                rendered, indices = render_jinja_template([conversation], tools=tools, chat_template=source,
                                                          return_assistant_tokens_mask=True, add_generation_prompt=prompt,
                                                          bos_token="<s>", eos_token="</s>", **context)
                text = rendered[0]
                entry["spans"] = [[utf8_offset(text, a), utf8_offset(text, b)] for a, b in indices[0]]
            elif "text" in entry and not prompt:
                try:
                    found = prefix_spans(template, conversation, **variables)
                except Exception:  # noqa: BLE001 - a prefix the template rejects: hpctrain must raise too
                    found = None
                if found is not None:
                    text, spans = found
                    entry["prefix_spans"] = [[utf8_offset(text, a), utf8_offset(text, b)] for a, b in spans]
            renderings.append(entry)
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump({"conversations": CONVERSATIONS, "tools": TOOLS, "context": CONTEXT, "compile_errors": compile_errors,
                   "renderings": renderings}, f, ensure_ascii=False)
    print(f"{len(renderings)} renderings of {len(renderings and {r['template'] for r in renderings})} templates, "
          f"{sum('error' in r for r in renderings)} rejected conversations, {len(compile_errors)} templates jinja2 refuses")
    return 1 if failures else 0


def masks(tokenizer_dir, jsonl, tools_json, out_json, *template_paths):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    file_tools = None if tools_json == "-" else json.load(open(tools_json, encoding="utf-8"))
    out = {os.path.basename(path): template_masks(tok, open(path, encoding="utf-8").read(), jsonl, file_tools) for path in template_paths}
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump(out, f)
    return 0


def template_masks(tok, source, jsonl, file_tools):
    from transformers.utils.chat_template_utils import _compile_jinja_template

    out = []
    for line in open(jsonl, encoding="utf-8"):
        if not line.strip():
            continue
        record = json.loads(line)
        messages, tools = record["messages"], record.get("tools", file_tools)
        if has_generation_markers(source):
            encoded = tok.apply_chat_template(messages, tools=tools, chat_template=source, tokenize=True, return_dict=True,
                                              return_assistant_tokens_mask=True)
            out.append({"ids": encoded["input_ids"], "mask": encoded["assistant_masks"]})
            continue
        template = _compile_jinja_template(source)
        text, spans = prefix_spans(template, messages, tools=tools, documents=None, **tok.special_tokens_map)
        encoded = tok(text, add_special_tokens=False)
        mask = [0] * len(encoded["input_ids"])
        for begin, end in spans:  # as apply_chat_template marks its generation spans
            first, last = encoded.char_to_token(begin), encoded.char_to_token(end - 1)
            for k in range(first, (last + 1) if last is not None else len(mask)):
                mask[k] = 1
        out.append({"ids": encoded["input_ids"], "mask": mask})
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["render"] and len(sys.argv) == 4:
        sys.exit(render(sys.argv[2], sys.argv[3]))
    if sys.argv[1:2] == ["masks"] and len(sys.argv) >= 7:
        sys.exit(masks(*sys.argv[2:]))
    raise SystemExit(__doc__)
