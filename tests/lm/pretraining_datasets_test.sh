#!/usr/bin/env bash
# The pretraining examples read a Hugging Face dataset's text column as they read the same documents as text files:
# pyarrow writes 200 documents (unicode, inner newlines, a null and an empty value between them) as a Parquet file
# with row groups of 5 in a column "body", and the same documents as a fortunes-style text file. gpt's preparation
# step (`--data corpus.parquet --text-column body`, and `--data` of a hub download's directory) writes the token
# payload it writes from the text file, byte for byte, and as many tokens as tiktoken's GPT-2 encoding of the
# documents plus one end-of-text each. At --dry-run: a dataset without the column, a truncated shard and a missing
# path exit 2 naming the file, before anything is written; --local 1 trains on the dataset (fp32, 2 steps).
# Usage: pretraining_datasets_test.sh <gpt binary> <roberta binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
fail_tail=40
gpt="$(realpath "$1")" roberta="$(realpath "$2")"
transformers_test_setup pretraining-datasets-test
"$python" -c 'import pyarrow, tiktoken' 2>/dev/null || { echo "SKIP: no pyarrow/tiktoken in $python"; exit 77; }
[ -f "$HOME/.cache/hpctrain/gpt2.tiktoken" ] || { echo "SKIP: needs ~/.cache/hpctrain/gpt2.tiktoken (scripts/setup)"; exit 77; }

"$python" - "$HOME/.cache/hpctrain/gpt2.tiktoken" > oracle.txt <<'PY'
import os, sys
import pyarrow as pa, pyarrow.parquet as pq, tiktoken
from tiktoken.load import load_tiktoken_bpe
docs = [f"Fortune {i}: « ünïcödé {i * 7} »\n  indented line {i}\n" + ("last line\n" if i % 3 else "") for i in range(200)]
docs[4] = "one line only\n"
os.makedirs("text", exist_ok=True)
with open("text/corpus", "w", encoding="utf-8") as out:
    out.write("".join(doc + "%\n" for doc in docs))
column = docs[:9] + [None] + docs[9:17] + [""] + docs[17:]  # a null and an empty value are no documents
table = pa.table({"id": list(range(len(column))), "body": column})
pq.write_table(table, "corpus.parquet", row_group_size=5)
os.makedirs("hub/data", exist_ok=True)
pq.write_table(table.rename_columns(["id", "text"]), "hub/data/train-00000-of-00001.parquet", row_group_size=5)
pq.write_table(table.slice(0, 12), "truncated.parquet", row_group_size=5)
with open("truncated.parquet", "r+b") as f:
    f.truncate(os.path.getsize("truncated.parquet") - 40)
r50k = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""  # GPT-2's, as tiktoken has it
encoding = tiktoken.Encoding("gpt2", pat_str=r50k, mergeable_ranks=load_tiktoken_bpe(sys.argv[1]), special_tokens={})
print(sum(len(encoding.encode_ordinary(doc)) + 1 for doc in docs))
PY
expected_tokens="$(cat oracle.txt)"

expect_exit_2() {  # expected message (fixed string), then the arguments
  local message=$1; shift
  local code=0
  (cd empty && "$@") > out.txt 2> err.txt || code=$?
  [ "$code" = 2 ] || fail "$* exited $code, not 2: $(cat err.txt)"
  grep -qF -- "$message" err.txt || fail "$* said '$(cat err.txt)', not '$message'"
  [ -z "$(ls -A empty)" ] || fail "$* left files: $(ls -A empty)"
}
mkdir empty
expect_exit_2 "$work/corpus.parquet" "$gpt" --dry-run --data "$work/corpus.parquet"
grep -qF "no column 'text'" err.txt || fail "a dataset without the column: $(cat err.txt)"
expect_exit_2 "$work/truncated.parquet" "$roberta" --dry-run --data "$work/truncated.parquet" --text-column body
expect_exit_2 "[hpctrain.spec.prepare.inputs] $work/nowhere: no such file or directory" "$gpt" --dry-run --data "$work/nowhere"
"$gpt" --dry-run --data "$work/corpus.parquet" --text-column body > dry.log 2>&1 || fail "--dry-run of the dataset exited $?"
echo "PASS: at --dry-run a missing column, a truncated shard or a missing path exits 2 naming the file"

prepare() {  # name, then the data arguments: gpt's preparation step alone, as the job's script runs it
  local name=$1; shift
  HPCTRAIN_RUN_DIR="$work/$name" "$gpt" --hpctrain-prepare "$@" > "$name.log" 2>&1 || fail "the preparation of $* exited $?"
  for file in train val; do tail -c +65 "$work/$name/prepare/tokens/$file.tokens" > "$name.$file.ids"; done
}
prepare text --data "$work/text"
prepare parquet --data "$work/corpus.parquet" --text-column body
prepare hub --data "$work/hub"
for file in train val; do
  cmp -s text.$file.ids parquet.$file.ids || fail "$file.tokens: the Parquet column's ids differ from the text file's"
  cmp -s text.$file.ids hub.$file.ids || fail "$file.tokens: the hub directory's ids differ from the text file's"
done
counted="$(sed -n 's/^hpctrain: prepared \([0-9]*\) training and \([0-9]*\) validation tokens.*/\1 \2/p' parquet.log)"
[ -n "$counted" ] && [ "$(( ${counted% *} + ${counted#* } ))" = "$expected_tokens" ] ||
  fail "prepared '$counted' tokens; tiktoken counts $expected_tokens: $(cat parquet.log)"
echo "PASS: the dataset's column prepares the text file's ids ($expected_tokens tokens, as tiktoken counts)"

HPCTRAIN_RUN_DIR="$work/local" "$gpt" --local 1 --data "$work/corpus.parquet" --text-column body --max-steps 2 \
  --precision fp32 --n-layer 2 --n-embd 32 --n-head 2 --max-eval-examples 16 --log-every 1 --sample-tokens 4 \
  > local.log 2>&1 ||
  fail "gpt --local 1 on the dataset exited $?"
grep -q '^step 2/2 .* loss ' local.log || fail "gpt --local 1 on the dataset did not take 2 steps"
echo "PASS: gpt trains on the dataset's column under --local 1 (fp32)"
