#pragma once
// The LoRA configuration (models/lora/lora.hpp applies it): plain data, torch-free, so that a Training and the run's
// context can hold one without parsing the adapters' layers and PEFT's files (compiled_runtime.hpp).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <hpctrain/error.hpp>

namespace hpctrain::models {

/// Which layers get an adapter and how it is scaled (PEFT's LoraConfig fields).
struct LoraConfig {
  std::int64_t r = 8;                                    ///< rank. Default: 8
  double alpha = 16;                                     ///< lora_alpha. Default: 16
  double dropout = 0.0;                                  ///< lora_dropout on the adapter's input. Default: 0
  std::vector<std::string> targets{"q_proj", "v_proj"};  ///< layer names, or {"all-linear"}. Default: q_proj, v_proj
  bool use_rslora = false;                               ///< scale by alpha/√r. Default: false

  /// alpha / r, or alpha / √r with rsLoRA.
  double scaling() const {
    return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
  }
  /// SpecError `[hpctrain.spec.lora.<field>]` for an invalid value.
  void validate() const {
    using hpctrain::detail::require;
    require(r >= 1, "lora.r", r, "must be at least 1");
    require(alpha > 0, "lora.alpha", alpha, "must be positive");
    require(dropout >= 0 && dropout < 1, "lora.dropout", dropout, "must be in [0, 1)");
    require(!targets.empty(), "lora.targets", "[]", "name at least one layer (q_proj, v_proj, ..., or all-linear)");
  }
};

/// Whether the layer at dotted path `name` (e.g. "layers.0.self_attn.q_proj") is a target of `config`.
inline bool is_lora_target(const std::string& name, const LoraConfig& config) {
  const auto last = name.substr(name.rfind('.') + 1);
  for (const auto& target : config.targets)
    if (target == "all-linear" ? last != "lm_head" : (last == target || name == target)) return true;
  return false;
}

}  // namespace hpctrain::models
