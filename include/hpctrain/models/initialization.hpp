#pragma once
// The initialisation transformers' families share (`_init_weights`): every linear and embedding weight
// N(0, std), linear biases 0, LayerNorms 1 and 0. Families add their own touches after it (GPT-2's scaled
// residual projections, RoBERTa's zeroed padding rows, Llama's RMSNorms).
#include <torch/torch.h>

#include <hpctrain/models/deferred_initialization.hpp>
#include <hpctrain/models/weights_from_checkpoint.hpp>

namespace hpctrain::models {

/// Initialises the linear layers, embeddings and LayerNorms below `module` as transformers does, in the
/// order `modules()` lists them (the random draws, and so the weights, depend on that order). Through
/// init_normal/init_fill, so a block built empty (DeferredInitialization) records its values instead.
inline void initialize_normal(torch::nn::Module& module, double std) {
  if (WeightsFromCheckpoint::active()) return;  // a checkpoint writes every parameter
  for (auto& child : module.modules(/*include_self=*/false)) {
    if (auto* linear = child->as<torch::nn::Linear>()) {
      init_normal(linear->weight, 0.0, std);
      if (linear->bias.defined()) init_fill(linear->bias, 0.0);
    } else if (auto* embedding = child->as<torch::nn::Embedding>()) {
      init_normal(embedding->weight, 0.0, std);
    } else if (auto* norm = child->as<torch::nn::LayerNorm>()) {
      init_fill(norm->weight, 1.0);
      init_fill(norm->bias, 0.0);
    }
  }
}

}  // namespace hpctrain::models
