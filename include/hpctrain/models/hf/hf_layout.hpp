#pragma once
// How a model family lays itself out in a Hugging Face directory — its config.json, its parameters' names there
// and the dtype its config stated — as an interface each family implements (GPT2Impl, LlamaImpl,
// RobertaForMaskedLMImpl). Whatever writes a model (save_pretrained, the unit-by-unit export, PEFT's adapter
// names) asks the model, never which family it is.
#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

namespace hpctrain::models {

/// How one family names its parameters in a Hugging Face checkpoint.
struct CheckpointNaming {
  /// The checkpoint's name of our parameter, and whether the stored tensor is its transpose.
  std::function<std::pair<std::string, bool>(const std::string& ours)> to_hf;
  /// Tensors a checkpoint may hold that the module does not need (e.g. GPT-2's causal-mask buffers).
  std::function<bool(const std::string& hf)> ignorable;
};

/// A model that can be written as a Hugging Face directory.
class HuggingFaceLayout {
 public:
  virtual ~HuggingFaceLayout() = default;
  /// The config.json that describes this model (its own model_type and architectures).
  virtual nlohmann::ordered_json hf_config() const = 0;
  /// Our parameter names → the checkpoint's.
  virtual CheckpointNaming hf_naming() const = 0;
  /// The dtype the config it was read from stated ("bfloat16", ...), or "" when none did.
  virtual std::string hf_stated_dtype() const = 0;
};

}  // namespace hpctrain::models
