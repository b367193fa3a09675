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
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ExpandUtils.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <hpctrain/models/nvrtc_kernels.hpp>
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

// The row kernel (models/nvrtc_kernels.hpp): a block of `half` x rows-per-block threads over one head of one batch
// row (blockIdx.y, blockIdx.z) and that many tokens; each thread reads the pair (j, j + D/2) of x and of the fp32
// angles through their strides and writes the pair of y: no index arithmetic beyond the strides, the angles read
// as they are (no bf16 pairs). Forward y₁ = x₁c₁ - x₂s₁, y₂ = x₂c₂ + x₁s₂; backward (x the gradient)
// dx₁ = g₁c₁ + g₂s₂, dx₂ = g₂c₂ - g₁s₁.
inline const std::string rotary_row_code = R"(
extern "C" __global__ void hpctrain_rotary_rows(const elem* x, elem* y, const float* cos, const float* sin,
    int backward, long long half, long long tokens, long long xb, long long xh, long long xt, long long xd,
    long long yb, long long yh, long long yt, long long yd, long long cb, long long ch, long long ct, long long cd,
    long long sb, long long sh, long long st, long long sd) {
  const long long j = threadIdx.x, t = blockIdx.x * (long long)blockDim.y + threadIdx.y;
  if (j >= half || t >= tokens) return;
  const long long h = blockIdx.y, b = blockIdx.z;
  const elem* xr = x + b * xb + h * xh + t * xt;
  const float* cr = cos + b * cb + h * ch + t * ct;
  const float* sr = sin + b * sb + h * sh + t * st;
  const float x1 = to_float(xr[j * xd]), x2 = to_float(xr[(j + half) * xd]);
  const float c1 = cr[j * cd], c2 = cr[(j + half) * cd], s1 = sr[j * sd], s2 = sr[(j + half) * sd];
  elem* yr = y + b * yb + h * yh + t * yt;
  yr[j * yd] = from_float(backward ? x1 * c1 + x2 * s2 : x1 * c1 - x2 * s1);
  yr[(j + half) * yd] = from_float(backward ? x2 * c2 - x1 * s1 : x2 * c2 + x1 * s2);
})";

