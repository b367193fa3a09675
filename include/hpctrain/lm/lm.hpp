#pragma once
// The language-model layer (docs/lm.md): above models/ and train/, the pieces every LM program needs —
// the per-token loss and evaluation, a model from a Hugging Face directory, data from the job's preparation
// (token windows, masked blocks) or from JSONL, and what happens at the end (export, sample, val_loss).
#include <hpctrain/compiled_runtime.hpp>
#include <hpctrain/lm/hooks.hpp>
#include <hpctrain/lm/pretrained.hpp>
#include <hpctrain/lm/setting.hpp>
#include <hpctrain/models/lora/lora_config.hpp>
#include <hpctrain/models/recompute/recompute.hpp>
#include <hpctrain/train/metrics.hpp>
#include <hpctrain/train/training.hpp>
#if HPCTRAIN_RUNTIME_DEFINITIONS
// What the LM Trainings and hooks are made of. A program that links the runtime declares them only
// (compiled_runtime.hpp); it includes lm/tokens.hpp or lm/masked_lm_data.hpp itself for their data factories.
#include <hpctrain/lm/at_end.hpp>
#include <hpctrain/lm/loss.hpp>
#include <hpctrain/lm/masked_lm_data.hpp>
#include <hpctrain/lm/plan.hpp>
#include <hpctrain/lm/scratch.hpp>
#include <hpctrain/lm/sft_dataset.hpp>
#include <hpctrain/lm/tokens.hpp>
#include <hpctrain/models/lora/lora.hpp>
#endif

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hpctrain::lm {

/// The comma-separated names of `--lora-targets` ("q_proj,v_proj", "all-linear").
inline std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> names;
  std::string name;
  for (const char c : text + ",") {
    if (c != ',') name.push_back(c);
    else if (!name.empty()) names.push_back(std::exchange(name, {}));
  }
  return names;
}

/// LoRA as the knobs of causal_lm_training ask for it: none when --lora-r is 0.
inline std::optional<models::LoraConfig> lora_from_knobs(const Knobs& knobs) {
  models::LoraConfig config;
  config.r = knobs.get<std::int64_t>("lora_r");
  if (config.r == 0) return std::nullopt;
  config.alpha = knobs.get<double>("lora_alpha");
  config.dropout = knobs.get<double>("lora_dropout");
  config.targets = split_names(knobs.get<std::string>("lora_targets"));
  config.use_rslora = knobs.get<bool>("lora_rslora");
  return config;
}

/// `training` with the LoRA knobs (`--lora-r 16 --lora-alpha 32 --lora-targets q_proj,v_proj --lora-dropout
/// --lora-rslora`; r 0, the default, trains every parameter) and the adapters they ask for (lora_from_knobs).
inline Training with_lora_knobs(Training training) {
  return training
      .knob<std::int64_t>("lora_r", 0, "LoRA rank: train adapters of this rank instead of every parameter (0: off)",
                          non_negative())
      .knob<double>("lora_alpha", 16.0, "LoRA alpha (the adapters are scaled by alpha / r)", positive())
      .knob<double>("lora_dropout", 0.0, "dropout on the LoRA adapters' input", between(0.0, 0.99))
      .knob<std::string>("lora_targets", "q_proj,v_proj", "layers that get adapters, comma-separated (or all-linear)")
      .knob<bool>("lora_rslora", false, "scale the adapters by alpha / sqrt(r) (rsLoRA)")
      .lora(lora_from_knobs);
}

/// What --activation-checkpointing accepts, in words (its check's requirement).
inline constexpr const char* recompute_requirement = "must be none, selective or full (true: full, false: none)";

