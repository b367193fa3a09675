#pragma once
// The language-model hooks at the end of a run, declared: what a program's description names. Their definitions
// and the machinery behind them (the export, generation, tokenizers) are in lm/at_end.hpp, which a program that
// links the runtime does not parse (compiled_runtime.hpp).
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include <hpctrain/compiled_runtime.hpp>
#include <hpctrain/lm/setting.hpp>
#include <hpctrain/train/run_context.hpp>

namespace hpctrain::lm {

/// At the end, rank 0 writes the model — a causal LM (GPT-2, Llama, ...; with LoRA its PEFT adapter and the
/// merged model) or a masked LM (RoBERTa, BERT) — to `directory` (default: `<run dir>/export`) as a Hugging
/// Face directory with the run's tokenizer files, and says where.
HPCTRAIN_RUNTIME_INLINE FinishHook hf_export(std::optional<std::filesystem::path> directory = std::nullopt);

/// At the end, rank 0 prints `sample (greedy): <prompt><continuation>` — `tokens` new tokens (or fewer when
/// the model's positions run out) decoded with the run's tokenizer, computed in the run's precision. Under
/// ZeRO-3/HSDP every rank generates alongside, each block gathered while it runs: no rank holds the whole model.
HPCTRAIN_RUNTIME_INLINE FinishHook sample_at_end(Setting<std::string> prompt,
                                                 Setting<std::int64_t> tokens = std::int64_t{40});

/// At the end, rank 0 prints `<name>=<final evaluation loss>` (four decimals), the line scripts look for.
HPCTRAIN_RUNTIME_INLINE FinishHook print_eval_loss(std::string name = "val_loss");

}  // namespace hpctrain::lm
