#!/usr/bin/env bash
# SFT, then DPO on its export, as two jobs on the local Slurm cluster (docs/lm.md, "SFT then DPO"):
#  - `dpo --dry-run --from DIR` with a DIR that does not exist exits 2 naming --from (nothing waits to write it), and
#    with --after it is accepted, saying that DIR is checked when the job starts;
#  - `sft --submit` queues the SFT job; `dpo --submit --after <its id> --from hpctrain-jobs/sft/<id>/export` is
#    accepted at login whether or not that export exists yet (the SFT job may already have ended; the data file is
#    still checked: a missing one exits 2), and queues afterok the SFT job;
#  - both jobs complete, in order: the DPO job starts from the SFT export (its log names it) and exports its own.
# Usage: sft_dpo_chain_test.sh <sft binary> <dpo binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/slurm_test_support.sh"
fail_tail=40
sft="$(realpath "$1")" dpo="$(realpath "$2")"
here="$(cd "$(dirname "$0")" && pwd)"
transformers_test_setup sft-dpo-chain
"$python" "$here/sft_oracle.py" make "$work" "$fortunes" > make.log 2>&1 || fail "the oracle could not make the model"
"$python" "$here/dpo_oracle.py" pairs "$work" 34 > pairs.log 2>&1 || log=pairs.log fail "the oracle could not make pairs"

status=0
"$dpo" --from not-yet --data pairs.jsonl --dry-run > no-after.log 2>&1 || status=$?
[ "$status" = 2 ] && grep -q -- "--from = not-yet" no-after.log ||
  log=no-after.log fail "a missing --from without --after: exit $status, not 2 naming --from"

# The login check alone, deterministic: a job that waits (--after) from a directory that does not exist yet.
"$dpo" --from hpctrain-jobs/sft/pending/export --data pairs.jsonl --after 999999 --dry-run > pending.log 2>&1 ||
  log=pending.log fail "dpo --dry-run --after from a pending export exited $?"
grep -q "the pretrained directory hpctrain-jobs/sft/pending/export does not exist yet" pending.log ||
  log=pending.log fail "dpo --dry-run --after did not say the export is pending"

out="$("$sft" --from llama --data conversations.jsonl --max-steps 2 --eval-every 0 --checkpoint-every 0 \
  --precision fp32 --export-dtype fp32 --submit 2>&1)" || fail "sft --submit exited $?: $out"
sft_job="$(sed -n 's/^submitted job \([0-9]*\).*/\1/p' <<< "$out" | head -1)"
[ -n "$sft_job" ] || fail "no job id in: $out"
trap 'scancel "$sft_job" ${dpo_job:-} 2>/dev/null || true' EXIT
export_dir="hpctrain-jobs/sft/$sft_job/export"

status=0
"$dpo" --from "$export_dir" --data missing.jsonl --after "$sft_job" --dry-run > missing-data.log 2>&1 || status=$?
[ "$status" = 2 ] && grep -q "missing.jsonl" missing-data.log ||
  log=missing-data.log fail "a missing --data with --after: exit $status, not 2 naming the file"

dpo_args=(--from "$export_dir" --data pairs.jsonl --max-steps 2 --batch-size 8 --lora-r 8 --eval-every 0
  --checkpoint-every 0 --precision fp32 --after "$sft_job")
out="$("$dpo" "${dpo_args[@]}" --submit 2>&1)" || fail "dpo --submit --after $sft_job exited $?: $out"
# (The SFT job may have ended by now: then its export exists and nothing is pending.)
dpo_job="$(sed -n 's/^submitted job \([0-9]*\).*/\1/p' <<< "$out" | head -1)"
[ -n "$dpo_job" ] || fail "no job id in: $out"
grep -q "dependency=afterok:$sft_job" "hpctrain-jobs/dpo/$dpo_job/job.sbatch" || fail "the dpo script does not wait for $sft_job"

[ "$(final_state "$sft_job")" = COMPLETED ] || log="hpctrain-jobs/sft/$sft_job/slurm-$sft_job.out" fail "sft job $sft_job"
[ "$(final_state "$dpo_job")" = COMPLETED ] || log="hpctrain-jobs/dpo/$dpo_job/slurm-$dpo_job.out" fail "dpo job $dpo_job"
dpo_log="hpctrain-jobs/dpo/$dpo_job/slurm-$dpo_job.out"
[ -f "$export_dir/config.json" ] || fail "no SFT export at $export_dir"
grep -q "$export_dir" "$dpo_log" || log="$dpo_log" fail "the dpo job does not name the SFT export it starts from"
[ -f "hpctrain-jobs/dpo/$dpo_job/export/adapter_config.json" ] || log="$dpo_log" fail "the dpo job exported no adapter"
first="$(grep -v '"eval_loss"' "hpctrain-jobs/dpo/$dpo_job/metrics.jsonl" | grep '"loss"' | head -1 |
  sed -n 's/.*"loss":\([^,}]*\).*/\1/p')"
close "$first" 0.69314718 1e-4 || fail "the dpo job's first loss is $first, not log 2"
trap - EXIT
cd / && rm -rf "${work:?}"
echo "PASS: sft job $sft_job, then dpo job $dpo_job afterok it from its export (first loss $first), both COMPLETED"
