#pragma once
// A projection's matrix product under autocast with its gradients written in the parameters' dtype by the products
// themselves (Megatron's gradient_accumulation_fusion does the same for the weight gradient).
//
// Under autocast an fp32 weight and an fp32 input are cast to bf16 for the product, and autograd differentiates the
// casts: backward computes the weight gradient gᵀ·x and the input gradient g·W in bf16, then a cast kernel each
// turns them into fp32 (the weight's for its fp32 .grad, the input's for the fp32 residual stream). Those casts
// read and write every weight gradient and every normalised hidden state's gradient once more per step, in the
// slowest copy kernel of the Llama step's trace (ATen's dtype-converting copy: 10.9 ms of 154 on an H200,
// docs/gpu.md); and the products' results are rounded to bf16 on the way.
//
// Here the casts happen inside one autograd node, MixedPrecisionLinear, whose backward asks the product for its
// result in the dtype the gradient must have: on CUDA one cuBLAS product with bf16 operands and an fp32 result
// (at::mm's out_dtype), elsewhere the same sums as an fp32 product of the bf16 values (exact: a bf16 value is an
// fp32 value). No cast kernel runs for the weights' or the inputs' gradients, and neither is rounded to bf16:
// what an fp32 accumulator summed is what the optimizer and the residual stream receive. The forward is
// autocast's, bit for bit (the same casts, the same product); projections fused into one product
// (models/kernels/fused_projections.hpp) cast their weights straight into one buffer (no concatenation kernel) and get
// their gradients as row ranges of one fp32 product.
//
// A causal language model's head (models::head_projection) goes through the same node with its logits written in
// fp32 by the product: the loss widens them anyway, so autocast's bf16 logits and the loss's cast, a pass over
// tokens × vocabulary, are gone (and the logits are not rounded to bf16 first).
//
// Chosen per device: by default (WideProducts::where_fused) wherever autocast casts fp32 parameters on a device whose
// product writes a narrow product's wide result itself (CUDA). Not on the CPU: there the wide result needs the operands
// widened first, an fp32 product that forgoes the CPU's bf16 kernels (AVX512-BF16, AMX): GPT-2's bf16 step ran at 0.46×
// the tokens/s of PyTorch under torchrun on a 2-core AMD EPYC with AVX512-BF16, slower than its own fp32 step, with 54%
// of its time in fp32 matrix products (the head's 3.2× slower than the bf16 product). set_fp32_product_gradients(
// WideProducts::everywhere) runs it on the CPU too (how the CPU tests check its arithmetic), ::nowhere brings back
// autograd's casts everywhere (bf16-rounded gradients, as transformers' eager model computes them).
#include <cstdint>
#include <vector>

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/torch.h>

#include <hpctrain/models/kernels/float8_projections.hpp>
#include <hpctrain/models/kernels/stacked_casts.hpp>
#include <hpctrain/models/recompute/selective_recompute.hpp>

