#!/usr/bin/env bash
# `--check-fabric` with the real example: instead of training, the job's own ranks time all-reduce, all-gather and
# reduce-scatter (the step's own calls) of 8 B up to --check-fabric-max, doubling, and rank 0 prints them as
# nccl-tests' <kind>_perf does; on 2 nodes, HSDP's groups (within each node, across nodes) at the largest message,
# the slowest node, and the slowest group across nodes against the fabric's figure. Checked on the local Slurm
# cluster (2 nodes x 2 tasks, Gloo) with a site file stating an expected bus bandwidth, and with --local 3: every
# table's sizes and counts (an all-gather's and a reduce-scatter's rounded down to a slice a rank), #wrong 0,
# algbw = size / time and busbw = algbw x 2(n-1)/n or (n-1)/n recomputed from the printed time (bounds: the printed
# digits' rounding, derived per row), no training step. No speed is asserted: --check-fabric-min-fraction is checked
# against figures no loopback reaches (100000 GB/s) and any reaches (10 GB/s x 0.0001).
# Usage: check_fabric_test.sh <fashion_mnist binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
binary="$(realpath "$1")"
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/check-fabric-test.XXXXXX")"
cd "$work"
unset HPCTRAIN_RUN_DIR
job=""
trap '[ -n "$job" ] && scancel "$job" 2>/dev/null || true' EXIT

# check_table LOG RANKS MAX_BYTES: every row of the three tables, and their totals.
check_table() {
  local file="$1" ranks="$2" max="$3"
  grep -q "^# hpctrain --check-fabric: all_reduce, all_gather and reduce_scatter over $ranks rank(s) on " "$file" ||
    fail "no header for $ranks ranks"
  grep -q "^# minBytes 8 maxBytes $max step: 2(factor) warmup iters: 5 iters: 20 validation: 1\$" "$file" ||
    fail "the header does not state 8..$max"
  [ "$(grep -c '^# Out of bounds values : 0 OK$' "$file")" = 3 ] || fail "a result was wrong, or a table is missing"
  [ "$(grep -c '^# Avg bus bandwidth    : [0-9.e+-]*$' "$file")" = 3 ] || fail "no average bus bandwidth"
  grep -q '^step ' "$file" && fail "it trained"
  local kind
  for kind in all_reduce all_gather reduce_scatter; do
    grep -q "^# $kind over the $ranks ranks\$" "$file" || fail "no $kind table"
    # Rows: size count type redop root time algbw busbw #wrong, from the kind's title to the next title. The printed
    # algbw has 2 decimals (half a unit: 0.005), the time 2, 1 or 0 (below 100 us, below 10 ms, above): algbw
    # recomputed from the printed time is off by at most its relative rounding. busbw is the printed-time algbw
    # times the kind's factor, with both roundings. An all-gather's or a reduce-scatter's count is the doubling
    # size's floats rounded down to a multiple of the ranks (sizes too small for a float a rank are left out).
    awk -v kind="$kind" '$0 ~ "^# [a-z_]+ over the " { on = ($2 == kind) } on && /^ +[0-9]+ +[0-9]+ +float / { print }' "$file" |
      awk -v n="$ranks" -v max="$max" -v kind="$kind" '
      function next_size() {
        while (b <= max) {
          c = int(b / 4); if (kind != "all_reduce") c = int(c / n) * n
          b *= 2
          if (c > 0) return c
        }
        return 0
      }
      BEGIN { b = 8; worst_a = 0; worst_b = 0; f = (kind == "all_reduce" ? 2 : 1) * (n - 1) / n
              redop = (kind == "all_gather" ? "none" : "sum") }
      {
        size = $1; count = $2; t = $6; a = $7; b_printed = $8; wrong = $9
        expected = next_size()
        if (count != expected || size != 4 * count) { print kind ": count " count ", expected " expected; bad = 1; exit }
        if ($3 != "float" || $4 != redop || $5 != -1 || wrong != 0) { print kind " row: " $0; bad = 1; exit }
        half = t < 100 ? 0.005 : (t < 10000 ? 0.05 : 0.5)
        a_time = size / (t * 1e-6) / 1e9
        bound_a = 0.005 + a_time * half / (t - half)  # the true time may lie half a unit below the printed one
        bound_b = 0.005 + bound_a * f
        da = a - a_time; if (da < 0) da = -da
        db = b_printed - a_time * f; if (db < 0) db = -db
        if (da > bound_a) { printf "%s %d B: algbw %s, size/time %.4f, off by %.4f > bound %.4f\n", kind, size, a, a_time, da, bound_a; bad = 1; exit }
        if (db > bound_b) { printf "%s %d B: busbw %s, algbw x %.4f = %.4f, off by %.4f > bound %.4f\n", kind, size, b_printed, f, a_time * f, db, bound_b; bad = 1; exit }
        if (da / bound_a > worst_a) worst_a = da / bound_a
        if (db / bound_b > worst_b) worst_b = db / bound_b
        rows++
      }
      END {
        if (bad) exit 1
        if (next_size() != 0) { print kind ": the table ends before " max " B"; exit 1 }
        printf "%s: %d rows up to %d B; algbw within %.2f of its bound, busbw within %.2f of its bound (worst rows)\n", kind, rows, max, worst_a, worst_b
      }' || fail "the $kind table of $file"
  done
}

