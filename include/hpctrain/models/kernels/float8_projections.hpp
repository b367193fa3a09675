#pragma once
// The projections of a full fine-tuning in float8 (`--float8`, Training::float8), torchao's "rowwise" recipe
// (torchao.float8, Float8LinearRecipeName.ROWWISE, which torchtitan's float8 converter applies): each of a linear
// layer's three products — the output y = x·Wᵀ, the input's gradient g·W and the weight's gradient gᵀ·x — takes both
// operands in float8 e4m3 (4 exponent bits, 3 mantissa bits, largest finite value 448), each row of the left operand
// and each column of the right one with a scale of its own along that product's reduction dimension: the scale makes
// the row's largest magnitude (amax) land at or just below 448, rounded down to a power of two
// (round_scales_to_power_of_2) so that scaling and unscaling are exact and only the cast to e4m3 rounds. The head, the
// embedding and the norms stay in bf16 under autocast (torchtitan leaves the output projection out of the
// conversion): only models::projection, the blocks' products, comes here.
//
// On CUDA with compute capability 8.9 or above (Ada, Hopper) the product is at::_scaled_mm: float8 operands, fp32
// dequantisation scales per row and column, summed in fp32 and written in bf16 (its rowwise kernels write no other
// dtype; torchao's gradients are bf16 too), the gradients then widened to the parameters' and the residual stream's
// fp32 inside the node (no autograd cast node). Elsewhere — and under Float8Projections::emulated — it is emulated as
// torchao's emulate=True: the same quantisation (float8_rowwise, shared), the operands dequantised and multiplied in
// fp32, the result rounded to bf16 as the kernel's. The CPU's _scaled_mm takes only one scale a tensor (torch 2.11),
// so it is not used there.
//
// What backward keeps is torchao's too: the bf16 casts of x and W (each quantised again along the reduction
// dimension of the gradient that reads it), not their float8 forms: the scales run along the other dimension there.
#include <cstdint>
#include <limits>
#include <vector>

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/torch.h>

#include <hpctrain/models/kernels/stacked_casts.hpp>
#include <hpctrain/models/recompute/selective_recompute.hpp>