namespace hpctrain::models {

/// Where projections under autocast compute their gradients (and a head its logits) in the parameters' dtype in the
/// products themselves.
enum class WideProducts {
  where_fused,  ///< on a device whose product writes a narrow product's wide result (CUDA): the default
  everywhere,   ///< the CPU too, whose products then widen their bf16 operands first (exact, an fp32 product)
  nowhere,      ///< autograd's casts: bf16-rounded gradients and logits, as transformers' eager model
};

namespace detail {
inline WideProducts& fp32_product_gradients_switch() {
  static WideProducts where = WideProducts::where_fused;
  return where;
}
}  // namespace detail

/// Where projections under autocast compute their gradients in the parameters' dtype in the products (process-wide;
/// default WideProducts::where_fused).
inline void set_fp32_product_gradients(WideProducts where) { detail::fp32_product_gradients_switch() = where; }
inline WideProducts fp32_product_gradients() { return detail::fp32_product_gradients_switch(); }

namespace detail {

/// Whether this CUDA build computes a bf16 product into an fp32 result (at::mm's out_dtype, PyTorch 2.8 on):
/// asked once, on a 2x2 product, so that a build without it falls back to the fp32 product instead of failing.
inline bool cuda_has_wide_product(const torch::Device& device) {
  static const bool has = [&] {
    try {
      const auto one = torch::ones({2, 2}, torch::TensorOptions().dtype(torch::kBFloat16).device(device));
      return at::mm(one, one, torch::kFloat32).scalar_type() == torch::kFloat32;
    } catch (const std::exception&) {
      return false;
    }
  }();
  return has;
}

/// Whether projections on `device` compute their gradients in the parameters' dtype in the products, as the switch
/// says (set_fp32_product_gradients).
inline bool fp32_product_gradients_on(const torch::Device& device) {
  switch (fp32_product_gradients()) {
    case WideProducts::everywhere: return true;
    case WideProducts::nowhere: return false;
    case WideProducts::where_fused: return device.is_cuda() && cuda_has_wide_product(device);
  }
  return false;
}

/// a · b (both in one narrow dtype) with its result in `dtype`, summed in fp32 and never rounded to the narrow
/// dtype: cuBLAS writes it so on CUDA; elsewhere the operands are widened first, which is exact.
inline torch::Tensor product_into(const torch::Tensor& a, const torch::Tensor& b, c10::ScalarType dtype) {
  // Autocast must not narrow the operands again (this runs inside autograd nodes' forwards, under autocast).
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  if (a.scalar_type() == dtype) return at::mm(a, b);
  if (a.is_cuda() && cuda_has_wide_product(a.device())) return at::mm(a, b, dtype);
  return at::mm(a.to(dtype), b.to(dtype));
}

/// y = x·[W₁; W₂; …]ᵀ + [b₁; b₂; …] with x and the weights cast to `dtype` (autocast's), as one product; backward
/// writes the input's and the parameters' gradients in their own dtypes straight from the products
/// (product_into). Slots of the node's inputs: x, then the weights, then the biases (none, or one per weight).
/// In a selective block's recomputation the product's output recorded by the forward is `recorded`: returned as
/// it is, the product not computed again (models/recompute/selective_recompute.hpp). `wide_output` (no biases): y
/// itself in fp32 (or the parameters' dtype, if wider), straight from the product (a head's logits, which the loss
/// widens anyway).
struct MixedPrecisionLinear : torch::autograd::Function<MixedPrecisionLinear> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, at::TensorList weights,
                               at::TensorList biases, c10::ScalarType dtype, RecordedOutput recorded,
                               bool wide_output) {
    const auto narrow_x = x.to(dtype);
    const auto weight = cast_stacked(weights, dtype);
    const auto bias = biases.empty() ? torch::Tensor() : cast_stacked(biases, dtype);
    SavedProjection::keep(ctx, x, narrow_x, weight, weights, biases, dtype);
    if (recorded.tensor.defined()) return std::move(recorded.tensor);
    if (!wide_output) return at::linear(narrow_x, weight, bias);
    TORCH_CHECK(biases.empty(), "MixedPrecisionLinear: a wide output takes no bias");
    auto shape = x.sizes().vec();
    shape.back() = weight.size(0);
    // In fp32 from a frozen head held in bf16 too (LoRA's, hold_frozen_in_compute_dtype), as from an fp32 one.
    const auto wide = c10::promoteTypes(weights[0].scalar_type(), torch::kFloat32);
    return product_into(narrow_x.reshape({-1, x.size(-1)}), weight.t(), wide).view(shape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = SavedProjection::of(ctx);
    // + the dtype, the recorded output and wide_output: no gradient
    torch::autograd::variable_list out(1 + saved.rows.size() + saved.biases + 3);
    if (!grads[0].defined()) return out;
    // A wide output's gradient is narrowed for the products, as autograd's cast of the output would have.
    const auto g = grads[0].reshape({-1, grads[0].size(-1)}).to(saved.narrow);
    if (ctx->needs_input_grad(0)) out[0] = product_into(g, saved.weight, saved.x_dtype).view(saved.x_shape);
    stacked_parameter_gradients(ctx, out, saved.rows, saved.biases, g, saved.parameter_dtype, [&] {
      return product_into(g.t(), saved.narrow_x.reshape({-1, saved.narrow_x.size(-1)}), saved.parameter_dtype);
    });
    return out;
  }
};

/// Whether `x` · `weights` (+ `biases`) runs as a MixedPrecisionLinear: the switch is on for x's device, autocast is
/// on for it, the parameters are of one floating dtype, and a gradient is wanted; parameters that autocast casts (fp32
/// ones), or frozen ones held in autocast's dtype already (LoRA's base sharded in bf16), for which the node keeps
/// no input (autograd's product would keep it for a weight gradient nobody wants).
inline bool mixed_precision_product(const torch::Tensor& x, at::TensorList weights, at::TensorList biases) {
  const auto device = x.device().type();
  if (!fp32_product_gradients_on(x.device()) || !at::autocast::is_autocast_enabled(device) ||
      !torch::GradMode::is_enabled())
    return false;
  const auto narrow = at::autocast::get_autocast_dtype(device);
  const auto dtype = weights[0].scalar_type();
  if (!at::isFloatingType(dtype) || !at::isFloatingType(x.scalar_type())) return false;
  bool parameter_gradient = false;
  for (const auto& list : {weights, biases})
    for (const auto& t : list) {
      if (t.scalar_type() != dtype) return false;
      parameter_gradient = parameter_gradient || t.requires_grad();
    }
  if (dtype == narrow) return !parameter_gradient && x.requires_grad();
  return parameter_gradient || x.requires_grad();
}

}  // namespace detail

