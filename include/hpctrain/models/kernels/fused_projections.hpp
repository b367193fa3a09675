#pragma once
// Projections of one input as one matrix product: a Llama block's q, k and v read the same normalised hidden
// state, and so do its gate and up projections. Called one by one (transformers' eager LlamaForCausalLM does),
// each call casts that input to bf16 under autocast again, each keeps its own cast copy for backward, and backward
// computes three input gradients in bf16, casts each to fp32 and adds them. Fused (Megatron's linear_qkv, the
// gate-up product of vLLM and Liger), the input is cast once and kept once, the weights are cast into one buffer
// (models::projection) and backward computes one input gradient, summed over all three products in the matrix
// product's fp32 accumulator. The small k and v products (256 columns at
// TinyLlama's shape) join the large one instead of running as kernels of their own.
//
// The parameters stay as they are (q_proj.weight, k_proj.weight, ...: Hugging Face's names, the optimizer's and
// the checkpoints' tensors); only the forward changes. By default only under autocast, where the weights' casts
// are made anyway; without it the concatenation would be a copy of the fp32 weights kept for backward.
#include <cstdint>
#include <initializer_list>
#include <vector>

#include <torch/torch.h>

#include <hpctrain/models/kernels/fused_projections_mode.hpp>
#include <hpctrain/models/lora/lora_layer.hpp>

namespace hpctrain::models {

namespace detail {
/// Whether `layers` of input `x` run as one product: the switch allows it, no layer carries a LoRA adapter (an
/// adapter is its layer's own product, models::linear), none is a frozen weight held in a reduced precision already
/// (LoRA's base under ZeRO-3 in bf16: the joined weights would be a copy kept for backward, where apart each product
/// keeps a view of its own weight and no cast is made), and all have a bias or none has.
inline bool fuse_projections(const std::vector<torch::nn::Linear*>& layers, const torch::Tensor& x) {
  const auto mode = fused_projections();
  if (mode == FusedProjections::never || layers.size() < 2) return false;
  if (mode == FusedProjections::under_autocast && !at::autocast::is_autocast_enabled(x.device().type())) return false;
  const bool bias = (*layers.front())->bias.defined();
  for (auto* layer : layers)
    if (!(*layer)->named_children().is_empty() || (*layer)->bias.defined() != bias) return false;
  for (auto* layer : layers)
    if (!(*layer)->weight.requires_grad() && (*layer)->weight.scalar_type() != torch::kFloat32) return false;
  return true;
}

}  // namespace detail

/// What linears() computed: `joined`, the one product's output with the layers' outputs side by side along the last
/// dimension, when they ran as one (detail::fuse_projections), else undefined and `parts` holds each layer's output.
struct ProjectionOutputs {
  torch::Tensor joined;
  std::vector<torch::Tensor> parts;
};

/// The outputs of `layers` of input `x`, as one matrix product when detail::fuse_projections allows (then only
/// `joined`, for a function that takes the outputs together, models::swiglu), else one models::linear each.
inline ProjectionOutputs joined_linears(std::initializer_list<torch::nn::Linear*> list, const torch::Tensor& x) {
  const std::vector<torch::nn::Linear*> layers(list);
  ProjectionOutputs outputs;
  if (!detail::fuse_projections(layers, x)) {
    for (auto* layer : layers) outputs.parts.push_back(linear(*layer, x));
    return outputs;
  }
  std::vector<torch::Tensor> weights, biases;
  for (auto* layer : layers) {
    weights.push_back((*layer)->weight);
    if ((*layer)->bias.defined()) biases.push_back((*layer)->bias);
  }
  using detail::MatrixProducts;
  if (auto* replaying = MatrixProducts::active(MatrixProducts::Phase::replay)) {
    outputs.joined = projection(x, weights, biases, replaying->replay_next().output);
  } else {
    outputs.joined = projection(x, weights, biases);
    if (auto* recording = MatrixProducts::active(MatrixProducts::Phase::record)) recording->record(outputs.joined, {});
  }
  return outputs;
}

/// `{linear(*layers[0], x), linear(*layers[1], x), ...}` (models::linear, LoRA included), as one matrix product
/// when detail::fuse_projections allows: the outputs are then views of one tensor, split along the last dimension.
inline std::vector<torch::Tensor> linears(std::initializer_list<torch::nn::Linear*> list, const torch::Tensor& x) {
  auto outputs = joined_linears(list, x);
  if (!outputs.joined.defined()) return std::move(outputs.parts);
  std::vector<std::int64_t> widths;
  for (auto* layer : list) widths.push_back((*layer)->weight.size(0));
  // split_with_sizes, not narrow: its backward is one concatenation of the parts' gradients, where narrow's
  // writes each part into a zero-filled tensor of the whole width and adds them.
  return outputs.joined.split_with_sizes(widths, -1);
}

}  // namespace hpctrain::models
