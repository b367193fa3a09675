#pragma once
// A linear layer's LoRA adapter at run time (models/lora/lora.hpp adds, saves, loads and merges them): the
// families call their projections through `linear(layer, x)`, which adds `s · B(A(dropout(x)))` when the layer
// carries the children lora_A, lora_B and lora_scale, and is `layer(x)` otherwise.
#include <memory>
#include <string>

#include <torch/torch.h>

#include <hpctrain/models/kernels/mixed_precision_products.hpp>
#include <hpctrain/models/recompute/selective_recompute.hpp>

namespace hpctrain::models {

/// The adapter's dropout and scale: a child `lora_scale` of the adapted layer (no parameters; PEFT's `lora_dropout`
/// module and its `scaling` attribute in one).
class LoraScaleImpl : public torch::nn::Module {
 public:
  LoraScaleImpl(double dropout, double scaling) : dropout_(dropout), scaling_(scaling) {}
  torch::Tensor input(const torch::Tensor& x) { return dropout_ > 0 ? torch::dropout(x, dropout_, is_training()) : x; }
  double scaling() const { return scaling_; }

 private:
  double dropout_, scaling_;
};
TORCH_MODULE(LoraScale);

namespace detail {
/// The name of the adapter's LoraScale child.
inline constexpr const char* lora_scale_child = "lora_scale";

/// The child `name` of `module`, or nullptr.
inline std::shared_ptr<torch::nn::Module> child(const torch::nn::Module& module, const std::string& name) {
  for (const auto& item : module.named_children())
    if (item.key() == name) return item.value();
  return nullptr;
}
}  // namespace detail

namespace detail {
/// How many AdaptersOff scopes are open on this thread.
inline int& adapters_off_depth() {
  thread_local int depth = 0;
  return depth;
}
}  // namespace detail

/// While it lives, `linear` leaves the adapters out on this thread: the model computes as its base weights alone
/// (PEFT's `with model.disable_adapter():`, which TRL's DPOTrainer uses for the reference log-probabilities).
class AdaptersOff {
 public:
  AdaptersOff() { ++detail::adapters_off_depth(); }
  ~AdaptersOff() { --detail::adapters_off_depth(); }
  AdaptersOff(const AdaptersOff&) = delete;
  AdaptersOff& operator=(const AdaptersOff&) = delete;
};

/// `layer(x)`, plus its LoRA adapter's contribution when it has one (and no AdaptersOff is open): how the families
/// call their projections.
/// Through at::linear (what Python's F.linear is), not torch::nn::Linear's forward: LibTorch's C++ F::linear
/// computes matmul, then `+= bias`, which autocast leaves in fp32, so a bf16 output plus an fp32 bias went
/// through ATen's mixed-dtype elementwise kernel (6 ms of a 60 ms GPT-2 124M step on an H100, docs/gpu.md);
/// at::linear adds the bias in the matrix product's epilogue. (The adapter's A and B have no bias: at::linear
/// is the matmul F::linear computes for them.) Under autocast the layer's own product writes its gradients in
/// fp32 (models/kernels/mixed_precision_products.hpp). In a block under selective recomputation the products are
/// recorded in its forward and replayed in its recomputation (models/recompute/selective_recompute.hpp).
inline torch::Tensor linear(torch::nn::Linear& layer, const torch::Tensor& x) {
  using detail::MatrixProducts;
  std::shared_ptr<torch::nn::LinearImpl> a, b;
  std::shared_ptr<LoraScaleImpl> scale;
  if (!layer->named_children().is_empty()) {
    a = std::dynamic_pointer_cast<torch::nn::LinearImpl>(detail::child(*layer, "lora_A"));
    b = std::dynamic_pointer_cast<torch::nn::LinearImpl>(detail::child(*layer, "lora_B"));
    scale = std::dynamic_pointer_cast<LoraScaleImpl>(detail::child(*layer, detail::lora_scale_child));
  }
  const bool adapted = a && b && scale && detail::adapters_off_depth() == 0;
  const auto biases = layer->bias.defined() ? at::TensorList(layer->bias) : at::TensorList();
  if (auto* replaying = MatrixProducts::active(MatrixProducts::Phase::replay)) {
    auto recorded = replaying->replay_next();
    if (!adapted) return projection(x, layer->weight, biases, std::move(recorded.output));
    torch::Tensor middle;
    // the adapter's dropout runs again (its random state replayed), its product does not
    middle = detail::replayed_linear(scale->input(x), a->weight, a->bias, {}, {}, {}, 0.0,
                                     std::move(recorded.adapter_middle));
    return detail::replayed_linear(x, layer->weight, layer->bias, middle, b->weight, b->bias, scale->scaling(),
                                   std::move(recorded.output));
  }
  auto y = projection(x, layer->weight, biases);
  torch::Tensor middle;
  if (adapted) {
    middle = torch::linear(scale->input(x), a->weight, a->bias);
    y = y + torch::linear(middle, b->weight, b->bias) * scale->scaling();
  }
  if (auto* recording = MatrixProducts::active(MatrixProducts::Phase::record)) recording->record(y, middle);
  return y;
}

/// Whether a parameter name belongs to an adapter.
inline bool is_lora_parameter(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

}  // namespace hpctrain::models