namespace hpctrain::models {

/// How the blocks' projections under bf16 autocast compute their products.
enum class Float8Projections {
  off,       ///< bf16 (models/kernels/mixed_precision_products.hpp): the default
  rowwise,   ///< float8 with rowwise scales: at::_scaled_mm on CUDA sm_89 and above, emulated elsewhere
  emulated,  ///< the same quantisation, the products in fp32 on any device (torchao's emulate=True)
};

namespace detail {
inline Float8Projections& float8_projections_switch() {
  static Float8Projections mode = Float8Projections::off;
  return mode;
}
}  // namespace detail

/// How the blocks' projections compute their products (process-wide; default Float8Projections::off). The Trainer
/// sets it for a run under Training::float8.
inline void set_float8_projections(Float8Projections mode) { detail::float8_projections_switch() = mode; }
inline Float8Projections float8_projections() { return detail::float8_projections_switch(); }

/// e4m3's largest finite value (torch.finfo(torch.float8_e4m3fn).max): the scale puts a row's amax there.
inline constexpr double float8_e4m3_max = 448.0;
/// The smallest amax a scale is computed from (torchao's EPS): an all-zero row gets a large, finite scale.
inline constexpr double float8_amax_floor = 1e-12;

/// A tensor in float8 e4m3 with one fp32 scale per slice along a dimension: `data` = saturate(t · scale), `scale`
/// with t's dimensions and 1 along the reduced one. t ≈ data / scale.
struct Float8Rowwise {
  torch::Tensor data;
  torch::Tensor scale;
};

/// torchao's rowwise scales of `t` along `dim`: 448 / max(amax, 1e-12) computed in fp64 (amax_to_scale), then in fp32
/// rounded down to a power of two (_round_scale_down_to_power_of_2).
inline torch::Tensor float8_scales(const torch::Tensor& t, std::int64_t dim) {
  // The infinity norm is the largest magnitude in one pass over t (abs then amax would write |t| first); exact.
  const auto amax = at::linalg_vector_norm(t, std::numeric_limits<double>::infinity(), at::IntArrayRef{dim},
                                           /*keepdim=*/true)
                        .to(torch::kFloat64);
  const auto scale = (float8_e4m3_max / amax.clamp_min(float8_amax_floor)).to(torch::kFloat32);
  return torch::exp2(torch::floor(torch::log2(scale)));
}

/// `t` (fp32) in e4m3, clamped to ±448 first and rounded to the nearest e4m3 value (torchao's to_fp8_saturated): a
/// plain cast turns what lies beyond 448 into NaN.
inline torch::Tensor to_float8_saturated(const torch::Tensor& t) {
  return t.clamp(-float8_e4m3_max, float8_e4m3_max).to(torch::kFloat8_e4m3fn);
}

/// `t` quantised to float8 e4m3 with one scale per slice along `dim` (float8_scales): scaled in fp32, then
/// to_float8_saturated. The CUDA product and the emulated one both quantise here.
inline Float8Rowwise float8_rowwise(const torch::Tensor& t, std::int64_t dim) {
  auto scale = float8_scales(t, dim);
  auto data = to_float8_saturated(t * scale);  // bf16 times the fp32 scale is fp32: exact, one pass
  return {std::move(data), std::move(scale)};
}

/// The fp32 values `quantised` stands for: data / scale, exact (the scale is a power of two).
inline torch::Tensor dequantised(const Float8Rowwise& quantised) {
  return quantised.data.to(torch::kFloat32) * quantised.scale.reciprocal();
}

/// Whether `device` multiplies float8 operands with rowwise scales (at::_scaled_mm): CUDA with compute capability 8.9
/// or above, in a LibTorch whose kernels have them. Asked once, of one 16 x 16 product (as
/// detail::cuda_has_wide_product asks of its own), so that no CUDA header is needed here and a build or a GPU without
/// the kernels says no instead of failing in a step.
inline bool float8_products_on(const torch::Device& device) {
  if (!device.is_cuda()) return false;  // the CPU's _scaled_mm takes one scale a tensor only (torch 2.11)
  static const bool has = [&] {
    try {
      const auto options = torch::TensorOptions().dtype(torch::kFloat32).device(device);
      const auto a = torch::ones({16, 16}, options).to(torch::kFloat8_e4m3fn);
      const auto one = torch::ones({16, 1}, options);
      return at::_scaled_mm(a, a.t(), one, one.t(), std::nullopt, std::nullopt, torch::kBFloat16).defined();
    } catch (const std::exception&) {
      return false;
    }
  }();
  return has;
}

namespace detail {

/// a · b (a: M×K, b: K×N, any dtype) with a's rows and b's columns quantised along K (float8_rowwise), summed in fp32
/// and written in bf16 (the only output _scaled_mm's rowwise kernels write), then in `dtype`. at::_scaled_mm where
/// Float8Projections::rowwise finds the device able and the dimensions multiples of 16 (its kernels' alignment); else
/// the emulated product of the dequantised operands in fp32, rounded to bf16 the same way. `fast_accumulation`:
/// torchao's use_fast_accum, on for the output's product, off for the gradients'.
inline torch::Tensor float8_product(const torch::Tensor& a, const torch::Tensor& b, c10::ScalarType dtype,
                                    bool fast_accumulation) {
  // Autocast must not narrow the emulated product (this runs inside an autograd node's forward, under autocast).
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const auto left = float8_rowwise(a, 1);   // scales (M, 1)
  const auto right = float8_rowwise(b, 0);  // scales (1, N)
  const bool aligned = a.size(0) % 16 == 0 && a.size(1) % 16 == 0 && b.size(1) % 16 == 0;
  torch::Tensor product;
  if (float8_projections() == Float8Projections::rowwise && aligned && float8_products_on(a.device()))
    // _scaled_mm: the left operand row-major, the right one column-major, and the scales that undo the quantisation
    product = at::_scaled_mm(left.data.contiguous(), right.data.t().contiguous().t(), left.scale.reciprocal(),
                             right.scale.reciprocal(), std::nullopt, std::nullopt, torch::kBFloat16, fast_accumulation);
  else product = at::mm(dequantised(left), dequantised(right)).to(torch::kBFloat16);
  return product.to(dtype);
}

/// y = x·[W₁; W₂; …]ᵀ + [b₁; b₂; …] with each product in float8 (float8_product): the output in `dtype` (autocast's
/// bf16), the input's gradient in x's dtype and the parameters' in theirs (bf16 products, widened in the node). Slots:
/// x, the weights, the biases (none, or one per weight); `recorded`, in a selective block's recomputation, the output
/// the forward recorded (returned as it is: models/recompute/selective_recompute.hpp).
struct Float8Linear : torch::autograd::Function<Float8Linear> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, at::TensorList weights,
                               at::TensorList biases, c10::ScalarType dtype, RecordedOutput recorded) {
    const auto narrow_x = x.to(dtype);
    const auto weight = cast_stacked(weights, dtype);
    SavedProjection::keep(ctx, x, narrow_x, weight, weights, biases, dtype);
    if (recorded.tensor.defined()) return std::move(recorded.tensor);
    auto shape = x.sizes().vec();
    shape.back() = weight.size(0);
    auto y = float8_product(narrow_x.reshape({-1, x.size(-1)}), weight.t(), dtype, /*fast_accumulation=*/true);
    if (!biases.empty()) y = y + cast_stacked(biases, dtype);
    return y.view(shape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = SavedProjection::of(ctx);
    torch::autograd::variable_list out(1 + saved.rows.size() + saved.biases + 2);  // + the dtype, the recorded output
    if (!grads[0].defined()) return out;
    const auto g = grads[0].reshape({-1, grads[0].size(-1)}).to(saved.narrow);
    if (ctx->needs_input_grad(0)) out[0] = float8_product(g, saved.weight, saved.x_dtype, false).view(saved.x_shape);
    stacked_parameter_gradients(ctx, out, saved.rows, saved.biases, g, saved.parameter_dtype, [&] {
      return float8_product(g.t(), saved.narrow_x.reshape({-1, saved.narrow_x.size(-1)}), saved.parameter_dtype, false);
    });
    return out;
  }
};

/// Whether `x` · `weights` (+ `biases`) runs as a Float8Linear: the switch is on, bf16 autocast is on for x's device,
/// and the weights are trained parameters of one floating dtype (a frozen base, LoRA's, keeps its bf16 product).
inline bool float8_projection(const torch::Tensor& x, at::TensorList weights, at::TensorList biases) {
  const auto device = x.device().type();
  if (float8_projections() == Float8Projections::off || !at::autocast::is_autocast_enabled(device) ||
      at::autocast::get_autocast_dtype(device) != torch::kBFloat16 || !at::isFloatingType(x.scalar_type()))
    return false;
  const auto dtype = weights[0].scalar_type();
  if (!at::isFloatingType(dtype)) return false;
  for (const auto& w : weights)
    if (w.scalar_type() != dtype || !w.requires_grad()) return false;
  for (const auto& b : biases)
    if (b.scalar_type() != dtype) return false;
  return true;
}

}  // namespace detail

}  // namespace hpctrain::models
