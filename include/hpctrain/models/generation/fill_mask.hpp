#pragma once
// Filling masked positions with a masked language model (RoBERTa, BERT): transformers' `pipeline("fill-mask")`.
// What generation.hpp is to causal models (examples/fill_mask.cpp is the tool).
#include <algorithm>
#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include <hpctrain/models/roberta.hpp>

namespace hpctrain::models {

/// One candidate for a masked position: the token and its probability.
struct MaskCandidate {
  std::int64_t id = 0;
  double probability = 0;
};

/// What transformers' `pipeline("fill-mask")` computes: for each position of `ids` ([T], one sequence, special
/// tokens included) that holds `mask_id`, in order, the `top_k` likeliest tokens with their softmax
/// probabilities (fp32, eval mode, no gradient).
inline std::vector<std::vector<MaskCandidate>> fill_mask(RobertaForMaskedLMImpl& model,
                                                         const std::vector<std::int64_t>& ids, std::int64_t mask_id,
                                                         std::int64_t top_k = 5) {
  torch::NoGradGuard no_grad;
  model.eval();
  const auto logits = model.forward(torch::tensor(ids, torch::kInt64).unsqueeze(0)).squeeze(0).to(torch::kFloat32);
  std::vector<std::vector<MaskCandidate>> filled;
  for (std::size_t position = 0; position < ids.size(); ++position) {
    if (ids[position] != mask_id) continue;
    const auto [probabilities, tokens] =
        logits[static_cast<std::int64_t>(position)].softmax(-1).topk(std::min(top_k, logits.size(-1)));
    auto& candidates = filled.emplace_back();
    for (std::int64_t k = 0; k < tokens.size(0); ++k)
      candidates.push_back({tokens[k].item<std::int64_t>(), probabilities[k].item<double>()});
  }
  return filled;
}

}  // namespace hpctrain::models
