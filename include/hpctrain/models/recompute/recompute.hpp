#pragma once
// What a checkpointed block keeps for backward (--activation-checkpointing none|selective|full): the choice
// ListsBlocks holds (models/blocks.hpp), the model's own forward and the fully sharded strategy act on
// (models/recompute/activation_checkpoint.hpp), and --plan counts (lm/memory_plan.hpp). Torch-free: the plan reads it.
#include <optional>
#include <string_view>

namespace hpctrain::models {

/// How a training forward keeps each transformer block's activations.
enum class Recompute {
  none,       ///< every activation kept (no recomputation)
  selective,  ///< the block's input and its matrix products' outputs kept; the elementwise work and norms run again
  full,       ///< only the block's input kept; the whole block runs again in backward
};

/// "none", "selective" or "full".
inline const char* recompute_name(Recompute recompute) {
  switch (recompute) {
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
    default: return "none";
  }
}

/// `none`, `selective` or `full`, and the knob's old boolean spellings (`true`: full, `false`: none); else nothing.
inline std::optional<Recompute> parse_recompute(std::string_view text) {
  if (text == "none" || text == "false" || text == "0" || text == "no" || text == "off") return Recompute::none;
  if (text == "selective") return Recompute::selective;
  if (text == "full" || text == "true" || text == "1" || text == "yes" || text == "on") return Recompute::full;
  return std::nullopt;
}

}  // namespace hpctrain::models
