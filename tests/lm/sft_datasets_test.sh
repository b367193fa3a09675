#!/usr/bin/env bash
# examples/sft reads a Hugging Face dataset on disk as it reads the same rows as JSONL: the conversations of
# sft_oracle.py written by `datasets` as a hub download (Parquet shards, row groups of 7) and as a save_to_disk
# folder, and exported by `Dataset.to_json`. For each, `--show-example` prints the same ids and mask at login; the
# worker (one rank, tokenizing itself) starts from the same response_loss_before and takes the same first steps;
# under --local the job's preparation step prepares the directory and the rank reads the prepared file. A truncated
# shard exits 2 at --dry-run naming the file, before anything is written.
# Usage: sft_datasets_test.sh <sft binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
fail_tail=40
sft="$(realpath "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
transformers_test_setup sft-datasets-test
"$python" -c 'import datasets, pyarrow' 2>/dev/null || { echo "SKIP: no datasets/pyarrow in $python"; exit 77; }
value() { sed -n "s/^$1=\([^ ]*\).*/\1/p" "$2" | tail -1; }
"$python" "$here/sft_oracle.py" make "$work" "$fortunes" > make.log 2>&1 || fail "the oracle could not make the start model"
"$python" "$here/../datasets/datasets_fixtures.py" make "$work/fx" conversations.jsonl > fixtures.log 2>&1 ||
  fail "datasets could not write the fixtures"
args=(--from llama --max-length 256)

# At login: the same example, ids and mask, from the three.
for data in fx/hub fx/saved fx/export.jsonl; do
  "$sft" "${args[@]}" --data "$data" --show-example 5 --dry-run > "show-${data//\//_}.log" 2>&1 ||
    fail "--show-example with --data $data exited $?"
  sed -n '/^ids: /p; /^mask: /p' "show-${data//\//_}.log" > "ids-${data//\//_}.txt"
  [ -s "ids-${data//\//_}.txt" ] || fail "--data $data: no ids shown"
done
cmp -s ids-fx_hub.txt ids-fx_export.jsonl.txt || fail "the hub Parquet's example 5 differs from the JSONL export's"
cmp -s ids-fx_saved.txt ids-fx_export.jsonl.txt || fail "the save_to_disk folder's example 5 differs from the JSONL export's"

# The worker, one rank: the same held-out loss and the same first steps.
for data in fx/hub fx/export.jsonl; do
  HPCTRAIN_RUN_DIR="$work/run-${data//\//_}" "$sft" --hpctrain-worker "${args[@]}" --data "$data" --max-steps 2 \
    --log-every 1 > "train-${data//\//_}.log" 2>&1 || fail "the worker with --data $data exited $?"
done
hub_before="$(value response_loss_before train-fx_hub.log)"
jsonl_before="$(value response_loss_before train-fx_export.jsonl.log)"
[ -n "$hub_before" ] && [ "$hub_before" = "$jsonl_before" ] ||
  fail "response_loss_before: $hub_before from the Parquet shards, $jsonl_before from the JSONL export"
losses() { grep -o '^step [0-9]*/[0-9]* epoch [0-9]* loss [^ ]*' "$1"; }
[ -n "$(losses train-fx_hub.log)" ] && [ "$(losses train-fx_hub.log)" = "$(losses train-fx_export.jsonl.log)" ] ||
  fail "the first steps' losses differ: $(losses train-fx_hub.log | tr '\n' ' ') against $(losses train-fx_export.jsonl.log | tr '\n' ' ')"

# --local: the preparation step prepares the directory; the rank reads the prepared file.
HPCTRAIN_RUN_DIR="$work/local" "$sft" "${args[@]}" --data fx/hub --max-steps 1 --local 1 > local.log 2>&1 ||
  fail "sft --data fx/hub --local 1 exited $?"
grep -q '^hpctrain: prepared fx/hub: 136 examples' local.log || fail "--local: the preparation step did not prepare fx/hub"
grep -q '^hpctrain: fx/hub: .* examples read (prepared by the job: ' local.log || fail "--local: the rank did not read the prepared file"
[ "$(value response_loss_before local.log)" = "$hub_before" ] ||
  fail "response_loss_before: $(value response_loss_before local.log) from the prepared file, $hub_before tokenized in the rank"

# A truncated shard: exit 2 at --dry-run, naming it, nothing written.
cp -r fx/hub broken
shard=broken/data/train-00001-of-00002.parquet
head -c 3000 fx/hub/data/train-00001-of-00002.parquet > "$shard"
set +e
HPCTRAIN_RUN_DIR="$work/broken-run" "$sft" "${args[@]}" --data broken --dry-run > broken.log 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || fail "a truncated shard: exit $rc, not 2"
grep -qF "[hpctrain.spec.data.dataset] $shard: not a readable Parquet file" broken.log || fail "the error does not name the shard"
[ ! -e "$work/broken-run" ] || fail "a refused --dry-run wrote $work/broken-run"
echo "PASS: response_loss_before=$hub_before from Parquet shards, save_to_disk and JSONL alike; a truncated shard exits 2"
