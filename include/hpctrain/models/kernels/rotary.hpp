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
// On CUDA under autocast each direction is one hand-written kernel compiled at run time
// (models/kernels/nvrtc_kernels.hpp), where the composite operations run four (a product, a negation, a concatenation,
// a multiply-add; five backward with the cast): each thread reads pairs (j, j + D/2) of x through its strides and the
// fp32 angles as they are, and writes the pairs of y rounded once: within one bf16 rounding of the composite path's
// result. On an H200 the kernel of one pair a thread moved 1.4 TB/s, 3.3x ATen's jiterator over broadcast halves, which
// it replaced (docs/gpu.md, 2026-11-27), and 40% of a copy's bandwidth: one memory access per 2-byte element. Where the
// rows allow it four pairs a thread read 8 bytes of x per access (not measured yet).
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

#include <hpctrain/models/kernels/nvrtc_kernels.hpp>
#include <hpctrain/models/kernels/runtime_kernels.hpp>

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

// The row kernels (models/kernels/nvrtc_kernels.hpp): a block of `half / V` x rows-per-block threads over one head of
// one batch row (blockIdx.y, blockIdx.z) and that many tokens; each thread reads V pairs (j, j + D/2) of x and of the
// fp32 angles through their strides and writes V pairs of y: no index arithmetic beyond the strides, the angles read
// as they are. V = 1 reads every element apart (any strides); V = 4 reads 4 consecutive elements of each half in one
// access (8 bytes of x, 16 of each angle), where every last dimension is contiguous and every row aligned to it: a
// quarter of the memory instructions per byte. Forward y₁ = x₁c₁ - x₂s₁, y₂ = x₂c₂ + x₁s₂; backward (x the
// gradient) dx₁ = g₁c₁ + g₂s₂, dx₂ = g₂c₂ - g₁s₁.
inline const std::string rotary_row_code = R"(
#define ROTARY_ARGUMENTS                                                                                          \
    const elem* x, elem* y, const float* cos, const float* sin, int backward, long long half, long long tokens,     \
    long long xb, long long xh, long long xt, long long xd, long long yb, long long yh, long long yt, long long yd, \
    long long cb, long long ch, long long ct, long long cd, long long sb, long long sh, long long st, long long sd
#define ROTARY_ROW_POINTERS(V)                                                                                     \
  const long long j = threadIdx.x * (long long)V, t = blockIdx.x * (long long)blockDim.y + threadIdx.y;           \
  if (j >= half || t >= tokens) return;                                                                            \
  const long long h = blockIdx.y, b = blockIdx.z;                                                                 \
  const elem* xr = x + b * xb + h * xh + t * xt;                                                                   \
  const float* cr = cos + b * cb + h * ch + t * ct;                                                                \
  const float* sr = sin + b * sb + h * sh + t * st;                                                                \
  elem* yr = y + b * yb + h * yh + t * yt;
extern "C" __global__ void hpctrain_rotary_rows(ROTARY_ARGUMENTS) {
  ROTARY_ROW_POINTERS(1)
  const float x1 = to_float(xr[j * xd]), x2 = to_float(xr[(j + half) * xd]);
  const float c1 = cr[j * cd], c2 = cr[(j + half) * cd], s1 = sr[j * sd], s2 = sr[(j + half) * sd];
  yr[j * yd] = from_float(backward ? x1 * c1 + x2 * s2 : x1 * c1 - x2 * s1);
  yr[(j + half) * yd] = from_float(backward ? x2 * c2 - x1 * s1 : x2 * c2 + x1 * s2);
}
extern "C" __global__ void hpctrain_rotary_rows_4(ROTARY_ARGUMENTS) {
  ROTARY_ROW_POINTERS(4)
  const Pack<4> a = *reinterpret_cast<const Pack<4>*>(xr + j), z = *reinterpret_cast<const Pack<4>*>(xr + j + half);
  const float4 c1 = *reinterpret_cast<const float4*>(cr + j), c2 = *reinterpret_cast<const float4*>(cr + j + half);
  const float4 s1 = *reinterpret_cast<const float4*>(sr + j), s2 = *reinterpret_cast<const float4*>(sr + j + half);
  const float cos1[4] = {c1.x, c1.y, c1.z, c1.w}, cos2[4] = {c2.x, c2.y, c2.z, c2.w};
  const float sin1[4] = {s1.x, s1.y, s1.z, s1.w}, sin2[4] = {s2.x, s2.y, s2.z, s2.w};
  Pack<4> first, second;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float x1 = to_float(a.v[k]), x2 = to_float(z.v[k]);
    first.v[k] = from_float(backward ? x1 * cos1[k] + x2 * sin2[k] : x1 * cos1[k] - x2 * sin1[k]);
    second.v[k] = from_float(backward ? x2 * cos2[k] - x1 * sin1[k] : x2 * cos2[k] + x1 * sin2[k]);
  }
  *reinterpret_cast<Pack<4>*>(yr + j) = first;
  *reinterpret_cast<Pack<4>*>(yr + j + half) = second;
})";

