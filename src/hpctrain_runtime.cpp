// The runtime's one implementation unit (compiled_runtime.hpp): compiled once per build tree into
// `hpctrain::runtime`, it defines, out of line, the entry points that programs linking that library only
// declare — `run`, the Training's defaults, the language-model factories and hooks — and with them
// everything they reach: the Trainer, the strategies, checkpoints, tokenizers, Jinja, safetensors, the
// command line.
#ifndef HPCTRAIN_SEPARATE_RUNTIME
#error "compile src/hpctrain_runtime.cpp with HPCTRAIN_SEPARATE_RUNTIME (the hpctrain::runtime target does)"
#endif
#define HPCTRAIN_RUNTIME_IMPLEMENTATION
#include <hpctrain/hpctrain.hpp>
#include <hpctrain/lm/sft.hpp>
