#!/usr/bin/env bash
# The W&B logger online in a real training program: `fashion_mnist --local 2 --wandb` with WANDB_BASE_URL at a local
# stand-in for W&B's API (tests/loggers/wandb_recording_server.py, which records every request) creates the run and
# streams rank 0's history: one row per logged step, each with the loss metrics.jsonl holds for it, in order, at
# offsets that count lines; then the summary and the end (complete, exit code 0); the key arrives as basic auth and
# is in no log. The offline run beside the stream is whole (wandb's reader, tests/loggers/wandb_oracle.py) and marked
# synced. A W&B that answers 500 changes nothing in the training: exit code 0, the same offline run, one line saying
# the stream stopped.
# Usage: wandb_live_training_test.sh <fashion_mnist binary>
set -euo pipefail
here="$(dirname "$(realpath "${BASH_SOURCE[0]}")")"
source "$here/../support/shell_test_support.sh"
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  { echo "SKIP: Fashion-MNIST is not installed at /usr/share/datasets/fashion-mnist (apt install dataset-fashion-mnist)"; exit 77; }
python="${HPCTRAIN_PYTHON:-$HOME/.cache/hpctrain/venv/bin/python}"
oracle="$here/../loggers/wandb_oracle.py"
server="$here/../loggers/wandb_recording_server.py"
set +e; probe="$("$python" "$oracle" probe 2>&1)"; status=$?; set -e
[ "$status" = 77 ] && { echo "$probe"; exit 77; }  # SKIP: no wandb with its reader in this python
[ "$status" = 0 ] || fail "the oracle cannot start: $probe"
binary="$(realpath "$1")"
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/wandb-live-training-test.XXXXXX")"
cd "$work"
knobs=(--max-steps 40 --log-every 5 --eval-every 20 --max-eval-examples 200 --wandb)
key="hpctrain-live-test-key-0123456789"

# start_server NAME [OPTION...]: the recording server in the background, recording to NAME.requests.jsonl; its stdin
# is our fd 3 (closing it stops the server). Sets $url.
start_server() {
  local name=$1
  shift
  mkfifo "$name.control"
  "$python" "$server" "$name.requests.jsonl" --port-file "$name.port" "$@" < "$name.control" > "$name.server.log" 2>&1 &
  server_pid=$!
  exec 3> "$name.control"
  on_fail="exec 3>&-; kill $server_pid 2>/dev/null"
  wait_for "[ -s '$name.port' ]" 120 0.1 || fail "the recording server did not start"
  url="http://127.0.0.1:$(cat "$name.port")"
}
stop_server() {
  exec 3>&-
  wait "$server_pid" || true
  on_fail=""
}
# train NAME: fashion_mnist --local 2 --wandb online against $url, into run-NAME, its output in NAME.log.
train() {
  env WANDB_MODE=online WANDB_BASE_URL="$url" WANDB_API_KEY="$key" WANDB__FILE_STREAM_TRANSMIT_INTERVAL=0 \
    WANDB__FILE_STREAM_RETRY_MAX=1 HPCTRAIN_RUN_DIR="$work/run-$1" "$binary" --local 2 "${knobs[@]}" > "$1.log" 2>&1 ||
    fail "fashion_mnist --local 2 --wandb (online, $1) exited $?"
}

echo "== online: the run, every logged loss in order, the summary and the end reach W&B"
start_server live
train live
stop_server
grep -q "logs live to $url" live.log || fail "no line saying the run is live"
if grep -rq "$key" live.log run-live; then fail "the API key is in a log or the run directory"; fi
"$python" - live.requests.jsonl run-live/metrics.jsonl "$key" <<'EOF' || fail "the requests are not what wandb sends"
import json, sys
requests = [json.loads(line) for line in open(sys.argv[1])]
metrics = [json.loads(line) for line in open(sys.argv[2])]
key = sys.argv[3]
assert all(r["basic_auth"] == ["api", key] and r["status"] == 200 for r in requests), "auth or status"
upsert = requests[0]
assert upsert["path"] == "/graphql" and upsert["body"]["operationName"] == "UpsertBucket", upsert["path"]
variables = upsert["body"]["variables"]
assert variables["project"] == "fashion_mnist", variables["project"]
config = json.loads(variables["config"])
assert config["max_steps"]["value"] == 40 and config["hpctrain"]["value"]["world_size"] == 2, config
stream = f"/files/hpctrain-entity/fashion_mnist/{variables['name']}/file_stream"
rows, summary = [], None
for r in requests[1:]:
    assert r["path"] == stream, r["path"]
    files = r["body"].get("files", {})
    if "wandb-history.jsonl" in files:
        chunk = files["wandb-history.jsonl"]
        assert chunk["offset"] == len(rows), f"history offset {chunk['offset']} after {len(rows)} rows"
        rows += [json.loads(line) for line in chunk["content"]]
    if "wandb-summary.json" in files:
        summary = json.loads(files["wandb-summary.json"]["content"][0])
losses = {m["step"]: m["loss"] for m in metrics if "loss" in m}
steps = [row["_step"] for row in rows]
assert steps == sorted(set(steps)), f"rows out of order: {steps}"
assert set(losses) <= set(steps), f"logged steps {sorted(losses)} not all in the rows {steps}"
for row in rows:
    assert "_runtime" in row and "_timestamp" in row, row
    if row["_step"] in losses:
        assert row["train/loss"] == losses[row["_step"]], f"step {row['_step']}: {row['train/loss']} != {losses[row['_step']]}"
evals = {m["step"]: m["eval_loss"] for m in metrics if "eval_loss" in m}
assert all(row["eval/loss"] == evals[row["_step"]] for row in rows if row["_step"] in evals), "eval losses"
assert summary["_step"] == steps[-1] and summary["train/loss"] == losses[max(losses)], summary
assert requests[-1]["body"].get("complete") is True and requests[-1]["body"].get("exitcode") == 0, requests[-1]["body"]
print(f"PASS: {len(rows)} rows with {len(losses)} train losses in {len(requests) - 1} file stream requests")
EOF
ls run-live/wandb/offline-run-*/run-*.wandb.synced > /dev/null || fail "the offline run is not marked synced"
"$python" "$oracle" training run-live > live-oracle.log 2>&1 || fail "wandb's reader refused the offline run"
grep -q 'PASS: 1 attempt(s) of run' live-oracle.log || fail "unexpected oracle verdict: $(cat live-oracle.log)"

echo "== W&B answers 500: the training is untouched, the stream stops saying so once, the offline run is whole"
start_server failing --mode 500
train failing
stop_server
[ "$(grep -c "W&B live logging to $url stopped" failing.log)" = 1 ] || fail "not one line saying the stream stopped"
grep -q "upload it with --wandb-sync" failing.log || fail "no word of --wandb-sync"
grep -q '^step 40/40' failing.log || fail "the training did not reach step 40"
ls run-failing/wandb/offline-run-*/run-*.wandb.synced > /dev/null 2>&1 && fail "a stream that stopped marked its run synced"
"$python" "$oracle" training run-failing > failing-oracle.log 2>&1 || fail "wandb's reader refused the offline run"
grep -q 'PASS: 1 attempt(s) of run' failing-oracle.log || fail "unexpected oracle verdict: $(cat failing-oracle.log)"
echo "PASS"
