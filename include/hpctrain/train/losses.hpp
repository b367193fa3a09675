#pragma once
// Losses a custom step (train/step.hpp) reads from the batch: the cross entropy over the positions a mask keeps,
// as SFT takes it over the answer tokens only.
#include <torch/types.h>  // ATen's cross_entropy_loss, the op torch::nn::functional::cross_entropy calls: this header
                          // stays in the slim umbrella (compiled_runtime.hpp) without torch/nn/functional's headers

namespace hpctrain {

/// The mean cross entropy of `logits` [..., V] against `targets` [...] over the positions where `mask` [...] is 1
/// (a 0/1 field such as a batch's "loss_mask"): the sum over the kept positions divided by their number, in fp32
/// whatever the forward's precision, and 0 rather than NaN when the mask keeps none.
inline torch::Tensor masked_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                          const torch::Tensor& mask) {
  const auto per_position = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32),
                                                   targets.reshape({-1}), /*weight=*/{}, at::Reduction::None);
  const auto kept = mask.reshape({-1}).to(torch::kFloat32);
  return (per_position * kept).sum() / kept.sum().clamp_min(1);
}

}  // namespace hpctrain
