#!/usr/bin/env bash
# examples/sft's data tokenized once per job, in the job's preparation step, on the three ways a run starts:
#  - `--local 2`: the step prepares the JSONL file (its log gives MB/s and examples/s) and both data sources of
#    rank 0 say they read the job's prepared file;
#  - the worker run by hand, without a job (no preparation step): the ranks tokenize the file themselves;
#  - `--submit` on the local Slurm cluster: the script's preparation step prepares, the ranks read it;
# and the three start from the same examples: response_loss_before (the held-out responses' loss before any
# step) is the same number to the last printed digit on two ranks, --local and --submit, and within fp32's
# summation order on the one rank of the plain run. A second `--local` run with another
# --max-length runs the preparation again (its arguments changed), which prepares a file of its own for those
# inputs, and its ranks read that one: a prepared file is never taken for other inputs.
# Usage: sft_prepare_test.sh <sft binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
fail_tail=40
sft="$(realpath "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
transformers_test_setup sft-prepare-test
value() { sed -n "s/^$1=\([^ ]*\).*/\1/p" "$2" | tail -1; }
"$python" "$here/sft_oracle.py" make "$work" "$fortunes" > make.log 2>&1 || fail "the oracle could not make the start model"
args=(--from llama --data conversations.jsonl --max-steps 1 --max-length 256)

# --local: prepared once, read by the ranks.
HPCTRAIN_RUN_DIR="$work/local" "$sft" "${args[@]}" --local 2 > local.log 2>&1 || fail "sft --local 2 exited $?"
grep -q '^hpctrain: prepared conversations.jsonl: 182 examples, [0-9]* tokens in .*/prepare/sft/[0-9a-f]*\.sfttokens ([0-9.]* MB/s, [0-9]* examples/s on [0-9]* threads)' local.log ||
  fail "--local: the preparation step did not say what it prepared"
[ "$(grep -c '^hpctrain: conversations.jsonl: .* examples read (prepared by the job: ' local.log)" = 2 ] ||
  fail "--local: the training and evaluation data did not both come from the prepared file"
local_before="$(value response_loss_before local.log)"
[ -n "$local_before" ] || fail "--local: no response_loss_before"

# No job: the worker itself, one rank, no preparation step.
HPCTRAIN_RUN_DIR="$work/plain" "$sft" --hpctrain-worker "${args[@]}" > plain.log 2>&1 || fail "the plain worker exited $?"
[ "$(grep -c '^hpctrain: conversations.jsonl: .* examples read (tokenized in each rank)' plain.log)" = 2 ] ||
  fail "without a job: the data was not tokenized in the rank"
plain_before="$(value response_loss_before plain.log)"
# One rank sums the held-out loss in another order than two (fp32): 6.6490831 against 6.6490834 when written,
# 4.5e-8 relative. 1e-6 leaves room for that and catches one token's mask changed (about 1e-3 over ~2,000 tokens).
echo "response_loss_before: $plain_before tokenized in the one rank, $local_before from the prepared file in two (bound 1e-6 relative)"
awk -v x="$plain_before" -v y="$local_before" 'BEGIN { d = (x - y) / y; exit !(d < 1e-6 && d > -1e-6) }' ||
  fail "response_loss_before: $plain_before tokenized in the rank, $local_before from the prepared file"

# --submit: the batch script's preparation step, then 2 ranks on 2 nodes.
out="$("$sft" "${args[@]}" --submit 2>&1)" || fail "--submit exited $?: $out"
job="$(sed -n 's/^submitted job \([0-9]*\).*/\1/p' <<<"$out" | head -1)"
[ -n "$job" ] || fail "no job id in: $out"
trap 'scancel "$job" 2>/dev/null || true' EXIT
log="$work/hpctrain-jobs/sft/$job/slurm-$job.out"
wait_for "grep -q '^response_loss_after=' '$log' 2>/dev/null || ! squeue -h -j $job 2>/dev/null | grep -q ." 600 ||
  fail "job $job did not finish"
grep -q "^hpctrain: prepared conversations.jsonl: 182 examples, .* in $work/hpctrain-jobs/sft/$job/prepare/sft/" "$log" ||
  fail "--submit: the preparation step did not prepare (log $log)"
[ "$(grep -c '^hpctrain: conversations.jsonl: .* examples read (prepared by the job: ' "$log")" = 2 ] ||
  fail "--submit: the ranks did not read the prepared file (log $log)"
submit_before="$(value response_loss_before "$log")"
[ "$submit_before" = "$local_before" ] || fail "response_loss_before: $submit_before under --submit, $local_before under --local"

# Another --max-length under --local: other arguments, so the preparation runs again; the 256-token file stays
# for its own inputs and a 128-token file is prepared beside it, which the ranks read.
HPCTRAIN_RUN_DIR="$work/other" "$sft" --from llama --data conversations.jsonl --max-steps 1 --max-length 128 --local 1 > other.log 2>&1 ||
  fail "sft --max-length 128 exited $?"
! grep -q '^hpctrain: preparation already done' other.log || fail "the --local run with other arguments skipped the preparation"
file_256="$(sed -n 's/^hpctrain: prepared conversations.jsonl: .* tokens in \([^ ]*\) .*/\1/p' local.log)"
file_128="$(sed -n 's/^hpctrain: prepared conversations.jsonl: .* tokens in \([^ ]*\) .*/\1/p' other.log)"
[ -n "$file_128" ] && [ "$file_128" != "$file_256" ] || fail "--max-length 128: no file of its own prepared ($file_128)"
[ "$(grep -cF "examples read (prepared by the job: $file_128), " other.log)" = 2 ] ||
  fail "--max-length 128: the ranks did not read the file prepared for their inputs"
echo "PASS: response_loss_before=$local_before from --local's prepared file, without a job, and under --submit (job $job)"
