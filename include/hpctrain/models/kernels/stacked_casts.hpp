#pragma once
// The weights of projections fused into one product (models/kernels/fused_projections.hpp) cast into one buffer, and
// their parameters' gradients as row ranges of one product: shared by the autograd nodes that narrow them, bf16
// (models/kernels/mixed_precision_products.hpp) and float8 (models/kernels/float8_projections.hpp).
#include <cstddef>
#include <cstdint>
#include <vector>

#include <torch/torch.h>

namespace hpctrain::models::detail {

/// `tensors` (equal but for their first dimension) cast to `dtype` into one tensor, stacked along the first
/// dimension: one cast kernel each, no concatenation.
inline torch::Tensor cast_stacked(at::TensorList tensors, c10::ScalarType dtype) {
  if (tensors.size() == 1) return tensors[0].to(dtype);
  auto shape = tensors[0].sizes().vec();
  shape[0] = 0;
  for (const auto& t : tensors) shape[0] += t.size(0);
  auto out = torch::empty(shape, tensors[0].options().dtype(dtype));
  std::int64_t row = 0;
  for (const auto& t : tensors) {
    out.narrow(0, row, t.size(0)).copy_(t);
    row += t.size(0);
  }
  return out;
}

/// Into `out` (the node's gradients: x, then the weights, then the biases), the gradients of the stacked weights and
/// biases a backward wants: the weights' as the row ranges `rows` of one product `weights_gradient()` (gᵀ·x, asked
/// only when one is wanted), the biases' as g's sums over the tokens, in `dtype`.
template <class WeightsGradient>
void stacked_parameter_gradients(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list& out,
                                 const std::vector<std::int64_t>& rows, std::size_t biases, const torch::Tensor& g,
                                 c10::ScalarType dtype, WeightsGradient weights_gradient) {
  bool any_weight = false, any_bias = false;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    any_weight = any_weight || ctx->needs_input_grad(1 + i);
    if (i < biases) any_bias = any_bias || ctx->needs_input_grad(1 + rows.size() + i);
  }
  if (any_weight) {
    const auto parts = weights_gradient().split_with_sizes(rows, 0);
    for (std::size_t i = 0; i < rows.size(); ++i)
      if (ctx->needs_input_grad(1 + i)) out[1 + i] = parts[i];
  }
  if (any_bias) {
    const auto parts = g.sum(0, /*keepdim=*/false, dtype).split_with_sizes(rows, 0);
    for (std::size_t i = 0; i < biases; ++i)
      if (ctx->needs_input_grad(1 + rows.size() + i)) out[1 + rows.size() + i] = parts[i];
  }
}

}  // namespace hpctrain::models::detail
