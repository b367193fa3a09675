#!/usr/bin/env bash
# SFT, then DPO on its export, on the local Slurm cluster (docs/lm.md, "SFT then DPO"):
#  - two programs: `dpo --dry-run --from DIR` with a DIR that does not exist exits 2 naming --from (nothing waits to
#    write it); with --after it is accepted, saying that DIR is checked when the job starts, while a missing --data
#    still exits 2;
#  - one program, `sft_dpo` (hpctrain::run over two stages): --help lists the knobs once and the per-stage form,
#    a bad per-stage value exits 2 naming it, --dry-run prints both scripts (the second told the first's directory);
#    one `--submit` queues the SFT job and the DPO job afterok it, both complete in order, the DPO job starts from
#    the SFT job's export (its log names it), --dpo.lora-r reaches the DPO stage alone (it exports an adapter, the
#    SFT stage a whole model), its first loss is log 2, and --status reports the chain.
# Usage: sft_dpo_chain_test.sh <dpo binary> <sft_dpo binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/slurm_test_support.sh"
fail_tail=40
dpo="$(realpath "$1")" chain="$(realpath "$2")"
here="$(cd "$(dirname "$0")" && pwd)"
transformers_test_setup sft-dpo-chain
"$python" "$here/sft_oracle.py" make "$work" "$fortunes" > make.log 2>&1 || fail "the oracle could not make the model"
"$python" "$here/dpo_oracle.py" pairs "$work" 34 > pairs.log 2>&1 || log=pairs.log fail "the oracle could not make pairs"

# Two programs, the login checks alone (deterministic): a job that waits (--after) from a directory that does not
# exist yet, and one that waits for nothing.
status=0
"$dpo" --from not-yet --data pairs.jsonl --dry-run > no-after.log 2>&1 || status=$?
[ "$status" = 2 ] && grep -q -- "--from = not-yet" no-after.log ||
  log=no-after.log fail "a missing --from without --after: exit $status, not 2 naming --from"
"$dpo" --from hpctrain-jobs/sft/pending/export --data pairs.jsonl --after 999999 --dry-run > pending.log 2>&1 ||
  log=pending.log fail "dpo --dry-run --after from a pending export exited $?"
grep -q "the pretrained directory hpctrain-jobs/sft/pending/export does not exist yet" pending.log ||
  log=pending.log fail "dpo --dry-run --after did not say the export is pending"
status=0
"$dpo" --from hpctrain-jobs/sft/pending/export --data missing.jsonl --after 999999 --dry-run > missing-data.log 2>&1 ||
  status=$?
[ "$status" = 2 ] && grep -q "missing.jsonl" missing-data.log ||
  log=missing-data.log fail "a missing --data with --after: exit $status, not 2 naming the file"

# One program, two stages.
"$chain" --help > help.log 2>&1 || log=help.log fail "sft_dpo --help exited $?"
grep -q -- "--pairs" help.log && grep -q -- "--<stage>.<knob> sets it for one stage of the chain (sft, dpo)" help.log ||
  log=help.log fail "--help does not list the knobs and the per-stage form"
grep -q -- "--dpo\.beta" help.log && log=help.log fail "--help lists each stage's copy of each knob"
args=(--from llama --data conversations.jsonl --pairs pairs.jsonl --max-steps 2 --eval-every 0 --checkpoint-every 0
  --precision fp32 --export-dtype fp32 --dpo.batch-size 8 --dpo.lora-r 8)
status=0
"$chain" "${args[@]}" --dpo.beta -1 --dry-run > bad-beta.log 2>&1 || status=$?
[ "$status" = 2 ] && grep -q -- "--dpo.beta = -1" bad-beta.log ||
  log=bad-beta.log fail "--dpo.beta -1: exit $status, not 2 naming it"
"$chain" "${args[@]}" --dry-run > dry-run.out 2> dry-run.err || log=dry-run.err fail "sft_dpo --dry-run exited $?"
grep -q "^# ---- stage 2 of 2: dpo, submitted with --dependency=afterok:<job id of sft> ----" dry-run.out &&
  grep -q "^export HPCTRAIN_STAGE_DIRS='sft=$(pwd -P)/hpctrain-jobs/sft/<job id of sft>'" dry-run.out ||
  log=dry-run.out fail "--dry-run does not print the dpo stage told the sft job's directory"
grep -q "the pretrained directory <the sft job's directory>/export does not exist yet" dry-run.err ||
  log=dry-run.err fail "--dry-run did not say the dpo stage's model is the sft job's to write"

out="$("$chain" "${args[@]}" --submit 2>&1)" || fail "sft_dpo --submit exited $?: $out"
sft_job="$(sed -n 's/^  stage 1 sft: job \([0-9]*\)$/\1/p' <<< "$out")"
dpo_job="$(sed -n 's/^  stage 2 dpo: job \([0-9]*\)$/\1/p' <<< "$out")"
[ -n "$sft_job" ] && [ -n "$dpo_job" ] || fail "no job ids in: $out"
trap 'scancel "$sft_job" "$dpo_job" 2>/dev/null || true' EXIT
grep -q "dependency=afterok:$sft_job" "hpctrain-jobs/dpo/$dpo_job/job.sbatch" || fail "the dpo script does not wait for $sft_job"

[ "$(final_state "$sft_job")" = COMPLETED ] || log="hpctrain-jobs/sft/$sft_job/slurm-$sft_job.out" fail "sft job $sft_job"
[ "$(final_state "$dpo_job")" = COMPLETED ] || log="hpctrain-jobs/dpo/$dpo_job/slurm-$dpo_job.out" fail "dpo job $dpo_job"
dpo_log="hpctrain-jobs/dpo/$dpo_job/slurm-$dpo_job.out"
export_dir="$(pwd -P)/hpctrain-jobs/sft/$sft_job/export"
[ -f "$export_dir/config.json" ] && [ ! -f "$export_dir/adapter_config.json" ] ||
  fail "the sft stage did not export a whole model at $export_dir (--dpo.lora-r reached it?)"
grep -q "$export_dir" "$dpo_log" || log="$dpo_log" fail "the dpo job does not name the SFT export it starts from"
[ -f "hpctrain-jobs/dpo/$dpo_job/export/adapter_config.json" ] || log="$dpo_log" fail "the dpo job exported no adapter"
first="$(grep -v '"eval_loss"' "hpctrain-jobs/dpo/$dpo_job/metrics.jsonl" | grep '"loss"' | head -1 |
  sed -n 's/.*"loss":\([^,}]*\).*/\1/p')"
close "$first" 0.69314718 1e-4 || fail "the dpo job's first loss is $first, not log 2"
"$chain" --status > status.log 2>&1 || log=status.log fail "--status exited $?"
grep -q "stage 1 sft (job $sft_job): COMPLETED" status.log && grep -q "stage 2 dpo (job $dpo_job): COMPLETED" status.log ||
  log=status.log fail "--status does not report both stages COMPLETED"
trap - EXIT
cd / && rm -rf "${work:?}"
echo "PASS: one --submit: sft job $sft_job, then dpo job $dpo_job afterok it from its export (first loss $first), both COMPLETED"
