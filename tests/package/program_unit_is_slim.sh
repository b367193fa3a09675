#!/bin/sh
# program_unit_is_slim.sh BUILD_DIR OBJECT: the headers a program's unit opened (the compiler's depfile for OBJECT,
# as Ninja keeps it in its log or Makefiles beside the object) include the Training's and none of the runtime's
# machinery (include/hpctrain/compiled_runtime.hpp: a program that links hpctrain::runtime parses the
# description only). Prints what it found either way.
set -eu
build=$1 object=$2
headers=$(mktemp)
trap 'rm -f "$headers"' EXIT
if [ -f "$build/build.ninja" ]; then
  ninja -C "$build" -t deps "$object" >"$headers"
else
  cat "$build/$object.d" >"$headers"
fi
depfile=$headers
if ! grep -q 'hpctrain/train/training\.hpp' "$depfile"; then
  echo "$build/$object: no dependencies naming hpctrain/train/training.hpp (was the consumer built?)"
  exit 1
fi
machinery='torch/torch\.h|hpctrain/train/(trainer|worker|checkpoint/checkpoint|loggers/loggers)\.hpp|hpctrain/train/strategies/(replicated|fully_sharded|one_rank|sharded|zero|zero_checkpoint)\.hpp|hpctrain/job/(cli|cli_options|login_commands|local_run|allocation_run)\.hpp|hpctrain/text/|hpctrain/dist/|hpctrain/models/(lora/lora|causal_lm|hf/hf_checkpoint|models)\.hpp|hpctrain/lm/(at_end|plan|sft_dataset|loss)\.hpp'
found=$(grep -oE "$machinery" "$depfile" | sort -u || true)
echo "$(grep -oE 'hpctrain/[a-z_/]+\.hpp' "$depfile" | sort -u | wc -l) hpctrain headers parsed by the program's unit"
if [ -n "$found" ]; then
  echo "the runtime's machinery, parsed by the program's unit:"
  echo "$found"
  exit 1
fi
echo "none of the runtime's machinery (the Trainer, strategies, command line, tokenizers, models, torch/torch.h)"
