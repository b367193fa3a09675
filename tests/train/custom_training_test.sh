#!/usr/bin/env bash
# A user-defined step, evaluation step, metric and logger (examples/custom_training.cpp) run under
# `--local 2`: the run learns the masked task, reports the custom metric, the custom logger writes its
# loss curve, both ranks end with the same parameters; and every snippet docs/training.md shows is the
# same text as in the example that was compiled.
# Usage: custom_training_test.sh <custom_training binary> <source dir>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
binary="$(realpath "$1")"
source_dir="$(realpath "$2")"
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/custom-training-test.XXXXXX")"
cd "$work"

# The docs' snippets are the example's marked regions, verbatim.
for name in custom_step custom_metric custom_logger; do
  awk -v name="$name" '$0 == "// [snippet " name "]" {on = 1; next} $0 == "// [end snippet]" {on = 0} on' \
    "$source_dir/examples/custom_training.cpp" > "snippet-$name.cpp"
  [ -s "snippet-$name.cpp" ] || fail "no snippet $name in examples/custom_training.cpp"
  python3 - "$source_dir/docs/training.md" "snippet-$name.cpp" <<'PY' || fail "docs/training.md does not show snippet $name as compiled"
import sys
docs, snippet = open(sys.argv[1]).read(), open(sys.argv[2]).read()
sys.exit(0 if snippet in docs else 1)
PY
done

HPCTRAIN_RUN_DIR="$work/run" "$binary" --local 2 --report-digest > run.log 2>&1 || fail "exit status $?"
grep -q '^hpctrain: 2 rank(s) on cpu (gloo)' run.log || fail "not 2 Gloo ranks"
grep -q '^step 120/120 ' run.log || fail "no final progress line"
digest="$(sed -n 's/^parameters_crc32c=//p' run.log)"
[ "$(grep -c "^rank [01] parameters_crc32c=$digest\$" run.log)" = 2 ] || fail "the two ranks end with different parameters"
accuracy="$(sed -n 's/^test_masked_accuracy=//p' run.log)"
awk -v a="$accuracy" 'BEGIN { exit !(a > 0.95 && a <= 1) }' || fail "test_masked_accuracy=$accuracy"
grep -q '^test_perplexity=' run.log || fail "no perplexity"
[ "$(head -1 run/loss_curve.csv)" = "step,loss" ] || fail "the custom logger wrote no header"
[ "$(wc -l < run/loss_curve.csv)" = 7 ] || fail "the custom logger wrote $(wc -l < run/loss_curve.csv) lines, not 1 + 6 records"
grep -q '"eval_masked_accuracy"' run/metrics.jsonl || fail "metrics.jsonl lacks the custom metric"
echo "PASS: test_masked_accuracy=$accuracy"
