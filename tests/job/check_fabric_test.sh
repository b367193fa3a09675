#!/usr/bin/env bash
# `--check-fabric` with the real example: instead of training, the job's own ranks time all-reduces of 8 B up to
# --check-fabric-max, doubling, and rank 0 prints them as nccl-tests' all_reduce_perf does. Checked on the local
# Slurm cluster (2 nodes, Gloo) with a site file stating an expected bus bandwidth, and with --local 3: the rows'
# sizes and counts, #wrong 0, algbw = size / time and busbw = algbw x 2(n-1)/n recomputed from the printed time
# (bounds: the printed digits' rounding, derived per row), no training step. No speed is asserted.
# Usage: check_fabric_test.sh <fashion_mnist binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
binary="$(realpath "$1")"
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/check-fabric-test.XXXXXX")"
cd "$work"
unset HPCTRAIN_RUN_DIR
job=""
trap '[ -n "$job" ] && scancel "$job" 2>/dev/null || true' EXIT

# check_table LOG RANKS MAX_BYTES: every row of the table, and the totals.
check_table() {
  local file="$1" ranks="$2" max="$3"
  grep -q "^# hpctrain --check-fabric: all_reduce over $ranks rank(s) on " "$file" || fail "no header for $ranks ranks"
  grep -q "^# minBytes 8 maxBytes $max step: 2(factor) warmup iters: 5 iters: 20 validation: 1\$" "$file" ||
    fail "the header does not state 8..$max"
  grep -q '^# Out of bounds values : 0 OK$' "$file" || fail "a sum was wrong"
  grep -q '^# Avg bus bandwidth    : [0-9.e+-]*$' "$file" || fail "no average bus bandwidth"
  grep -q '^step ' "$file" && fail "it trained"
  # Rows: size count type redop root time algbw busbw #wrong. The printed algbw has 2 decimals (half a unit:
  # 0.005), the time 2, 1 or 0 (below 100 us, below 10 ms, above): algbw recomputed from the printed time is
  # off by at most its relative rounding. busbw is the printed-time algbw times 2(n-1)/n, with both roundings.
  grep -v '^#' "$file" | grep -E '^ +[0-9]+ +[0-9]+ +float ' | awk -v n="$ranks" -v max="$max" '
    BEGIN { expected = 8; worst_a = 0; worst_b = 0; f = 2 * (n - 1) / n }
    {
      size = $1; count = $2; t = $6; a = $7; b = $8; wrong = $9
      if (size != expected) { print "size " size ", expected " expected; bad = 1; exit }
      if (count != size / 4 || $3 != "float" || $4 != "sum" || $5 != -1 || wrong != 0) { print "row: " $0; bad = 1; exit }
      half = t < 100 ? 0.005 : (t < 10000 ? 0.05 : 0.5)
      a_time = size / (t * 1e-6) / 1e9
      bound_a = 0.005 + a_time * half / (t - half)  # the true time may lie half a unit below the printed one
      bound_b = 0.005 + bound_a * f
      da = a - a_time; if (da < 0) da = -da
      db = b - a_time * f; if (db < 0) db = -db
      if (da > bound_a) { printf "size %d: algbw %s, size/time %.4f, off by %.4f > bound %.4f\n", size, a, a_time, da, bound_a; bad = 1; exit }
      if (db > bound_b) { printf "size %d: busbw %s, algbw x %.4f = %.4f, off by %.4f > bound %.4f\n", size, b, f, a_time * f, db, bound_b; bad = 1; exit }
      if (da / bound_a > worst_a) worst_a = da / bound_a
      if (db / bound_b > worst_b) worst_b = db / bound_b
      rows++; expected *= 2
    }
    END {
      if (bad) exit 1
      if (expected / 2 != max) { print "the last row is " expected / 2 " B, not " max; exit 1 }
      printf "%d rows, 8..%d B; algbw within %.2f of its bound, busbw within %.2f of its bound (worst rows)\n", rows, max, worst_a, worst_b
    }' || fail "the table of $file"
}

echo "== 1. --submit on 2 nodes, with a site file: fabric ethernet, 10 GB/s expected"
printf 'fabric = ethernet\nexpected_busbw_gbps = 10\n' > site.conf
out="$(HPCTRAIN_SITE_CONFIG="$work/site.conf" "$binary" --submit --check-fabric --check-fabric-max 1M)"
job="$(sed -n 's/^submitted job \([0-9]*\).*/\1/p' <<<"$out" | head -1)"
[ -n "$job" ] || fail "no job id: $out"
log="$(scontrol show job "$job" | sed -n 's/^ *StdOut=//p')"
wait_for "! squeue --noheader --jobs $job 2>/dev/null | grep -q ." 600 || fail "job $job did not end"
state="$(scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)"
[ "$state" = COMPLETED ] || fail "job $job ended $state"
script="$(dirname "$log")/job.sbatch"
grep -q '^export HPCTRAIN_CHECK_FABRIC_MAX_BYTES=1048576$' "$script" || fail "the script does not ask for the check"
grep -q '^export HPCTRAIN_EXPECTED_BUSBW_GBPS=10  # for --check-fabric$' "$script" || fail "the site's figure is not exported"
grep -q '^# hpctrain --check-fabric: all_reduce over 2 rank(s) on 2 node(s), gloo on cpu$' "$log" || fail "not 2 ranks on 2 nodes"
check_table "$log" 2 1048576
grep -q '^# Peak bus bandwidth   : [0-9.]* GB/s at [0-9]* B; the site expects 10 GB/s: [0-9]*% of it$' "$log" ||
  fail "no comparison with the site's figure"
job=""
log=""

echo "== 2. --local 3, the default table up to 64K"
"$binary" --local 3 --check-fabric --check-fabric-max 64K > local.log 2>&1 || fail "--local 3 --check-fabric exited $?"
check_table local.log 3 65536
grep -q 'Peak bus bandwidth.*site expects' local.log && fail "a figure the site did not state"

echo "== 3. misuse fails before anything runs"
status=0; "$binary" --status --check-fabric > misuse.log 2>&1 || status=$?
[ "$status" = 2 ] && grep -q -- '--check-fabric goes with --submit, --run or --local' misuse.log || fail "--status --check-fabric: exit $status"
status=0; "$binary" --local 2 --check-fabric --check-fabric-max 0 > zero.log 2>&1 || status=$?
[ "$status" = 2 ] && grep -q 'check_fabric_max = 0: expected a positive number of bytes' zero.log || fail "--check-fabric-max 0: exit $status"
echo "PASS"
