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
//
// On CUDA under autocast each direction is one kernel compiled at run time (models/runtime_kernels.hpp), where the
// composite operations run four (a product, a negation, a concatenation, a multiply-add; five backward with the
// cast): the output written as [.., 2, D/2], each half from both halves of x read as broadcast inputs. Its inputs
// share one dtype (the kernel's T; fp32 angles would make its output fp32), so the angles reach it as bf16 pairs
// whose sum is the fp32 value to about 2^-17 (RotaryAngles, made once per forward), and its sums run in fp32:
// within one bf16 rounding of the composite path's result.
#include <cmath>
#include <string>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <hpctrain/models/runtime_kernels.hpp>

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

// The kernels' sources. Inputs: x's (or the gradient's) halves, each [.., 1, D/2]; the angles' bf16 pairs, each
// [.., 2, D/2]; `first`, 1 at the first half. Forward y₁ = x₁·cos - x₂·sin, y₂ = x₂·cos + x₁·sin (cos and sin at
// the output's own position); backward dx₁ = g₁·cos + g₂·sin', dx₂ = g₂·cos - g₁·sin' with sin' the sine at the
// other half's position (rotate_halfᵀ).
inline const std::string rotary_code = R"(
template <typename T> T hpctrain_rotary(T x1, T x2, T cos_high, T cos_low, T sin_high, T sin_low, T first) {
  const float a = static_cast<float>(x1), b = static_cast<float>(x2);
  const float c = static_cast<float>(cos_high) + static_cast<float>(cos_low);
  const float s = static_cast<float>(sin_high) + static_cast<float>(sin_low);
  if (static_cast<float>(first) != 0.0f) return static_cast<T>(a * c - b * s);
  return static_cast<T>(b * c + a * s);
})";
inline const std::string rotary_backward_code = R"(
template <typename T> T hpctrain_rotary_backward(T g1, T g2, T cos_high, T cos_low, T sin_high, T sin_low, T first) {
  const float a = static_cast<float>(g1), b = static_cast<float>(g2);
  const float c = static_cast<float>(cos_high) + static_cast<float>(cos_low);
  const float s = static_cast<float>(sin_high) + static_cast<float>(sin_low);
  if (static_cast<float>(first) != 0.0f) return static_cast<T>(a * c + b * s);
  return static_cast<T>(b * c - a * s);
})";

/// The angles as the kernels read them: cos, sin and sin with its halves swapped, each [.., 2, D/2], split into bf16
/// (or fp16) pairs: [6, .., 2, D/2] = cos high, cos low, sin high, sin low, swapped sin high, swapped sin low.
inline torch::Tensor rotary_kernel_angles(const torch::Tensor& cos, const torch::Tensor& sin, c10::ScalarType narrow) {
  const auto half = cos.size(-1) / 2;
  const auto c = cos.to(torch::kFloat32).unflatten(-1, {2, half}), s = sin.to(torch::kFloat32).unflatten(-1, {2, half});
  const auto values = torch::stack({c, s, s.flip(-2)});
  const auto high = values.to(narrow);
  const auto low = (values - high.to(torch::kFloat32)).to(narrow);
  return torch::stack({high, low}, 1).flatten(0, 1);
}

/// The rotary kernel over x (or a gradient) [.., D] with the angles' pairs `angles` (rotary_kernel_angles), the
/// forward's or the backward's: [.., D] in x's dtype.
inline torch::Tensor rotary_kernel(const torch::Tensor& x, const torch::Tensor& angles, bool backward) {
  const auto half = x.size(-1) / 2;
  const auto x1 = x.narrow(-1, 0, half).unsqueeze(-2), x2 = x.narrow(-1, half, half).unsqueeze(-2);
  const int sine = backward ? 4 : 2;
  auto y = runtime_kernel(
      backward ? rotary_backward_code : rotary_code, backward ? "hpctrain_rotary_backward" : "hpctrain_rotary",
      {x1, x2, angles[0], angles[1], angles[sine], angles[sine + 1], first_half_selector(x.options())});
  return y.flatten(-2);  // [.., 2, D/2] -> [.., D]
}

/// The composite operations: x·cos + rotate_half(x)·sin in x's dtype (`narrow_output`, under autocast: written so
/// by the kernel that computes it in fp32), else in the operands' common dtype.
inline torch::Tensor rotary_composite(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                      bool narrow_output) {
  if (narrow_output) {
    auto y = at::empty_like(x);
    return at::addcmul_out(y, x * cos, rotate_half(x), sin);
  }
  return torch::addcmul(x * cos, rotate_half(x), sin);
}

