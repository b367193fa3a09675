#!/usr/bin/env bash
# Issue 53, item 4: the SFT data mistakes that silently ruin a fine-tune are found at --dry-run, before anything is
# written or queued (text/sft_checks.hpp), on the sft_oracle.py model (BOS <|begin|> added by its post-processor, EOS
# <|end|>, a template whose {% generation %} block holds the answer and the EOS):
#  - a doubled BOS (a template writing bos_token twice; a "text" record that begins with the BOS the tokenizer adds
#    again): exit 2 naming the file, the line and the two ids;
#  - an end of turn outside the loss (the EOS after {% endgeneration %}): exit 2 naming the line and the token;
#  - a template that ends turns in text (no end-of-turn token): a warning with the count, once, exit 0;
#  - a template that ends turns with another special token than EOS: one warning naming both, exit 0;
#  - no trained token in the whole file (every answer cut by --max-length): exit 2 before anything is queued;
#  - the oracle's own data and template: no refusal, no warning;
#  - --show-example N prints record N with its trained text marked, its ids and its mask, once.
# Usage: sft_checks_test.sh <sft binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
fail_tail=40
sft="$(realpath "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
transformers_test_setup sft-checks-test
"$python" "$here/sft_oracle.py" make "$work" "$fortunes" > make.log 2>&1 || fail "the oracle could not make the start model"

# with_template NAME TEMPLATE: a copy of llama/ whose chat template is TEMPLATE.
with_template() {
  mkdir -p "$1" && cp llama/* "$1/"
  "$python" - "$1" "$2" <<'PY' || fail "could not write the template of $1"
import json, os, sys
directory, template = sys.argv[1], sys.argv[2]
if os.path.exists(os.path.join(directory, "chat_template.jinja")):
    open(os.path.join(directory, "chat_template.jinja"), "w").write(template)
config_path = os.path.join(directory, "tokenizer_config.json")
config = json.load(open(config_path))
if "chat_template" in config or not os.path.exists(os.path.join(directory, "chat_template.jinja")):
    config["chat_template"] = template
json.dump(config, open(config_path, "w"))
PY
}
turns() {  # a conversation template with PART standing for what follows the user's message
  echo "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}[USER] {{ message['content'] }}
{% elif message['role'] == 'assistant' %}[BOT] $1{% endif %}{% endfor %}"
}
# dry NAME ARGS...: sft --dry-run ARGS in dry/, its status in $status, its output in NAME.log; nothing written.
dry() {
  local name="$1"
  shift
  status=0
  mkdir -p dry
  (cd dry && "$sft" --dry-run "$@") > "$name.log" 2>&1 || status=$?
  [ ! -e dry/hpctrain-jobs ] || fail "$name: something was written"
}
refused() {  # refused NAME PATTERN ARGS...
  local name="$1" pattern="$2"
  shift 2
  dry "$name" "$@"
  [ "$status" = 2 ] || fail "$name: exit status $status, not 2"
  grep -q -- "$pattern" "$name.log" || fail "$name: the message does not match: $pattern"
}
warned() {  # warned NAME PATTERN ARGS...
  local name="$1" pattern="$2"
  shift 2
  dry "$name" "$@"
  [ "$status" = 0 ] || fail "$name: exit status $status, not 0"
  [ "$(grep -c -- "$pattern" "$name.log")" = 1 ] || fail "$name: not one warning matching: $pattern"
}

# The oracle's own template and data: nothing to say.
dry clean --from ../llama --data ../conversations.jsonl
[ "$status" = 0 ] || fail "clean data: exit status $status"
! grep -q "warning" clean.log || fail "clean data: a warning: $(grep warning clean.log)"

with_template twice_bos "{{ bos_token }}$(turns "{% generation %}{{ message['content'] }}{{ eos_token }}{% endgeneration %}
")"
refused "doubled BOS (template)" \
  '\[hpctrain.spec.data.jsonl\] .*conversations.jsonl:1: the example starts with BOS twice ("<|begin|>" (1), "<|begin|>" (1); [0-9]* of [0-9]* examples checked)' \
  --from ../twice_bos --data ../conversations.jsonl

printf '%s\n' '{"text": "<|begin|>Q: Why? A: Because."}' '{"text": "Q: Who? A: Nobody."}' > text.jsonl
refused "doubled BOS (text)" 'text.jsonl:1: the example starts with BOS twice' --from ../llama --data ../text.jsonl

with_template eos_outside "$(turns "{% generation %}{{ message['content'] }}{% endgeneration %}{{ eos_token }}
")"
refused "end of turn outside the loss" \
  'conversations.jsonl:1: an assistant turn ends before "<|end|>" (0), which takes no loss ([0-9]* of [0-9]* examples checked): the model would never learn to stop' \
  --from ../eos_outside --data ../conversations.jsonl

with_template open_turns "$(turns "{% generation %}{{ message['content'] }}{% endgeneration %}
")"
warned "turns ending in text" 'warning: .*conversations.jsonl: [0-9]* of [0-9]* examples have an assistant turn that ends in text' \
  --from ../open_turns --data ../conversations.jsonl

with_template pad_ends "$(turns "{% generation %}{{ message['content'] }}<|pad|>{% endgeneration %}
")"
warned "EOS differs" "warning: the tokenizer's EOS is \"<|end|>\" (0) but the chat template ends assistant turns with \"<|pad|>\" (2)" \
  --from ../pad_ends --data ../conversations.jsonl

refused "no trained token" '\[hpctrain.spec.data.jsonl\] .*conversations.jsonl: no example has a trained token ([0-9]* read)' \
  --from ../llama --data ../conversations.jsonl --max-length 8
# --show-example N: record N as the model sees it, the trained text marked, its ids and its mask.
dry show --from ../llama --data ../conversations.jsonl --show-example 2
[ "$status" = 0 ] || fail "--show-example 2: exit status $status"
grep -q '^example 2 (../conversations.jsonl:2): [0-9]* tokens, [0-9]* trained' show.log || fail "--show-example: no header line"
grep -q '⟦.*<|end|>⟧' show.log || fail "--show-example: no trained span ending with the EOS"
grep -q '^ids:  1 ' show.log && grep -q '^mask: 0 ' show.log || fail "--show-example: no ids or mask line"
[ "$(grep -c '^example 2' show.log)" = 1 ] || fail "--show-example printed the example more than once"
refused "show beyond the file" '\[hpctrain.spec.knob\] --show-example = 100000: ' --from ../llama --data ../conversations.jsonl \
  --show-example 100000
echo "ok: every data mistake refused or warned at --dry-run, and --show-example shows an example"
