#!/usr/bin/env bash
# `--sharding` on the real Trainer (Fashion-MNIST, `--local 2`): ZeRO-1 and ZeRO-2 reach Replicated's losses
# (train loss at the last step and the final evaluation) within fp32 tolerance; `--sharding zero4` exits 2
# naming the value before anything is written; `--sharding zero3` on a model that lists no blocks fails
# naming the model.
# Usage: sharding_knob_test.sh <fashion_mnist binary> [steps]
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
fail_tail=20
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  { echo "SKIP: Fashion-MNIST is not installed at /usr/share/datasets/fashion-mnist (apt install dataset-fashion-mnist)"; exit 77; }
binary="$(realpath "$1")"
steps="${2:-30}"
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/sharding-knob-test.XXXXXX")"
cd "$work"

# A bad value: exit 2, the knob and the value named, nothing written.
mkdir refused
status=0
(cd refused && "$binary" --submit --sharding zero4) > refused.out.log 2> refused.err.log || status=$?
[ "$status" = 2 ] || fail "--submit --sharding zero4 exited $status, not 2"
grep -qF -- "--sharding = zero4: must be one of none, zero1, zero2, zero3, hsdp" refused.err.log ||
  fail "--submit --sharding zero4: stderr does not name the knob, the value and the choices"
[ -z "$(ls -A refused)" ] || fail "--submit --sharding zero4 wrote $(ls -A refused)"

# The final train loss and evaluation loss of a run, from its metrics.jsonl.
losses() {
  python3 - "$1" "$steps" <<'PY'
import json, sys
train = evaluation = None
for line in open(sys.argv[1]):
    record = json.loads(line)
    if record.get("step") != int(sys.argv[2]): continue
    if "eval_loss" in record: evaluation = record["eval_loss"]
    elif "loss" in record: train = record["loss"]
print(train, evaluation)
PY
}
run() {  # run <name> [args...]
  local name="$1"; shift
  HPCTRAIN_RUN_DIR="$work/$name" "$binary" --local 2 --max-steps "$steps" --max-eval-examples 1000 "$@" > "$name.log" 2>&1 || fail "$name: exit status $?"
  losses "$work/$name/metrics.jsonl"
}
read -r train_replicated eval_replicated <<< "$(run replicated --sharding none)"
grep -q 'steps, fp32, replicated$' replicated.log || fail "--sharding none did not train replicated"
for stage in zero1 zero2; do
  read -r train eval <<< "$(run "$stage" --sharding "$stage")"
  grep -q "steps, fp32, $stage\$" "$stage.log" || fail "--sharding $stage did not train with $stage"
  python3 - "$train_replicated" "$train" "$eval_replicated" "$eval" "$stage" <<'PY' || fail "$stage's losses differ from Replicated's"
import sys
a, b, c, d, stage = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
train, evaluation = abs(a - b) / abs(a), abs(c - d) / abs(c)
print(f"{stage}: train loss {b:.6f} vs replicated {a:.6f} (rel {train:.2e}); eval loss {d:.6f} vs {c:.6f} (rel {evaluation:.2e})")
sys.exit(0 if train < 1e-4 and evaluation < 1e-4 else 1)
PY
done

# ZeRO-3 needs listed blocks: this CNN lists none.
status=0
HPCTRAIN_RUN_DIR="$work/zero3" "$binary" --local 2 --max-steps 2 --max-eval-examples 1000 --sharding zero3 > zero3.log 2>&1 || status=$?
[ "$status" != 0 ] || fail "--sharding zero3 on a model without blocks() succeeded"
# The model's C++ type, namespace and all (the test build compiles the example inside a namespace of its own).
grep -qE "\[hpctrain\.spec\.sharding\] sharding = zero3: the model \(([A-Za-z_0-9]+::)*NetImpl\) lists no blocks\(\) to shard by" zero3.log ||
  fail "--sharding zero3: no error naming the model"
echo "PASS"