/// x · [W₁; W₂; …]ᵀ + [b₁; b₂; …] (`biases` empty, or one per weight) as one matrix product: a Float8Linear under
/// set_float8_projections (detail::float8_projection), else a MixedPrecisionLinear where
/// detail::mixed_precision_product allows, else autocast's casts of each and at::linear. `recorded`, in a
/// selective block's recomputation, is the output its forward recorded for this product (replayed, not computed).
inline torch::Tensor projection(const torch::Tensor& x, at::TensorList weights, at::TensorList biases,
                                torch::Tensor recorded = {}) {
  const auto device = x.device().type();
  if (recorded.defined()) {
    std::int64_t rows = 0;
    for (const auto& w : weights) rows += w.size(0);
    detail::check_replayed_shape(x, rows, recorded);
  }
  if (detail::float8_projection(x, weights, biases))  // --float8: models/kernels/float8_projections.hpp
    return detail::Float8Linear::apply(x, weights, biases, at::autocast::get_autocast_dtype(device),
                                       detail::RecordedOutput{std::move(recorded)});
  if (detail::mixed_precision_product(x, weights, biases))
    return detail::MixedPrecisionLinear::apply(x, weights, biases, at::autocast::get_autocast_dtype(device),
                                               detail::RecordedOutput{std::move(recorded)}, false);
  torch::Tensor weight, bias;
  if (weights.size() == 1) {
    weight = weights[0];
    if (!biases.empty()) bias = biases[0];
  } else {  // the casts autocast would make, concatenated (a cached cast would stay alive beside the concatenation)
    const auto cast = [device](const torch::Tensor& t) {
      return at::autocast::is_autocast_enabled(device) ? t.to(at::autocast::get_autocast_dtype(device)) : t;
    };
    std::vector<torch::Tensor> w, b;
    for (const auto& t : weights) w.push_back(cast(t));
    for (const auto& t : biases) b.push_back(cast(t));
    weight = torch::cat(w);
    if (!b.empty()) bias = torch::cat(b);
  }
  if (recorded.defined()) return detail::replayed_linear(x, weight, bias, {}, {}, {}, 0.0, std::move(recorded));
  return torch::linear(x, weight, bias);
}

/// hidden · weightᵀ for a model's head (weight [vocabulary, hidden]): under autocast with an fp32 weight the logits
/// come in fp32 straight from the product, where autocast's product would round them to bf16 and the loss's cast
/// (lm/loss.hpp) would widen them again in a pass of its own over tokens × vocabulary; the weight's gradient in
/// fp32 as the projections'. Else at::linear.
inline torch::Tensor head_projection(const torch::Tensor& hidden, const torch::Tensor& weight) {
  if (!detail::mixed_precision_product(hidden, weight, {})) return torch::linear(hidden, weight);
  return detail::MixedPrecisionLinear::apply(hidden, at::TensorList(weight), at::TensorList(),
                                             at::autocast::get_autocast_dtype(hidden.device().type()),
                                             detail::RecordedOutput{}, true);
}

}  // namespace hpctrain::models
