#!/usr/bin/env bash
# Issue 12's checks on the real example:
#   --dry-run --array 0-3%2 shows the array directive, the per-task log and run directory, and a per-task requeue;
#   --submit --sweep --max-steps 20 (lr x batch size: 4 combinations) runs one array task per combination on the
#   local cluster, each worker with its combination's values, and --results then lists 4 COMPLETED rows with
#   their final metrics, best first, equal to what each task's metrics.jsonl says (read here with Python).
# Usage: fashion_mnist_sweep_test.sh <fashion_mnist binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
binary="$(realpath "$1")"
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/fashion-mnist-sweep-test.XXXXXX")"
cd "$work"
unset HPCTRAIN_RUN_DIR
root="$work/hpctrain-jobs/fashion_mnist"

# --- the array directive and per-task paths -----------------------------------------------------------
"$binary" --dry-run --array 0-3%2 > dry.log 2> dry.err.log || fail "--dry-run --array 0-3%2 failed"
grep -qxF '#SBATCH --array=0-3%2' dry.log || fail "no array directive"
grep -qxF "#SBATCH --output=$root/%A/slurm-%A_%a.out" dry.log || fail "no per-task log path"
grep -qF "export HPCTRAIN_RUN_DIR=$root/\"\$SLURM_ARRAY_JOB_ID/\${SLURM_ARRAY_JOB_ID}_\${SLURM_ARRAY_TASK_ID}\"" dry.log ||
  fail "no per-task run directory"
grep -qF 'hpctrain_requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' dry.log || fail "the requeue does not target the task"
[ ! -e hpctrain-jobs ] || fail "--dry-run wrote hpctrain-jobs"
echo "ok: --dry-run --array 0-3%2 shows the directive, per-task logs and run directories, a per-task requeue"

# --- a real sweep -------------------------------------------------------------------------------------
"$binary" --dry-run --sweep --max-steps 20 > sweep-dry.log 2>&1 || fail "--dry-run --sweep failed"
grep -qxF '#SBATCH --array=0-3' sweep-dry.log || fail "the sweep's array directive is not 0-3"
grep -qxF '  3) sweep_args=(--lr=0.003 --batch-size=128) ;;  # lr=0.003 batch_size=128' sweep-dry.log ||
  fail "task 3 does not get lr=0.003 batch_size=128"

"$binary" --submit --sweep --max-steps 20 --max-eval-examples 1000 > submit.log 2>&1 || fail "--submit --sweep failed"
id="$(sed -n 's/^submitted job \([0-9]*\)$/\1/p' submit.log)"
[ -n "$id" ] || fail "no job id in submit.log"
echo "submitted sweep $id"
for _ in $(seq 1 600); do
  [ -z "$(squeue --noheader --array --jobs "$id" 2>/dev/null)" ] && break
  sleep 2
done
[ -z "$(squeue --noheader --array --jobs "$id" 2>/dev/null)" ] || fail "the sweep did not finish in 20 minutes"

"$binary" --results > results.log 2> results.err.log || fail "--results exited $?"
cat results.log
head -n 1 results.log | grep -qF "job $id (fashion_mnist): 4 tasks (4 COMPLETED); best first by eval_loss (lower is better)" ||
  fail "the title does not say 4 COMPLETED, ranked by eval_loss"
sed -n 2p results.log | grep -qE '^task +lr +batch_size +state +step +loss +eval_loss +eval_accuracy$' ||
  fail "unexpected header"
[ "$(tail -n +3 results.log | awk '$4 == "COMPLETED" && $5 == 20' | wc -l)" = 4 ] || fail "not 4 COMPLETED rows at step 20"

# The oracle: each task's metrics.jsonl, read by Python — its last loss and last evaluation, ranked by eval_loss.
python3 - "$root/$id" "$id" results.log <<'EOF' || fail "--results disagrees with the tasks' metrics.jsonl"
import json, sys
job_dir, job_id, table = sys.argv[1], sys.argv[2], sys.argv[3]
expected = []
for task in range(4):
    records = [json.loads(line) for line in open(f"{job_dir}/{job_id}_{task}/metrics.jsonl")]
    loss = [r for r in records if "loss" in r][-1]["loss"]
    evaluation = [r for r in records if "eval_loss" in r][-1]
    expected.append((evaluation["eval_loss"], task, loss, evaluation["eval_accuracy"]))
expected.sort()
rows = [line.split() for line in open(table).read().splitlines()[2:]]
grid = {0: ("0.001", "64"), 1: ("0.001", "128"), 2: ("0.003", "64"), 3: ("0.003", "128")}
for (eval_loss, task, loss, accuracy), row in zip(expected, rows):
    want = [str(task), *grid[task], "COMPLETED", "20", f"{loss:.5g}", f"{eval_loss:.5g}", f"{accuracy:.5g}"]
    if row != want:
        sys.exit(f"row {row} != {want}")
print("ok: --results matches metrics.jsonl, best first")
EOF

# Each worker trained with its combination: the announce line gives examples/step/rank (global batch / 2 ranks),
# and the lr of task 2 (3e-3) is 3 times task 0's (1e-3) at every logged step (same schedule).
for task in 0 1 2 3; do
  per_rank=$(( (task % 2 == 0 ? 64 : 128) / 2 ))
  grep -q "^hpctrain: 2 rank(s) on cpu (gloo), .*, $per_rank examples/step/rank," "$root/$id/slurm-${id}_$task.out" ||
    fail "task $task did not train with $per_rank examples/step/rank"
done
python3 - "$root/$id" "$id" <<'EOF' || fail "the lr knob did not reach the workers"
import json, sys
job_dir, job_id = sys.argv[1], sys.argv[2]
lr = lambda task: [r["lr"] for r in map(json.loads, open(f"{job_dir}/{job_id}_{task}/metrics.jsonl")) if "lr" in r]
low, high = lr(0), lr(2)
assert low and len(low) == len(high), (low, high)
assert all(abs(h / l - 3) < 1e-9 for l, h in zip(low, high)), (low, high)
EOF
echo "PASS"
