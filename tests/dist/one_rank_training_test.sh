#!/usr/bin/env bash
# Through the real Trainer (reshard_training: an MLP whose loss curve does not depend on the world size): a sharded
# stage at one rank trains as Replicated, and its checkpoints still reshard both ways.
#  - `--local 1 --sharding zero3` prints the note, and its losses are Replicated's (`--sharding none`): the same
#    strategy runs them, so they agree within `same` (1e-6 relative), not bit for bit: on the CI's machine two runs of
#    one program once left each other by 2.2e-7 at step 40 (an ulp or two of MKL's fp32 GEMM, whose sums may
#    follow the data's alignment and the threads MKL picks; MKL_CBWR and MKL_DYNAMIC below pin what they can);
#    the note says which strategy ran;
#  - its checkpoint at step 20 (zero3's format: one piece per parameter) resumes at `--local 2` under zero3, zero2 and
#    hsdp, and a 2-rank zero3 run's resumes at `--local 1` under zero3, each continuing the uninterrupted run's loss
#    curve within reshard_training_test.sh's bound (1e-5 relative: the same fp32 sums split over another number of
#    ranks and micro-batches);
#  - `--sharding none` resumes those checkpoints at one and two ranks, and zero3 at one rank resumes a replicated one;
#  - --shard-at-one-rank runs zero3's own strategy at one rank (no note): within the same bound of
#    Replicated's losses, and its checkpoint (FSDP's flat pieces) resumes at one rank as replicated.
# Usage: one_rank_training_test.sh <reshard_training binary>
set -euo pipefail
source "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../support/shell_test_support.sh"
binary="$(realpath "$1")"
work="$(mktemp -d "${HPCTRAIN_BUILD_DIR:-/tmp}/one-rank-training-test.XXXXXX")"
cd "$work"
note="at one rank trains as replicated"
same=1e-6
# Run-to-run reproducibility of MKL's kernels (Intel's "conditional numerical reproducibility"): the code path of
# this CPU, independent of the data's alignment, with the number of threads set rather than picked per call.
export MKL_CBWR=AUTO,STRICT MKL_DYNAMIC=FALSE

train() {  # train NAME WORLD STAGE [ARG...]: 40 steps, a checkpoint every 10
  local name="$1" world="$2" stage="$3"
  shift 3
  HPCTRAIN_RUN_DIR="$work/$name" "$binary" --local "$world" --max-steps 40 --sharding "$stage" "$@" > "$name.log" 2>&1 ||
    fail "$name: exit $?"
  grep -q "^hpctrain: $world rank(s) on cpu" "$name.log" || fail "$name did not run on $world rank(s)"
  grep -q "steps, fp32, ${stage/none/replicated}\$" "$name.log" || fail "$name did not train with $stage"
}
resume() {  # resume NAME FROM WORLD STAGE [ARG...]: FROM's checkpoint at step 20 as the only one, 20 more steps
  local name="$1" from="$2"
  shift 2
  mkdir -p "$name-checkpoint/checkpoints"
  cp -r "$from/checkpoints/step-0000000020" "$name-checkpoint/checkpoints/"
  train "$name" "$@" --resume "$work/$name-checkpoint"
  grep -q "^resumed from $work/$name-checkpoint/checkpoints at step 20 " "$name.log" || fail "$name did not resume at step 20"
}
# compare WHOLE RESUMED BOUND: the losses of steps 21-40 (all 40 without a resume) within BOUND relative (0: equal).
compare() {
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" "$3" "$1 against $2" <<'PY'
import json, sys
def curve(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if "loss" in r}
whole, other, bound = curve(sys.argv[1]), curve(sys.argv[2]), float(sys.argv[3])
steps = sorted(other)
assert steps in (list(range(1, 41)), list(range(21, 41))), steps
worst = max(abs(other[s] - whole[s]) / abs(whole[s]) for s in steps)
print(f"{sys.argv[4]}, steps {steps[0]}-40: worst relative difference {worst:.2e} (bound {bound:g}; step 40: {other[40]:.8f} vs {whole[40]:.8f})")
sys.exit(0 if worst <= bound else 1)
PY
}

train replicated 1 none
train one 1 zero3
grep -qF "hpctrain: zero3 $note" one.log || fail "zero3 at --local 1 did not say that it trains as replicated"
! grep -qF "$note" replicated.log || fail "--sharding none printed the note"
compare replicated one "$same" || fail "zero3 at --local 1 did not train Replicated's losses (within $same)"
[ -f one/checkpoints/step-0000000020/rank-00000.hpct ] || fail "no checkpoint at step 20 at --local 1"
grep -q '"strategy": *"zero3"' one/checkpoints/step-0000000020/meta.json || fail "the checkpoint at --local 1 is not zero3's"

# The checkpoint of one rank resumes at two, under every sharded stage.
for stage in zero3 zero2 hsdp; do
  resume "one-to-$stage" one 2 "$stage"
  compare one "one-to-$stage" 1e-5 || fail "zero3 at --local 1 resumed at --local 2 under $stage leaves its loss curve"
done
# And a 2-rank checkpoint resumes at one. The 2-rank zero3 run trains Replicated's losses (weight decay by shape
# reaches ZeRO's flat pieces: without it zero3 left them by 2e-3 relative in 40 steps).
train two 2 zero3
train two-replicated 2 none
compare two-replicated two 1e-5 || fail "zero3 at --local 2 leaves Replicated's loss curve"
! grep -qF "$note" two.log || fail "zero3 at --local 2 printed the note"
resume two-to-one two 1 zero3
compare two two-to-one 1e-5 || fail "zero3 at --local 2 resumed at --local 1 leaves its loss curve"

# hsdp at one rank trains as Replicated whatever its group size: --hsdp-group-size 2 is not refused there.
train hsdp-one 1 hsdp --hsdp-group-size 2
grep -qF "hpctrain: hsdp $note" hsdp-one.log || fail "hsdp --hsdp-group-size 2 at --local 1 did not train as replicated"
compare replicated hsdp-one "$same" || fail "hsdp at --local 1 did not train Replicated's losses (within $same)"

# --sharding none resumes a sharded checkpoint (every rank reads every piece): one rank's at two, two ranks' at one.
resume one-to-none one 2 none
compare one one-to-none 1e-5 || fail "zero3 at --local 1 resumed at --local 2 under --sharding none leaves its loss curve"
resume two-to-none two 1 none
compare two two-to-none 1e-5 || fail "zero3 at --local 2 resumed at --local 1 under --sharding none leaves its loss curve"
# And at one rank a sharded stage (Replicated under the stage's name) resumes a replicated checkpoint.
resume replicated-to-zero3 replicated 1 zero3
compare replicated replicated-to-zero3 "$same" || fail "a replicated checkpoint resumed by zero3 at --local 1 leaves its loss curve"

# Forced: zero3's own strategy at one rank, whose checkpoint (FSDP's flat pieces) resumes as replicated.
train forced 1 zero3 --shard-at-one-rank
! grep -qF "$note" forced.log || fail "--shard-at-one-rank still trained as replicated"
compare replicated forced 1e-5 || fail "zero3's own strategy at --local 1 leaves Replicated's loss curve"
resume forced-to-one forced 1 zero3
compare forced forced-to-one 1e-5 || fail "zero3's own checkpoint at --local 1 resumed as replicated leaves its loss curve"
cd / && rm -rf "${work:?}"
echo "PASS"
