#pragma once
// Rotary position embeddings in Hugging Face's layout (each head's two halves turned against each other,
// "rotate_half"): y = x·cos + rotate_half(x)·sin, with rotate_half(x) = [-x₂, x₁].
//
// Written as autograd would differentiate it (cat of a negated narrow and a narrow), backward turns each narrow
// into a zero-filled tensor of x's size with the part copied in, and adds three tensors, each rounded to x's
// dtype first: eight passes over memory where three do. Here backward is its closed form,
// dx = g·cos + rotate_halfᵀ(g·sin) with rotate_halfᵀ(u) = [u₂, -u₁] (rotation by the opposite angle), computed in
// g's dtype and rounded to x's once: in fp32 within one rounding of autograd's (a fused multiply-add where autograd
// rounds twice), under bf16 closer to the exact gradient (tests/models/fused_projections_test.cpp).
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

namespace hpctrain::models {

namespace detail {
/// [-x₂, x₁] over the last dimension.
inline torch::Tensor rotate_half(const torch::Tensor& x) {
  const auto half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

/// [u₂, -u₁] over the last dimension: rotate_half's transpose.
inline torch::Tensor rotate_half_transposed(const torch::Tensor& u) {
  const auto half = u.size(-1) / 2;
  return torch::cat({u.narrow(-1, half, half), -u.narrow(-1, 0, half)}, -1);
}

struct Rotary : torch::autograd::Function<Rotary> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["dtype"] = x.scalar_type();
    // Under autocast a bf16 x times fp32 angles would make an fp32 result that attention casts back to bf16 (a
    // kernel each way, and one more for the gradient): written in x's dtype here instead, by the same kernel that
    // computes it in fp32, it is the same bf16 tensor attention would have made. x's layout is kept.
    const auto device = x.device().type();
    if (at::autocast::is_autocast_enabled(device) && x.scalar_type() == at::autocast::get_autocast_dtype(device)) {
      auto y = at::empty_like(x);
      return at::addcmul_out(y, x * cos, rotate_half(x), sin);
    }
    return torch::addcmul(x * cos, rotate_half(x), sin);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& g = grads[0];
    auto dx = torch::addcmul(rotate_half_transposed(g * saved[1]), g, saved[0]);
    return {dx.to(ctx->saved_data["dtype"].toScalarType()), torch::Tensor(), torch::Tensor()};
  }
};
}  // namespace detail

/// Rotates `x` [B, H, T, D] by the angles whose cos and sin are given ([T, D] or broadcastable to x; constants:
/// they get no gradient).
inline torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  return detail::Rotary::apply(x, cos, sin);
}

}  // namespace hpctrain::models