# check_groups LOG NODES RANKS_A_NODE: HSDP's groups, a row per node and per rail, each with three figures.
check_groups() {
  local file="$1" nodes="$2" per_node="$3"
  grep -q "^# HSDP's groups at [0-9]* B, every group at once" "$file" || fail "no table of HSDP's groups"
  [ "$(grep -cE '^  [^ ]+ +[0-9,-]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$' "$file")" = "$nodes" ] || fail "not $nodes node rows"
  [ "$(grep -cE '^  rank [0-9]+ of each node +[0-9,-]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$' "$file")" = "$per_node" ] ||
    fail "not $per_node rail rows"
  grep -qE '^# slowest node: [^ ]+, [0-9.]+x the median node.s [a-z_]+ within a node$' "$file" || fail "no slowest node"
}

echo "== 1. --submit on 2 nodes x 2 tasks, with a site file: fabric ethernet, 10 GB/s expected"
printf 'fabric = ethernet\nexpected_busbw_gbps = 10\n' > site.conf
# submit_check SITE_FILE ARGS...: submits the check, waits for its end; sets job, log, state.
submit_check() {
  local site="$1"; shift
  out="$(HPCTRAIN_SITE_CONFIG="$site" "$binary" --submit --check-fabric --nodes 2 --tasks-per-node 2 "$@")"
  job="$(sed -n 's/^submitted job \([0-9]*\).*/\1/p' <<<"$out" | head -1)"
  [ -n "$job" ] || fail "no job id: $out"
  log="$(scontrol show job "$job" | sed -n 's/^ *StdOut=//p')"
  wait_for "! squeue --noheader --jobs $job 2>/dev/null | grep -q ." 600 || fail "job $job did not end"
  state="$(scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)"
}
submit_check "$work/site.conf" --check-fabric-max 1M --check-fabric-min-fraction 0.0001
[ "$state" = COMPLETED ] || fail "job $job ended $state"
script="$(dirname "$log")/job.sbatch"
grep -q '^export HPCTRAIN_CHECK_FABRIC_MAX_BYTES=1048576$' "$script" || fail "the script does not ask for the check"
grep -q '^export HPCTRAIN_CHECK_FABRIC_MIN_FRACTION=0.0001$' "$script" || fail "the script does not pass the fraction"
grep -q '^export HPCTRAIN_EXPECTED_BUSBW_GBPS=10  # for --check-fabric$' "$script" || fail "the site's figure is not exported"
grep -q '^# hpctrain --check-fabric: .* over 4 rank(s) on 2 node(s), gloo on cpu$' "$log" || fail "not 4 ranks on 2 nodes"
check_table "$log" 4 1048576
check_groups "$log" 2 2
grep -q '^# Peak bus bandwidth   : [0-9.]* GB/s at [0-9]* B; the site expects 10 GB/s: [0-9]*% of it$' "$log" ||
  fail "no comparison with the site's figure"
grep -qE "^# between nodes: the slowest group's all_reduce reaches [0-9.]+ GB/s, [0-9]+% of 10 GB/s \(the site's expected_busbw_gbps\): OK, --check-fabric-min-fraction 0.0001$" "$log" ||
  fail "no verdict between nodes"
sed -n '/^# HSDP/,$p' "$log"

echo "== 2. a fabric below --check-fabric-min-fraction of the site's figure fails the job, saying so"
printf 'fabric = ethernet\nexpected_busbw_gbps = 100000\n' > fast-site.conf
submit_check "$work/fast-site.conf" --check-fabric-max 64K --check-fabric-min-fraction 0.5
[ "$state" = FAILED ] || fail "job $job ended $state, not FAILED"
grep -qE "^# between nodes: .*of 100000 GB/s \(the site's expected_busbw_gbps\): FAILED, --check-fabric-min-fraction 0.5 asks for 50%$" "$log" ||
  fail "the failure does not say why"
job=""
log=""

echo "== 3. --local 3, every table up to 64K; one node: no groups, nothing between nodes"
"$binary" --local 3 --check-fabric --check-fabric-max 64K --check-fabric-min-fraction 0.5 > local.log 2>&1 ||
  fail "--local 3 --check-fabric exited $?"
check_table local.log 3 65536
grep -q 'Peak bus bandwidth.*site expects' local.log && fail "a figure the site did not state"
grep -q "HSDP's groups" local.log && fail "groups on one node"
grep -q '^# between nodes: one node, no link between nodes to hold to --check-fabric-min-fraction$' local.log ||
  fail "one node's fraction not explained"

echo "== 4. misuse fails before anything runs"
status=0; "$binary" --status --check-fabric > misuse.log 2>&1 || status=$?
[ "$status" = 2 ] && grep -q -- '--check-fabric goes with --submit, --run or --local' misuse.log || fail "--status --check-fabric: exit $status"
status=0; "$binary" --local 2 --check-fabric --check-fabric-max 0 > zero.log 2>&1 || status=$?
[ "$status" = 2 ] && grep -q 'check_fabric_max = 0: expected a positive number of bytes' zero.log || fail "--check-fabric-max 0: exit $status"
status=0; "$binary" --local 2 --check-fabric --check-fabric-min-fraction 1.5 > fraction.log 2>&1 || status=$?
[ "$status" = 2 ] && grep -q -- '--check-fabric-min-fraction 1.5: expected a fraction above 0 and at most 1' fraction.log ||
  fail "--check-fabric-min-fraction 1.5: exit $status"
status=0; "$binary" --local 2 --check-fabric-min-fraction 0.5 > alone.log 2>&1 || status=$?
[ "$status" = 2 ] && grep -q -- '--check-fabric-min-fraction goes with --check-fabric' alone.log ||
  fail "--check-fabric-min-fraction alone: exit $status"
echo "PASS"
