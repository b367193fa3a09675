#!/bin/bash
# The language-model examples as configuration, from the command line (no training): the knobs they declare
# where they use them are listed by --help with their defaults, a value set in code is the built-in knob's
# default, a bad value exits 2 naming the knob; a missing default corpus or tokenizer exits 2 naming the file and
# the variable that names another — a spec error raised while main builds the description, before ht::run,
# which none of the examples catches — and nothing is written.
#   lm_examples_cli_test.sh BUILD/examples/gpt BUILD/examples/roberta BUILD/examples/sft
set -u
gpt=$1 roberta=$2 sft=$3
fail() { echo "FAIL: $*"; exit 1; }
for tokenizer in gpt2.tiktoken roberta-fortunes/tokenizer.json; do
  [ -f "$HOME/.cache/hpctrain/$tokenizer" ] || { echo "skip: needs ~/.cache/hpctrain/$tokenizer (scripts/setup)"; exit 77; }
done
[ -d /usr/share/games/fortunes ] || { echo "skip: needs Debian's fortunes"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1

# --help lists each inline knob once, with its default and check, beside the built-ins.
expect_help() {  # program, then lines --help must hold (as fixed strings)
  local program=$1; shift
  "$program" --help > help.txt 2>&1 || fail "$(basename "$program") --help exited $?: $(cat help.txt)"
  for line in "$@"; do grep -qF -- "$line" help.txt || fail "$(basename "$program") --help lacks '$line':
$(cat help.txt)"; done
}
expect_help "$gpt" "--seq-len N" "tokens per training window (the model's n_positions) (default: 128; must be positive)" \
  "--n-layer N" "transformer blocks (default: 4; must be positive)" \
  "weight decay of the matrices (biases, norms: none) (default: 0.1; must not be negative)" \
  "--max-steps N" "(default: 300; must be positive)" "--prompt TEXT" "--data TEXT" "--text-column TEXT" \
  "the column of documents when --data is a dataset (default: text)"
[ "$(grep -c -- '^  --seq-len ' help.txt)" = 1 ] || fail "gpt --help lists --seq-len $(grep -c -- '^  --seq-len ' help.txt) times"
expect_help "$roberta" "--max-length N" "tokens per block, <s> and </s> included (default: 128; must be positive)" \
  "--hidden N" "--warmup-steps N" "(default: 0.01; must not be negative)"
expect_help "$sft" "--data TEXT" "--max-length N" "(default: 256; must be at least 8)" "--packing [true|false]" "--tools TEXT"
[ "$(grep -c -- '^  --max-length ' help.txt)" = 1 ] || fail "sft --help lists --max-length twice (train and validation use it)"
echo "--help lists the inline knobs"

expect_exit_2() {  # expected message (fixed string), then the command
  local message=$1; shift
  "$@" > out.txt 2> err.txt
  local code=$?
  [ "$code" = 2 ] || fail "$* exited $code, not 2: $(cat err.txt)"
  grep -qF -- "$message" err.txt || fail "$* said '$(cat err.txt)', not '$message'"
  [ -z "$(ls -A | grep -v -e '^out.txt$' -e '^err.txt$' -e '^help.txt$')" ] || fail "$* left files: $(ls -A)"
}
expect_exit_2 "[hpctrain.spec.knob] --seq-len = 0: must be positive" "$gpt" --dry-run --seq-len 0
expect_exit_2 "[hpctrain.spec.knob] --dropout = 2: must be between 0 and 0.99" "$roberta" --dry-run --dropout 2
expect_exit_2 "[hpctrain.spec.knob] --reduce-dtype = fp16: must be fp32 or bf16" "$gpt" --dry-run --reduce-dtype fp16
expect_exit_2 "[hpctrain.spec.reduce_dtype] reduce_dtype = bf16: replicated (--sharding none) all-reduces gradients in fp32 only" \
  "$gpt" --dry-run --reduce-dtype bf16
expect_exit_2 "[hpctrain.spec.reduce_dtype] reduce_dtype = bf16: zero1 all-reduces gradients in fp32 only" \
  "$roberta" --dry-run --sharding zero1 --reduce-dtype bf16
"$gpt" --dry-run --sharding zero2 --reduce-dtype bf16 > out.txt 2> err.txt || fail "gpt --sharding zero2 --reduce-dtype bf16 --dry-run: $(cat err.txt)"
rm -f out.txt err.txt
expect_exit_2 "[hpctrain.spec.prepare.tokenizer] /nonexistent/gpt2.tiktoken: no such file (from HPCTRAIN_GPT_TOKENIZER)" \
  env HPCTRAIN_GPT_TOKENIZER=/nonexistent/gpt2.tiktoken "$gpt" --dry-run
expect_exit_2 "HOME is not set; set HPCTRAIN_ROBERTA_TOKENIZER to the tokenizer file" env -u HOME "$roberta" --dry-run
expect_exit_2 "[hpctrain.spec.prepare.inputs] /nonexistent/corpus: no such directory (from HPCTRAIN_CORPUS)" \
  env HPCTRAIN_CORPUS=/nonexistent/corpus "$gpt" --dry-run
echo "PASS: bad knobs and a missing corpus or tokenizer exit 2 naming them, nothing written"
