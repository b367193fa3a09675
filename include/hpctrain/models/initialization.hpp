#pragma once
// The initialisation transformers' families share (`_init_weights`): every linear and embedding weight
// N(0, std), linear biases 0, LayerNorms 1 and 0. Families add their own touches after it (GPT-2's scaled
// residual projections, RoBERTa's zeroed padding rows, Llama's RMSNorms).
#include <torch/torch.h>

namespace hpctrain::models {

/// Initialises the linear layers, embeddings and LayerNorms below `module` as transformers does, in the
/// order `modules()` lists them (the random draws, and so the weights, depend on that order).
inline void initialize_normal(torch::nn::Module& module, double std) {
  torch::NoGradGuard no_grad;
  for (auto& child : module.modules(/*include_self=*/false)) {
    if (auto* linear = child->as<torch::nn::Linear>()) {
      linear->weight.normal_(0.0, std);
      if (linear->bias.defined()) linear->bias.zero_();
    } else if (auto* embedding = child->as<torch::nn::Embedding>()) {
      embedding->weight.normal_(0.0, std);
    } else if (auto* norm = child->as<torch::nn::LayerNorm>()) {
      norm->weight.fill_(1.0);
      norm->bias.zero_();
    }
  }
}

}  // namespace hpctrain::models
