#!/usr/bin/env bash
# The W&B logger in a real training program: `fashion_mnist --local 1 --wandb` writes an offline run that wandb's
# own reader reads back (tests/loggers/wandb_oracle.py: every metrics.jsonl record is a W&B row with equal values,
# config, summary, exit code); SIGTERM mid-run (a preemption) and a second run in the same run directory (the
# requeue's resume) give a second offline run with the same run id; `--wandb-sync RUN_DIR` runs `wandb sync` on
# both, or prints the command where wandb is not on PATH; a project W&B refuses exits 2.
# Usage: wandb_training_test.sh <fashion_mnist binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  { echo "SKIP: Fashion-MNIST is not installed at /usr/share/datasets/fashion-mnist (apt install dataset-fashion-mnist)"; exit 77; }
python="${HPCTRAIN_PYTHON:-$HOME/.cache/hpctrain/venv/bin/python}"
oracle="$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../loggers/wandb_oracle.py"
set +e; probe="$("$python" "$oracle" probe 2>&1)"; status=$?; set -e
[ "$status" = 77 ] && { echo "$probe"; exit 77; }  # SKIP: no wandb with its reader in this python
[ "$status" = 0 ] || fail "the oracle cannot start: $probe"
binary="$(realpath "$1")"
# Offline whatever the developer's environment holds: a WANDB_API_KEY or ~/.netrc would otherwise stream these runs to
# W&B (the online path has its own test, wandb_live_training_test.sh, against a local stand-in).
export WANDB_MODE=offline
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/wandb-training-test.XXXXXX")"
cd "$work"
knobs=(--max-steps 80 --log-every 5 --eval-every 20 --max-eval-examples 200 --wandb)  # a bare --wandb: the job's name

echo "== a project W&B refuses exits 2 before anything runs"
set +e; "$binary" --dry-run --wandb team/project > bad.log 2>&1; status=$?; set -e
[ "$status" = 2 ] || fail "--wandb team/project exited $status"
grep -q 'hpctrain.spec.knob.*--wandb = team/project: must be a W&B project name' bad.log || fail "no knob error for team/project"

echo "== attempt 1: SIGTERM (a preemption) once step 20 is logged"
preempt_at_step 20 run first.log env HPCTRAIN_RUN_DIR="$work/run" "$binary" --local 1 "${knobs[@]}"
[ -n "$stopped_at" ] || fail "attempt 1 was not preempted"
grep -q '^step 80/80' first.log && fail "attempt 1 ran to the end before SIGTERM: nothing to resume"

echo "== attempt 2: the same run directory resumes and finishes"
HPCTRAIN_RUN_DIR="$work/run" "$binary" --local 1 "${knobs[@]}" > second.log 2>&1 || fail "attempt 2 exited $?"
grep -q '^resumed from ' second.log || fail "attempt 2 did not resume"
[ "$(ls -d run/wandb/offline-run-* | wc -l)" = 2 ] || fail "not two offline runs: $(ls run/wandb)"

echo "== wandb's reader: both attempts, one run id, every metrics.jsonl value in the W&B history"
"$python" "$oracle" training run > oracle.log 2>&1 || fail "the oracle refused the run"
cat oracle.log
grep -q 'PASS: 2 attempt(s) of run [a-z0-9]* in project fashion_mnist' oracle.log || fail "unexpected oracle verdict"

echo "== --wandb-sync RUN_DIR: wandb sync on both offline runs, or the command where wandb is missing"
mkdir bin
printf '#!/bin/sh\nprintf "%%s\\n" "$@" > "%s/sync-args.txt"\n' "$work" > bin/wandb
chmod +x bin/wandb
PATH="$work/bin:$PATH" "$binary" --wandb-sync run > sync.log 2>&1 || fail "--wandb-sync exited $?"
expected="$(printf '%s\n' sync "$work"/run/wandb/offline-run-*)"
[ "$(cat sync-args.txt)" = "$expected" ] || fail "wandb sync got: $(cat sync-args.txt)"
set +e; PATH=/usr/bin:/bin "$binary" --wandb-sync "$work/run" > printed.txt 2> printed.err; status=$?; set -e
[ "$status" = 1 ] || fail "--wandb-sync without wandb exited $status"
[ "$(cat printed.txt)" = "wandb sync $(echo "$work"/run/wandb/offline-run-*)" ] || fail "printed: $(cat printed.txt)"
grep -q 'wandb is not on PATH here' printed.err || fail "no reason given"
echo "PASS"
