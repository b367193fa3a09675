#!/usr/bin/env bash
# Containers and LibTorch, route (b): the program is built on the host against the venv's LibTorch and runs in an
# image that has no LibTorch; the job mounts the venv at its own path, so the binary's RUNPATH resolves inside as
# on the host. The image is a directory (tests/job/charliecloud_support.sh) whose /usr is the host's, bound: the
# glibc and libstdc++ the binary was built against, by construction. Checked:
#   - the image alone cannot start the binary (ch-run without the venv: libtorch_cpu.so not found);
#   - --dry-run's srun line binds /usr, the venv, the binary's and the working directory at their paths;
#   - --submit trains on both local nodes inside ch-run: each rank says it loaded libtorch_cpu.so from the mounted
#     venv, the job COMPLETED, and the loss the Trainer logged fell;
#   - the login modes run inside the image too, as a binary built there must run them (docs/containers.md, route
#     (a)): --submit and --status inside ch-run, with Slurm's configuration directory and munge's socket bound in
#     (the image's /usr, the host's, has sbatch), submit a job that trains and then read its state.
# Usage: container_libtorch_test.sh <hpctrain_container_training binary>
set -euo pipefail
here="$(dirname "$(realpath "${BASH_SOURCE[0]}")")"
source "$here/../support/shell_test_support.sh"
source "$here/charliecloud_support.sh"
charliecloud_or_skip
binary="$(realpath "$1")"
venv="$(libtorch_venv "$binary")" || fail "no LibTorch in the RUNPATH of $binary"
export USER="${USER:-$(id -un)}"  # ch-run requires it; sbatch passes it on to the job
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/container-libtorch-test.XXXXXX")"
cd "$work"
unset HPCTRAIN_RUN_DIR
program_dir="$(dirname "$binary")"
slurm_etc="$(dirname "${SLURM_CONF:-/etc/slurm/slurm.conf}")"
charliecloud_image "$work/image" "$venv" "$program_dir" "$work" "$slurm_etc" /run/munge
export CONTAINER_IMAGE="$work/image" CONTAINER_VENV="$venv"

# --- the image has no LibTorch of its own ---------------------------------------------------------------
status=0
ch-run -b /usr:/usr -b "$program_dir:$program_dir" "$work/image" -- "$binary" --help > bare.log 2>&1 || status=$?
[ "$status" = 127 ] && grep -qE "lib(torch[a-z_]*|c10)\.so: cannot open shared object file" bare.log ||
  log=bare.log fail "without the venv mounted the binary should not start (exit 127), got exit $status"
echo "ok: without the venv mounted the binary does not start in the image: $(cat bare.log)"

# --- the job mounts it ------------------------------------------------------------------------------------
"$binary" --dry-run > dry.log 2>&1 || fail "--dry-run exited $?"
grep -qF "ch-run -b /usr:/usr -b $venv:$venv -b $program_dir:$program_dir -b $work:$work --cd $work $work/image -- " dry.log ||
  log=dry.log fail "the srun line does not bind /usr, the venv, the program's and the working directory"

"$binary" --submit > submit.log 2>&1 || fail "--submit exited $?"
id="$(sed -n 's/^submitted job \([0-9]*\)$/\1/p' submit.log)"
[ -n "$id" ] || fail "no job id in submit.log"
echo "submitted job $id"
wait_for '[ -z "$(squeue --noheader --jobs "$id" 2>/dev/null)" ]' 600 || fail "job $id did not end in 10 minutes"
job_log="$work/hpctrain-jobs/container_training/$id/slurm-$id.out"
state="$(scontrol --oneliner show job "$id" | sed -n 's/.* JobState=\([A-Z_]*\) .*/\1/p')"
[ "$state" = COMPLETED ] || log="$job_log" fail "job $id ended $state"
for rank in 0 1; do
  grep -qE "^container_training: rank $rank on n$((rank + 1)) runs inside ch-run with $venv/.*/torch/lib/libtorch_cpu.so\$" "$job_log" ||
    log="$job_log" fail "rank $rank did not run inside ch-run with the mounted venv's LibTorch"
done
grep "runs inside ch-run" "$job_log"

# The Trainer's losses (metrics.jsonl, rank 0): 30 AdamW steps on a linear teacher's classes lower the loss.
metrics="$work/hpctrain-jobs/container_training/$id/metrics.jsonl"
python3 - "$metrics" <<'PY' || log="$job_log" fail "the loss did not fall"
import json, sys
losses = [(r["step"], r["loss"]) for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
print("losses:", losses)
sys.exit(0 if len(losses) >= 2 and losses[-1][1] < losses[0][1] else 1)
PY
echo "ok: trained in the image on both nodes, loss falling"

# --- the login modes inside the image -----------------------------------------------------------------
inside=(ch-run -b /usr:/usr -b "$venv:$venv" -b "$program_dir:$program_dir" -b "$work:$work" -b "$slurm_etc:$slurm_etc"
        -b /run/munge:/run/munge --cd "$work" "$work/image" --)
"${inside[@]}" "$binary" --submit > inside-submit.log 2>&1 || log=inside-submit.log fail "--submit inside ch-run exited $?"
id="$(sed -n 's/^submitted job \([0-9]*\)$/\1/p' inside-submit.log)"
[ -n "$id" ] || log=inside-submit.log fail "no job id from --submit inside ch-run"
wait_for '[ -z "$(squeue --noheader --jobs "$id" 2>/dev/null)" ]' 600 || fail "job $id did not end in 10 minutes"
"${inside[@]}" "$binary" --status > inside-status.log 2>&1 || log=inside-status.log fail "--status inside ch-run exited $?"
cat inside-status.log
grep -q "^job $id (container_training): COMPLETED" inside-status.log || log=inside-status.log fail "--status inside ch-run does not say COMPLETED"
grep -qE "^container_training: rank 1 on n2 runs inside ch-run with $venv/" "$work/hpctrain-jobs/container_training/$id/slurm-$id.out" ||
  log="$work/hpctrain-jobs/container_training/$id/slurm-$id.out" fail "the job submitted from inside ch-run did not train in it"
echo "ok: --submit and --status ran inside the image"
rm -rf "$work"
echo "PASS: a program built on the host trains under ch-run on both nodes with the venv mounted at its path, and submits from inside the image"