#if HPCTRAIN_RUNTIME_DEFINITIONS
/// lm::causal_lm_training's --activation-checkpointing on the made model: none, selective (each transformer block
/// recomputed in backward except its matrix products, kept from the forward) or full (every block recomputed,
/// keeping only its input: a third more compute for the blocks' activations' memory; under ZeRO-3 too, which
/// otherwise keeps them as FSDP does). SpecError when it is on and the model is not a models::CausalLM.
inline void activation_checkpointing_from_knobs(torch::nn::Module& module, const Knobs& knobs) {
  const auto text = knobs.get<std::string>("activation_checkpointing");
  const auto recompute = models::parse_recompute(text);
  if (!recompute)
    throw SpecError(errors::spec_knob, "--activation-checkpointing",
                    fmt::format("{:?}: {}", text, recompute_requirement));
  auto* model = dynamic_cast<models::CausalLM*>(&module);
  if (model != nullptr) model->set_activation_checkpointing(*recompute);
  else if (*recompute != models::Recompute::none)
    throw SpecError(errors::spec_knob, "--activation-checkpointing",
                    fmt::format("needs a models::CausalLM (GPT-2, Llama, ...); the model is {}", module.name()));
}
#endif

/// A Training for a causal language model: next-token loss over the counted targets (fp32), the packed-aware
/// step (`--loss-chunk-tokens N`: the head and the loss N tokens at a time; `--activation-checkpointing
/// none|selective|full`),
/// per-token evaluation and perplexity, and the LoRA knobs (`--lora-r 16 --lora-alpha 32 --lora-targets
/// q_proj,v_proj`; r 0, the default, trains every parameter). Add the model, data, optimizer and the rest.
HPCTRAIN_RUNTIME_INLINE Training causal_lm_training();

/// A Training for a masked language model (RoBERTa, BERT): the same per-token cross entropy, whose counted
/// targets are the masked positions (fp32), evaluation per masked token, and the accuracy on them. Add the
/// model, the data (prepared_masked_blocks) and the rest.
HPCTRAIN_RUNTIME_INLINE Training masked_lm_training();

#if HPCTRAIN_RUNTIME_DEFINITIONS
namespace detail {
/// A language model's step loss: the mean over every counted token of the global batch (token_loss_count), with the
/// knob that asks for the mean of the micro-batches' means instead.
inline Training with_token_weighted_loss(Training training) {
  return training.loss_count(token_loss_count)
      .knob<bool>(micro_batch_mean_knob, false,
                  "weigh every micro-batch's mean loss alike, on every rank, instead of every counted token of the "
                  "global batch alike (the loss then depends on how the batch is split into ranks and micro-batches)");
}
}  // namespace detail

HPCTRAIN_RUNTIME_INLINE Training causal_lm_training() {
  Training training = detail::with_token_weighted_loss(Training());
  training.loss(token_loss)
      .step(chunked_causal_lm_step)
      .eval_step(token_eval_step)
      .metric(metrics::perplexity)
      .memory_plan(plan_memory_of_run)
      .knob<std::string>(
          "activation_checkpointing", "none",
          "recompute transformer blocks in backward instead of keeping their activations: selective "
          "keeps the matrix products' outputs and recomputes the rest, full keeps only each block's input",
          KnobCheck<std::string>([](const std::string& v) { return models::parse_recompute(v).has_value(); },
                                 recompute_requirement))
      .knob_bare_value("activation_checkpointing", "full", "[none|selective|full]")
      .on_model(activation_checkpointing_from_knobs)
      .knob<std::int64_t>(
          loss_chunk_knob, 0,
          "apply the head and the loss this many tokens at a time: the tokens x vocabulary logits are never whole "
          "(0: whole logits)",
          non_negative());
  return with_lora_knobs(std::move(training));
}

HPCTRAIN_RUNTIME_INLINE Training masked_lm_training() {
  return detail::with_token_weighted_loss(Training())
      .loss(token_loss)
      .step(token_loss_step)
      .eval_step(token_eval_step)
      .metric(masked_accuracy);
}
#endif  // HPCTRAIN_RUNTIME_DEFINITIONS

}  // namespace hpctrain::lm
