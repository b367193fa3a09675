# Sourced by every shell test: one copy of the helpers they all need.
#
# fail MESSAGE...: prints "FAIL: MESSAGE" and the last $fail_tail (default 30) lines of what is worth reading,
# then exits 1: the file named by $log when a test follows one log (a job's output), else every file matching
# the patterns in $fail_logs (default: *.log, relative to the test's own work directory, where tests cd).
# $on_fail, when set, is run first (e.g. to kill a process the test started).
fail() {
  echo "FAIL: $*" >&2
  if [ -n "${on_fail:-}" ]; then eval "$on_fail" || true; fi
  local pattern file
  if [ -n "${log:-}" ]; then
    set -- "$log"
  else
    set --
    for pattern in ${fail_logs:-*.log}; do
      for file in $pattern; do set -- "$@" "$file"; done
    done
  fi
  for file in "$@"; do
    [ -f "$file" ] || continue
    echo "== $file" >&2
    tail -n "${fail_tail:-30}" "$file" >&2
  done
  exit 1
}

# wait_for COMMAND SECONDS [INTERVAL]: evaluates COMMAND every INTERVAL seconds (default $wait_interval, else 1)
# until it succeeds; returns 1 when SECONDS have passed without success.
wait_for() {
  local deadline=$((SECONDS + $2))
  until eval "$1"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep "${3:-${wait_interval:-1}}"
  done
}

# preempt_at_step STEP RUN_DIR LOG COMMAND...: COMMAND (a launcher: `env HPCTRAIN_RUN_DIR=DIR PROGRAM --local N ...`) in
# the background, its output in LOG (what fail shows meanwhile); once RUN_DIR/metrics.jsonl logs step STEP, SIGTERM
# (a preemption) to it, and waits for it. Sets $stopped_at to the step its preemption checkpointed (empty: it was not
# preempted).
preempt_at_step() {
  local step=$1 run_dir=$2 log=$3 launcher
  shift 3
  "$@" > "$log" 2>&1 &
  launcher=$!
  on_fail="kill $launcher 2>/dev/null"
  wait_for "grep -q '\"step\":$step[,}]' '$run_dir/metrics.jsonl' 2>/dev/null" 300 0.1 ||
    fail "no step $step in $run_dir/metrics.jsonl"
  kill -TERM "$launcher"
  wait "$launcher" || true
  on_fail=""
  stopped_at="$(sed -n 's/^preempted: checkpointed step \([0-9]*\) .*/\1/p' "$log" | head -1)"
}

# transformers_test_setup NAME: the oracle Python ($python: HPCTRAIN_PYTHON, else the venv scripts/setup makes) with
# transformers and tokenizers, and the fortunes corpus ($fortunes), or exit 77 (skipped); then a fresh work
# directory ($work, NAME.XXXXXX under the build tree) to cd into.
transformers_test_setup() {
  python="${HPCTRAIN_PYTHON:-$HOME/.cache/hpctrain/venv/bin/python}"
  fortunes=/usr/share/games/fortunes
  if [ ! -x "$python" ] || ! "$python" -c 'import transformers, tokenizers' 2>/dev/null; then
    echo "SKIP: no Python with transformers and tokenizers at $python (scripts/setup makes it)"; exit 77
  fi
  [ -d "$fortunes" ] || { echo "SKIP: no fortunes corpus at $fortunes (Debian package fortunes)"; exit 77; }
  work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/$1.XXXXXX")"
  cd "$work"
}

# close X Y BOUND: whether |X - Y| <= BOUND |Y| (relative agreement of two numbers). difference X Y: |X - Y| / |Y|,
# printed for a test's report.
close() { awk -v x="$1" -v y="$2" -v b="$3" 'BEGIN { d = x - y; if (d < 0) d = -d; exit !(d <= b * (y < 0 ? -y : y)) }'; }
difference() { awk -v x="$1" -v y="$2" 'BEGIN { d = x - y; if (d < 0) d = -d; printf "%.1e", d / (y < 0 ? -y : y) }'; }
