#!/usr/bin/env bash
# examples/sft reads a Hugging Face dataset on disk as it reads the same rows as JSONL: the conversations of
# sft_oracle.py written by `datasets` as a hub download (Parquet shards, row groups of 7) and as a save_to_disk
# folder, and exported by `Dataset.to_json`. For each, `--show-example` prints the same ids and mask at login; the
# worker (one rank, tokenizing itself) starts from the same response_loss_before and takes the same first steps;
# under --local the job's preparation step prepares the directory and the rank reads the prepared file. A truncated
# shard exits 2 at --dry-run naming the file, before anything is written.
# Two sources mixed by weight (--data fx/hub:0.7,QA.jsonl:0.3, fp32, --local 1): the preparation step prepares each
# (the new arguments prepare again: the --local run above left its marker; fx/hub's file is found by its digest),
# rank 0 names each source's rows, weight, share of an epoch (the weights' share of the slots, within one) and the
# passes the run reads; meta.json keeps each source's position (adding up to the slots the steps read); a run
# preempted by SIGTERM and run again resumes and ends with the uninterrupted run's parameters digest and losses, bit
# for bit. A bad mix exits 2 at --dry-run naming the entry.
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

# Two sources mixed by weight, exact resume.
qa="$here/../../examples/data/fortunes_qa.jsonl"
mix=(--data "fx/hub:0.7,$qa:0.3" --precision fp32 --max-steps 30 --checkpoint-every 5 --log-every 1 --report-digest)
log=mix-whole.log
HPCTRAIN_RUN_DIR="$work/mix-whole" "$sft" "${args[@]}" "${mix[@]}" --local 1 > mix-whole.log 2>&1 ||
  fail "the mixed run exited $?"
# fx/hub was prepared by the --local run above (the same digest), the Q/A file is new.
grep -q '^hpctrain: fx/hub: already prepared in ' mix-whole.log && grep -qF "hpctrain: prepared $qa: " mix-whole.log ||
  fail "the preparation step did not prepare both sources"
grep -q '^hpctrain: fx/hub: .* examples read (prepared by the job: ' mix-whole.log &&
  grep -qF "hpctrain: $qa: 172 examples read (prepared by the job: " mix-whole.log || fail "a rank did not read a prepared source"
"$python" - mix-whole.log mix-whole/checkpoints <<'PY' || fail "the mix's shares or its checkpointed positions are wrong"
import glob, json, re, sys
lines = [l for l in open(sys.argv[1]) if l.startswith("hpctrain: data mix: ")]
pattern = r"hpctrain: data mix: (.*): (\d+) rows, weight ([0-9.e+-]+): (\d+) of an epoch's (\d+) examples"
found = [re.match(pattern, l).groups() for l in lines]
assert len(found) == 2, lines
rows = [int(f[1]) for f in found]
weights = [float(f[2]) for f in found]
shares = [int(f[3]) for f in found]
slots = int(found[0][4])
assert slots == sum(rows), (slots, rows)
assert sum(shares) == slots, (shares, slots)
for share, weight in zip(shares, weights):
    assert abs(share - slots * weight / sum(weights)) < 1, (share, slots, weight)
meta = json.load(open(sorted(glob.glob(sys.argv[2] + "/step-*/meta.json"))[-1]))
positions = [s["position"] for s in meta["data_sources"]]
assert [s["rows"] for s in meta["data_sources"]] == rows, meta
# 16 examples a step (the global batch): whole epochs of every source's share, then this epoch's slots read.
assert sum(positions) == meta["epoch"] * slots + meta["batch_in_epoch"] * 16, (positions, meta)
print(f"mix: {rows} rows, shares {shares} of {slots}; at step {meta['step']}: positions {positions}")
PY
whole_digest="$(value parameters_crc32c mix-whole.log)"
[ -n "$whole_digest" ] || fail "no parameters digest from the mixed run"

preempt_at_step 7 mix-resumed mix-preempted.log env HPCTRAIN_RUN_DIR="$work/mix-resumed" "$sft" "${args[@]}" "${mix[@]}" --local 1
[ -n "$stopped_at" ] && [ "$stopped_at" -lt 30 ] || fail "the mixed run was not preempted before its end"
log=mix-resumed.log
HPCTRAIN_RUN_DIR="$work/mix-resumed" "$sft" "${args[@]}" "${mix[@]}" --local 1 > mix-resumed.log 2>&1 ||
  fail "the resumed mixed run exited $?"
grep -q "^resumed from .* at step $stopped_at " mix-resumed.log || fail "the mixed run did not resume at step $stopped_at"
! grep -q "mix differs from the checkpoint" mix-resumed.log || fail "the resume found another mix than the checkpoint's"
[ "$(value parameters_crc32c mix-resumed.log)" = "$whole_digest" ] ||
  fail "preempted at step $stopped_at and resumed: digest $(value parameters_crc32c mix-resumed.log), uninterrupted $whole_digest"
train_losses() { "$python" -c 'import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "loss" in r and "eval_loss" not in r and r["step"] > int(sys.argv[2]): print(r["step"], repr(r["loss"]))' "$1" "$2"; }
train_losses mix-whole/metrics.jsonl "$stopped_at" > whole.losses
train_losses mix-resumed/metrics.jsonl "$stopped_at" | sort -un > resumed.losses
[ -s whole.losses ] && cmp -s whole.losses resumed.losses || fail "the resumed losses differ: $(diff whole.losses resumed.losses | head -4)"

# A bad mix: exit 2 at --dry-run naming the entry.
set +e
"$sft" "${args[@]}" --data "fx/hub:0.7,$qa" --dry-run > bad-mix.log 2>&1
rc=$?
set -e
[ "$rc" = 2 ] && grep -qF "[hpctrain.spec.data.mix] --data entry '$qa'" bad-mix.log ||
  log=bad-mix.log fail "a mix with a weight missing: exit $rc"
echo "PASS: response_loss_before=$hub_before from Parquet shards, save_to_disk and JSONL alike; a truncated shard exits 2;" \
  "a two-source mix resumed at step $stopped_at ends with the uninterrupted digest $whole_digest"
