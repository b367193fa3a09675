#pragma once
// A model that starts from a Hugging Face directory (config.json, model.safetensors or shards, and the
// tokenizer files): `.model(lm::from_pretrained(dir))`. The Training learns the directory from it
// (`pretrained_directory`), so the data, the export and the sample find the same tokenizer. A directory with no
// weights (config.json and the tokenizer alone) gives the model of that config with random weights from the run's
// seed, as transformers' `from_config`: a run at a model's real shape without downloading its weights.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include <fmt/format.h>

#include <torch/types.h>  // torch::Dtype

#include <hpctrain/compiled_runtime.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/lm/setting.hpp>
#include <hpctrain/train/run_context.hpp>
#include <hpctrain/train/training.hpp>
#if HPCTRAIN_RUNTIME_DEFINITIONS  // the families and the checkpoint reader: the runtime's (compiled_runtime.hpp)
#include <hpctrain/models/hf/hf_checkpoint.hpp>
#include <hpctrain/models/hf/pretrained_config.hpp>
#endif

namespace hpctrain::models {
class CausalLM;  // models/causal_lm.hpp
}  // namespace hpctrain::models

namespace hpctrain::lm {

/// The model factory of `from_pretrained`.
class Pretrained {
 public:
  explicit Pretrained(Setting<std::filesystem::path> directory) : directory_(std::move(directory)) {}
  /// The weights' dtype once loaded. Default: fp32 (the Trainer's master weights; bf16 runs under autocast).
  Pretrained& dtype(torch::Dtype dtype) {
    dtype_ = dtype;
    return *this;
  }

  /// Loads the model in the worker; rank 0 prints what the config says (and any keys it did not read), so a
  /// user can compare it with the model card. A directory without weights: the config's model with random weights
  /// drawn from the run's seed (the same on every rank), which rank 0 says.
  HPCTRAIN_RUNTIME_INLINE std::shared_ptr<models::CausalLM> operator()(const RunContext& run) const;
  /// The same, as the Training holds a model (Training::model takes it): a program's description then needs
  /// no complete models::CausalLM, whose families are compiled with the runtime.
  HPCTRAIN_RUNTIME_INLINE ModelInstance model_instance(const RunContext& run) const;
  /// The directory for this run's knobs.
  std::filesystem::path pretrained_directory(const Knobs& knobs) const { return directory_.get(knobs); }
  /// On the login node: the directory exists and has a config.json (the weights, if any, are read in the worker).
  HPCTRAIN_RUNTIME_INLINE void check_at_login(const Knobs& knobs) const;

 private:
  Setting<std::filesystem::path> directory_;
  torch::Dtype dtype_ = torch::kFloat32;
};

/// The model in Hugging Face directory `directory` (a path, or `lm::knob("from")`).
inline Pretrained from_pretrained(Setting<std::filesystem::path> directory) { return Pretrained(std::move(directory)); }

#if HPCTRAIN_RUNTIME_DEFINITIONS
HPCTRAIN_RUNTIME_INLINE std::shared_ptr<models::CausalLM> Pretrained::operator()(const RunContext& run) const {
  const auto directory = pretrained_directory(run.knobs);
  if (run.rank == 0) {
    const auto reading = models::read_config_reading(directory);
    fmt::print("hpctrain: {}: {}\n", directory.string(), reading.summary);
    if (const auto warning = reading.warning(directory / "config.json"); !warning.empty())
      fmt::print(stderr, "{}\n", warning);
  }
  if (!models::holds_weights(directory)) {
    if (run.rank == 0)
      fmt::print(
          "hpctrain: {} holds no weights (no model.safetensors, no model.safetensors.index.json): the model is "
          "built from its config.json with random weights, seed {}\n",
          directory.string(), run.seed);
    // Seeded here, so the weights depend on the seed alone. Under ZeRO-3 the Trainer records the blocks'
    // initialisation and each rank rebuilds only its slices (models/deferred_initialization.hpp).
    torch::manual_seed(static_cast<std::uint64_t>(run.seed));
    return models::build_from_config(directory, dtype_);
  }
  // Under ZeRO-3 the blocks stay empty until each rank reads its own slices of them (models/blocks.hpp); where the
  // Trainer reads them itself (trainer_reads_blocks), until it has chosen their dtype.
  return run.defer_blocks || run.trainer_reads_blocks ? models::load_pretrained_deferred(directory, dtype_)
                                                      : models::load_pretrained(directory, dtype_);
}

HPCTRAIN_RUNTIME_INLINE ModelInstance Pretrained::model_instance(const RunContext& run) const {
  return hpctrain::detail::make_model_instance((*this)(run));
}

HPCTRAIN_RUNTIME_INLINE void Pretrained::check_at_login(const Knobs& knobs) const {
  const auto directory = pretrained_directory(knobs);
  const auto subject =
      directory_.knob_name() ? "--" + *directory_.knob_name() + " = " + directory.string() : directory.string();
  if (!std::filesystem::is_directory(directory)) throw SpecError(errors::spec_knob, subject, "no such directory");
  if (!std::filesystem::is_regular_file(directory / "config.json"))
    throw SpecError(errors::spec_knob, subject, "has no config.json (not a Hugging Face model directory)");
  models::read_config_reading(directory);  // a setting hpctrain does not implement fails here, before the queue
}
#endif  // HPCTRAIN_RUNTIME_DEFINITIONS

}  // namespace hpctrain::lm