/// The rotary row kernel over x (or a gradient) [B, H, T, D] with fp32 `cos` and `sin` broadcastable to it: [B, H,
/// T, D] in x's dtype, its dimensions in x's order in memory where x's heads lie inside its tokens (q and k as the
/// fused product leaves them), else contiguous.
inline torch::Tensor rotary_rows(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                 bool backward) {
  const auto batch = x.size(0), heads = x.size(1), tokens = x.size(2), dim = x.size(3);
  auto y = x.stride(1) < x.stride(2) ? torch::empty({batch, tokens, heads, dim}, x.options()).transpose(1, 2)
                                     : torch::empty({batch, heads, tokens, dim}, x.options());
  if (x.numel() == 0) return y;
#if HPCTRAIN_NVRTC_KERNELS
  static auto* kernels = new RowKernels("hpctrain_rotary", rotary_row_code);  // kept for the process
  const auto c = cos.expand(x.sizes()), s = sin.expand(x.sizes());
  void *x_data = x.data_ptr(), *y_data = y.data_ptr(), *c_data = c.data_ptr(), *s_data = s.data_ptr();
  int backward_flag = backward ? 1 : 0;
  std::int64_t half = dim / 2, token_count = tokens;
  std::vector<std::int64_t> strides;
  for (const torch::Tensor* t : std::initializer_list<const torch::Tensor*>{&x, &y, &c, &s}) {
    for (int d = 0; d < 4; ++d) strides.push_back(t->stride(d));
  }
  std::vector<void*> arguments{&x_data, &y_data, &c_data, &s_data, &backward_flag, &half, &token_count};
  for (auto& stride : strides) arguments.push_back(&stride);
  const auto rows_per_block = std::max<std::int64_t>(1, 256 / half);
  kernels->launch(x.device(), x.scalar_type(), "hpctrain_rotary_rows",
                  {static_cast<unsigned>((tokens + rows_per_block - 1) / rows_per_block), static_cast<unsigned>(heads),
                   static_cast<unsigned>(batch)},
                  {static_cast<unsigned>(half), static_cast<unsigned>(rows_per_block), 1}, std::move(arguments));
#else
  (void)cos, (void)sin, (void)backward;
  throw std::runtime_error("built without NVRTC's and CUDA's headers: no row kernels");
#endif
  return y;
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

/// Whether the rotary row kernel agrees with the composite path for `dtype` on `device`, both ways, over q's layout
/// and a contiguous x (a small probe, asked once per process and dtype).
inline bool rotary_row_kernels_agree(const torch::Device& device, c10::ScalarType dtype) {
  const auto probe = [&] {
    return kernels_agree([&] {
      const auto options = torch::TensorOptions().device(device);
      const auto angles = torch::arange(16, options).unsqueeze(-1) * torch::rand({64}, options);
      const auto cos = angles.cos(), sin = angles.sin();
      const auto q = torch::randn({2, 16, 4, 64}, options.dtype(dtype)).transpose(1, 2);
      for (const auto& x : {q, q.contiguous()}) {
        const auto backward = rotate_half_transposed(x * sin) + x * cos;
        if (!close_to_composite(rotary_rows(x, cos, sin, false), rotary_composite(x, cos, sin, true)) ||
            !close_to_composite(rotary_rows(x, cos, sin, true), backward.to(dtype))) {
          return false;
        }
      }
      return true;
    });
  };
  if (dtype == torch::kHalf) {
    static const bool fp16 = probe();
    return fp16;
  }
  static const bool bf16 = probe();
  return bf16;
}

/// Whether the rotary row kernel runs for x with these angles: row_kernels_possible, x [B, H, T, D] with an even D of
/// at most 2048 and B and H within a grid's limits, fp32 angles on x's device broadcastable to it, the probe passed.
inline bool rotary_rows_usable(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  if (!row_kernels_possible(x.device(), x.scalar_type(), runtime_kernels()) || x.dim() != 4 || x.size(3) % 2 != 0 ||
      x.size(3) > 2048 || x.size(0) > 65535 || x.size(1) > 65535) {
    return false;
  }
  for (const auto* angles : {&cos, &sin}) {
    if (angles->scalar_type() != torch::kFloat32 || angles->device() != x.device() ||
        !at::is_expandable_to(angles->sizes(), x.sizes())) {
      return false;
    }
  }
  return rotary_row_kernels_agree(x.device(), x.scalar_type());
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
    if (narrow_output && rotary_rows_usable(x, cos, sin)) {
      ctx->saved_data["rows"] = true;
      ctx->save_for_backward({cos, sin});
      return rotary_rows(x, cos, sin, false);
    }
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
    if (ctx->saved_data.count("rows") != 0) return {rotary_rows(g.to(dtype), saved[0], saved[1], true), {}, {}, {}};
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

/// RotaryAngles of `cos` and `sin`, for queries and keys on `device` (the pairs when the jiterator's kernels, not the
/// row kernel, may run there under autocast).
inline RotaryAngles rotary_angles(torch::Tensor cos, torch::Tensor sin, const torch::Device& device) {
  RotaryAngles angles{std::move(cos), std::move(sin), {}};
  const auto type = device.type();
  if (at::autocast::is_autocast_enabled(type)) {
    const auto narrow = at::autocast::get_autocast_dtype(type);
    const bool rows = angles.cos.scalar_type() == torch::kFloat32 && angles.sin.scalar_type() == torch::kFloat32 &&
                      detail::row_kernels_possible(device, narrow, runtime_kernels()) &&
                      detail::rotary_row_kernels_agree(device, narrow);
    if (!rows && detail::rotary_kernels(device, narrow))
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