/// Whether the rotary kernels run for x of `dtype` on `device`: runtime_kernels_possible, bf16 or fp16, and on a small
/// probe (asked once per process) they compile and agree with the composite path both ways.
inline bool rotary_kernels(const torch::Device& device, c10::ScalarType dtype) {
  if (!runtime_kernels_possible(device) || (dtype != torch::kBFloat16 && dtype != torch::kHalf)) return false;
  static const bool agree = kernels_agree([device] {
    const auto options = torch::TensorOptions().device(device);
    const auto x = torch::randn({2, 16, 4, 64}, options.dtype(torch::kBFloat16)).transpose(1, 2);  // q's layout
    const auto angles = torch::arange(16, options).unsqueeze(-1) * torch::rand({64}, options);
    const auto cos = angles.cos(), sin = angles.sin();
    const auto pairs = rotary_kernel_angles(cos, sin, torch::kBFloat16);
    const auto backward = rotate_half_transposed(x * sin) + x * cos;
    return close_to_composite(rotary_kernel(x, pairs, false), rotary_composite(x, cos, sin, true)) &&
           close_to_composite(rotary_kernel(x, pairs, true), backward.to(torch::kBFloat16));
  });
  return agree;
}

/// The angles' pairs for the runtime-compiled kernels (rotary_kernel_angles), passed through the node as a
/// constant; undefined where they were not made.
struct RotaryKernelAngles {
  torch::Tensor pairs;
};

struct Rotary : torch::autograd::Function<Rotary> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin, RotaryKernelAngles kernel) {
    // Under autocast a bf16 x times fp32 angles would make an fp32 result that attention casts back to bf16 (a
    // kernel each way, and one more for the gradient): written in x's dtype here instead, by the same kernel that
    // computes it in fp32, it is the same bf16 tensor attention would have made. x's layout is kept.
    const auto device = x.device().type();
    const bool narrow_output =
        at::autocast::is_autocast_enabled(device) && x.scalar_type() == at::autocast::get_autocast_dtype(device);
    ctx->saved_data["dtype"] = x.scalar_type();
    if (narrow_output && kernel.pairs.defined() && kernel.pairs.scalar_type() == x.scalar_type() &&
        rotary_kernels(x.device(), x.scalar_type())) {
      ctx->save_for_backward({kernel.pairs});
      return rotary_kernel(x, kernel.pairs, false);
    }
    ctx->save_for_backward({cos, sin});
    return rotary_composite(x, cos, sin, narrow_output);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& g = grads[0];
    const auto dtype = ctx->saved_data["dtype"].toScalarType();
    if (saved.size() == 1) return {rotary_kernel(g.to(dtype), saved[0], true), {}, {}, {}};
    auto dx = torch::addcmul(rotate_half_transposed(g * saved[1]), g, saved[0]);
    return {dx.to(dtype), {}, {}, {}};
  }
};
}  // namespace detail

/// The rotary angles of one forward: cos and sin ([T, D] or [B, 1, T, D]), and on CUDA under a narrow autocast
/// dtype the pairs the runtime-compiled kernels read, made here once for every layer.
struct RotaryAngles {
  torch::Tensor cos, sin;
  detail::RotaryKernelAngles kernel;
};

/// RotaryAngles of `cos` and `sin`, for queries and keys on `device` (the pairs when kernels may run there under
/// autocast).
inline RotaryAngles rotary_angles(torch::Tensor cos, torch::Tensor sin, const torch::Device& device) {
  RotaryAngles angles{std::move(cos), std::move(sin), {}};
  const auto type = device.type();
  if (at::autocast::is_autocast_enabled(type)) {
    const auto narrow = at::autocast::get_autocast_dtype(type);
    if (detail::rotary_kernels(device, narrow))
      angles.kernel.pairs = detail::rotary_kernel_angles(angles.cos, angles.sin, narrow);
  }
  return angles;
}

/// Rotates `x` [B, H, T, D] by `angles` (cos and sin [T, D] or broadcastable to x; constants: they get no gradient).
inline torch::Tensor apply_rotary(const torch::Tensor& x, const RotaryAngles& angles) {
  return detail::Rotary::apply(x, angles.cos, angles.sin, angles.kernel);
}

/// Rotates `x` [B, H, T, D] by the angles whose cos and sin are given ([T, D] or broadcastable to x; constants:
/// they get no gradient). The composite operations (no kernel pairs made).
inline torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  return detail::Rotary::apply(x, cos, sin, detail::RotaryKernelAngles{});
}

}  // namespace hpctrain::models