/// Which rotary row kernel runs: 4 pairs a thread where the operands allow it and its probe passed, else 1
/// (`fastest`); or one of them, for the probes.
enum class RotaryPairs { fastest, one, four };

#if HPCTRAIN_NVRTC_KERNELS
inline RowKernels& rotary_row_kernels() {
  static auto* kernels = new RowKernels("hpctrain_rotary", rotary_row_code);  // kept for the process
  return *kernels;
}
#endif

inline bool rotary_four_pairs_agree(const torch::Device& device, c10::ScalarType dtype);  // below

/// The rotary row kernel over x (or a gradient) [B, H, T, D] with fp32 `cos` and `sin` broadcastable to it: [B, H,
/// T, D] in x's dtype, its dimensions in x's order in memory where x's heads lie inside its tokens (q and k as the
/// fused product leaves them), else contiguous. `pairs`: the kernel (RotaryPairs; the probes name one).
inline torch::Tensor rotary_rows(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                 bool backward, RotaryPairs pairs = RotaryPairs::fastest) {
  const auto batch = x.size(0), heads = x.size(1), tokens = x.size(2), dim = x.size(3);
  auto y = x.stride(1) < x.stride(2) ? torch::empty({batch, tokens, heads, dim}, x.options()).transpose(1, 2)
                                     : torch::empty({batch, heads, tokens, dim}, x.options());
  if (x.numel() == 0) return y;
#if HPCTRAIN_NVRTC_KERNELS
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
  // Four pairs a thread: every last dimension contiguous, every row and half 4 elements aligned (8 bytes of x and
  // y, 16 of the angles).
  bool four = pairs != RotaryPairs::one && half % 4 == 0;
  for (int operand = 0; operand < 4; ++operand) {
    four = four && strides[4 * operand + 3] == 1 && strides[4 * operand] % 4 == 0 &&
           strides[4 * operand + 1] % 4 == 0 && strides[4 * operand + 2] % 4 == 0;
  }
  four = four && reinterpret_cast<std::uintptr_t>(x_data) % 8 == 0 &&
         reinterpret_cast<std::uintptr_t>(y_data) % 8 == 0 && reinterpret_cast<std::uintptr_t>(c_data) % 16 == 0 &&
         reinterpret_cast<std::uintptr_t>(s_data) % 16 == 0;
  if (pairs == RotaryPairs::four && !four) throw std::runtime_error("rotary_rows: four pairs a thread do not fit x");
  if (pairs == RotaryPairs::fastest) four = four && rotary_four_pairs_agree(x.device(), x.scalar_type());
  const std::int64_t vector = four ? 4 : 1, threads = half / vector;
  const auto rows_per_block = std::max<std::int64_t>(1, 256 / threads);
  rotary_row_kernels().launch(x.device(), x.scalar_type(), four ? "hpctrain_rotary_rows_4" : "hpctrain_rotary_rows",
                              {static_cast<unsigned>((tokens + rows_per_block - 1) / rows_per_block),
                               static_cast<unsigned>(heads), static_cast<unsigned>(batch)},
                              {static_cast<unsigned>(threads), static_cast<unsigned>(rows_per_block), 1},
                              std::move(arguments));
#else
  (void)cos, (void)sin, (void)backward, (void)pairs;
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

/// Whether the rotary row kernel of `pairs` agrees with the composite path for `dtype` on `device`, both ways, over
/// q's layout and a contiguous x (a small probe).
inline bool rotary_pairs_agree(const torch::Device& device, c10::ScalarType dtype, RotaryPairs pairs) {
  const auto options = torch::TensorOptions().device(device);
  const auto angles = torch::arange(16, options).unsqueeze(-1) * torch::rand({64}, options);
  const auto cos = angles.cos(), sin = angles.sin();
  const auto q = torch::randn({2, 16, 4, 64}, options.dtype(dtype)).transpose(1, 2);
  for (const auto& x : {q, q.contiguous()}) {
    const auto backward = rotate_half_transposed(x * sin) + x * cos;
    if (!close_to_composite(rotary_rows(x, cos, sin, false, pairs), rotary_composite(x, cos, sin, true)) ||
        !close_to_composite(rotary_rows(x, cos, sin, true, pairs), backward.to(dtype))) {
      return false;
    }
  }
  return true;
}

/// Whether the rotary row kernel (a pair a thread) agrees with the composite path for `dtype` on `device`: asked
/// once per process and dtype.
inline bool rotary_row_kernels_agree(const torch::Device& device, c10::ScalarType dtype) {
  return kernels_agree(dtype, [&] { return rotary_pairs_agree(device, dtype, RotaryPairs::one); });
}

/// Whether the kernel of four pairs a thread agrees too: asked once per process and dtype, apart, so that a kernel
/// that fails leaves the other.
inline bool rotary_four_pairs_agree(const torch::Device& device, c10::ScalarType dtype) {
  return kernels_agree(dtype, [&] { return rotary_pairs_agree(device, dtype, RotaryPairs::four); });
}

/// Whether the rotary row kernel runs for x with these angles: row_kernels_possible, x [B, H, T, D] with an even D of
/// at most 2048 and B and H within a grid's limits, fp32 angles on x's device broadcastable to it, the probe passed.
inline bool rotary_rows_usable(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  if (!row_kernels_possible(x.device(), x.scalar_type()) || x.dim() != 4 || x.size(3) % 2 != 0 || x.size(3) > 2048 ||
      x.size(0) > 65535 || x.size(1) > 65535) {
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

struct Rotary : torch::autograd::Function<Rotary> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin) {
    // Under autocast a bf16 x times fp32 angles would make an fp32 result that attention casts back to bf16 (a
    // kernel each way, and one more for the gradient): written in x's dtype here instead, by the same kernel that
    // computes it in fp32, it is the same bf16 tensor attention would have made. x's layout is kept.
    const auto device = x.device().type();
    const bool narrow_output =
        at::autocast::is_autocast_enabled(device) && x.scalar_type() == at::autocast::get_autocast_dtype(device);
    ctx->saved_data["dtype"] = x.scalar_type();
    ctx->save_for_backward({cos, sin});
    if (narrow_output && rotary_rows_usable(x, cos, sin)) {
      ctx->saved_data["rows"] = true;
      return rotary_rows(x, cos, sin, false);
    }
    return rotary_composite(x, cos, sin, narrow_output);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& g = grads[0];
    const auto dtype = ctx->saved_data["dtype"].toScalarType();
    if (ctx->saved_data.count("rows") != 0) return {rotary_rows(g.to(dtype), saved[0], saved[1], true), {}, {}};
    auto dx = torch::addcmul(rotate_half_transposed(g * saved[1]), g, saved[0]);
    return {dx.to(dtype), {}, {}};
  }
};
}  // namespace detail

/// The rotary angles of one forward: cos and sin ([T, D] or [B, 1, T, D]), shared by every layer's queries and keys.
struct RotaryAngles {
  torch::Tensor cos, sin;
};

/// Rotates `x` [B, H, T, D] by `angles` (cos and sin [T, D] or broadcastable to x; constants: they get no gradient).
inline torch::Tensor apply_rotary(const torch::Tensor& x, const RotaryAngles& angles) {
  return detail::Rotary::apply(x, angles.cos, angles.sin);
}

/// Rotates `x` [B, H, T, D] by the angles whose cos and sin are given ([T, D] or broadcastable to x; constants:
/// they get no gradient).
inline torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  return detail::Rotary::apply(x, cos, sin);
}

}  // namespace hpctrain::models
