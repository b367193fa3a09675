#!/usr/bin/env bash
# `--local 2` trains Fashion-MNIST for a few steps on two ranks of this machine and leaves its record in
# the run directory: checkpoints, metrics.jsonl and a TensorBoard event file, and a test_accuracy line.
# Usage: local_training_test.sh <fashion_mnist binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
# Without the dataset this is a skip with its reason (ctest: SKIP_RETURN_CODE 77), not a failure.
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  { echo "SKIP: Fashion-MNIST is not installed at /usr/share/datasets/fashion-mnist (apt install dataset-fashion-mnist)"; exit 77; }
binary="$(realpath "$1")"
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/local-training-test.XXXXXX")"
cd "$work"
HPCTRAIN_RUN_DIR="$work/run" "$binary" --local 2 --report-digest --max-steps 40 --max-eval-examples 1000 > run.log 2>&1 || fail "exit status $?"
grep -q '^hpctrain: 2 rank(s) on cpu (gloo)' run.log || fail "not 2 Gloo ranks"
grep -q '^step 40/40 ' run.log || fail "no final progress line"
digest="$(sed -n 's/^parameters_crc32c=//p' run.log)"
[ "$(grep -c "^rank [01] parameters_crc32c=$digest\$" run.log)" = 2 ] || fail "the two ranks end with different parameters"
accuracy="$(sed -n 's/^test_accuracy=//p' run.log)"
awk -v a="$accuracy" 'BEGIN { exit !(a > 0.5 && a <= 1) }' || fail "test_accuracy=$accuracy after 40 steps"
[ -f run/checkpoints/step-0000000040/meta.json ] && [ -f run/checkpoints/step-0000000040/rank-00000.hpct ] || fail "no final checkpoint"
grep -q '"step":40' run/metrics.jsonl || fail "metrics.jsonl lacks step 40"
ls run/tensorboard/events.out.tfevents.* > /dev/null || fail "no TensorBoard event file"
# A second run in the same directory resumes from the final checkpoint and only evaluates.
HPCTRAIN_RUN_DIR="$work/run" "$binary" --local 2 --max-steps 40 --max-eval-examples 1000 > rerun.log 2>&1 || fail "rerun failed"
grep -q '^resumed from .* at step 40 ' rerun.log || fail "rerun did not resume at step 40"
grep -q "^test_accuracy=$accuracy\$" rerun.log || fail "rerun evaluated differently"
echo "PASS: test_accuracy=$accuracy"
