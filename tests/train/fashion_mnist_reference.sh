#!/usr/bin/env bash
# The uninterrupted run the preemption test compares with (tests/train/requeue_test.sh): Fashion-MNIST, 2 local
# ranks, 150 steps. A ctest fixture, so that it trains beside other tests, not inside the Slurm lock. Writes "<steps> <parameters_crc32c>"
# to <dir>/reference (atomically: a reader never sees half a line).
#   Usage: fashion_mnist_reference.sh <fashion_mnist binary> <dir>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
# Without the dataset this is a skip with its reason (ctest: SKIP_RETURN_CODE 77), not a failure.
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  { echo "SKIP: Fashion-MNIST is not installed at /usr/share/datasets/fashion-mnist (apt install dataset-fashion-mnist)"; exit 77; }
binary="$(realpath "$1")"
dir="$2"
steps=150  # the tests preempt their run near step 60
rm -rf "$dir"
mkdir -p "$dir"
cd "$dir"
echo "== reference: uninterrupted, 2 local ranks, $steps steps"
HPCTRAIN_RUN_DIR="$dir/run" "$binary" --local 2 --report-digest --max-steps "$steps" --max-eval-examples 1000 > reference.log 2>&1 ||
  fail "reference run failed: $(tail -5 reference.log)"
digest="$(sed -n 's/^parameters_crc32c=//p' reference.log)"
[ -n "$digest" ] || fail "no parameters_crc32c in the reference run: $(tail -5 reference.log)"
echo "$steps $digest" > reference.tmp
mv reference.tmp reference
echo "PASS: $steps steps, parameters_crc32c=$digest"
