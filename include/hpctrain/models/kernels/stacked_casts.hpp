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

/// What a stacked projection's autograd node keeps for its backward (keep, in its forward) and reads there (of).
struct SavedProjection {
  torch::Tensor narrow_x;  ///< x cast for the products, kept where the parameters' gradients are wanted
  torch::Tensor weight;    ///< the stacked weights' cast, kept where x's gradient is wanted
  std::vector<std::int64_t> rows, x_shape;  ///< each weight's rows; x's shape
  std::size_t biases = 0;
  c10::ScalarType x_dtype = c10::ScalarType::Float, narrow = c10::ScalarType::BFloat16,
                  parameter_dtype = c10::ScalarType::Float;

  /// Keeps each operand only for the gradient that needs it: x's cast for the weights', the weights' cast for x's.
  /// Under LoRA the frozen base products keep no input: when they kept it, TinyLlama's LoRA row at 8 x 1024 peaked
  /// 5.2 GiB above the plan on an H200 (31,744 bytes a token and layer, docs/gpu.md).
  static void keep(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& narrow_x,
                   const torch::Tensor& weight, at::TensorList weights, at::TensorList biases, c10::ScalarType dtype) {
    std::vector<std::int64_t> rows;
    for (const auto& w : weights) rows.push_back(w.size(0));
    bool parameter_gradient = false;
    for (const auto& list : {weights, biases})
      for (const auto& t : list) parameter_gradient = parameter_gradient || t.requires_grad();
    ctx->save_for_backward(
        {parameter_gradient ? narrow_x : torch::Tensor(), x.requires_grad() ? weight : torch::Tensor()});
    ctx->saved_data["x_shape"] = x.sizes().vec();
    ctx->saved_data["x_dtype"] = static_cast<std::int64_t>(x.scalar_type());
    ctx->saved_data["dtype"] = static_cast<std::int64_t>(dtype);
    ctx->saved_data["parameter_dtype"] = static_cast<std::int64_t>(weights[0].scalar_type());
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["biases"] = static_cast<std::int64_t>(biases.size());
  }

  static SavedProjection of(torch::autograd::AutogradContext* ctx) {
    const auto saved = ctx->get_saved_variables();
    SavedProjection projection;
    projection.narrow_x = saved[0];
    projection.weight = saved[1];
    projection.rows = ctx->saved_data["rows"].toIntVector();
    projection.x_shape = ctx->saved_data["x_shape"].toIntVector();
    projection.biases = static_cast<std::size_t>(ctx->saved_data["biases"].toInt());
    projection.x_dtype = static_cast<c10::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    projection.narrow = static_cast<c10::ScalarType>(ctx->saved_data["dtype"].toInt());
    projection.parameter_dtype = static_cast<c10::ScalarType>(ctx->saved_data["parameter_dtype"].toInt());
    return projection;
  }
};

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
