#!/usr/bin/env bash
# A fuzz smoke run that gives the same verdict every time on one commit: the target replays its seed corpus, then
# runs a fixed number of inputs from a fixed seed (libFuzzer's -seed, -runs), in a scratch directory of its own
# (the files it writes have the same names in every run: fuzz_support.hpp's scratch_file), with new inputs kept in
# that directory only (never a build tree's corpus, which would change the next run's start), without libFuzzer's
# comparison tracing (-use_cmp=0: with it, two runs of one seed of fuzz_job_record kept 282 and 270 inputs, without
# it the same 299 every time) and with the address space not randomised where setarch may (what is left that sees
# addresses). Prints the digest of the inputs the run kept, so two runs can be compared.
#   smoke_run.sh <fuzz target binary> <runs> <seed corpus dir>
# The long random runs are scripts/fuzz.
set -euo pipefail
target="$(realpath "$1")" runs="$2" corpus="$(realpath "$3")"
scratch="$(mktemp -d -p /dev/shm hpctrain-fuzz-smoke.XXXXXX 2>/dev/null || mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
mkdir "$scratch/found"
cd "$scratch"
fixed_addresses=()
setarch "$(uname -m)" -R true 2>/dev/null && fixed_addresses=(setarch "$(uname -m)" -R)
status=0
"${fixed_addresses[@]}" "$target" -seed=1 -runs="$runs" -use_cmp=0 -timeout=60 -rss_limit_mb=2048 \
  -print_final_stats=1 found "$corpus" || status=$?
kept=$(find found -type f | wc -l)
echo "smoke: $kept new inputs kept, their digest $(cd found && find . -type f -printf '%f\n' | sort | sha1sum | cut -c1-16)"
exit "$status"
