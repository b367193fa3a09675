#pragma once
// `ht::adamw(3e-4).betas({0.9, 0.95}).weight_decay(0.1)`: the AdamW of language-model recipes as configuration, what
// Training::optimizer takes. By default the matrices decay and the biases, norms and other 1-D tensors do not
// (weight_decay_groups), and the update runs in ATen's fused kernel (FusedAdamW) where the parameters' device has
// one; the same arithmetic as torch::optim::AdamW, and the same state, so checkpoints carry over between the two.
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/optim/adamw.h>
#include <torch/types.h>

#include <hpctrain/compiled_runtime.hpp>
#include <hpctrain/job/setting.hpp>
#include <hpctrain/train/training.hpp>
#if HPCTRAIN_RUNTIME_DEFINITIONS  // the update's code: not parsed by a program that links the runtime
#include <hpctrain/train/optim/fused_adamw.hpp>
#endif

namespace hpctrain {

/// AdamW's options, and how the parameters are grouped and updated; an optimizer factory for Training::optimizer.
class AdamWFactory {
 public:
  /// `lr`: the base learning rate the schedule multiplies (`--lr` overrides it).
  explicit AdamWFactory(double lr) : lr_(lr) {}

  /// Default: {0.9, 0.999}, PyTorch's.
  AdamWFactory& betas(std::tuple<double, double> betas) {
    betas_ = betas;
    return *this;
  }
  /// Default: 1e-8.
  AdamWFactory& eps(double eps) {
    eps_ = eps;
    return *this;
  }
  /// The decoupled weight decay of the decayed group; a value, or a knob (`ht::knob("weight_decay", 0.1, ...)`).
  /// Default: 0.01, PyTorch's.
  AdamWFactory& weight_decay(Setting<double> decay) {
    weight_decay_ = std::move(decay);
    return *this;
  }
  /// Whether biases, norm weights and other 1-D tensors are left undecayed (weight_decay_groups). Default: true.
  AdamWFactory& decay_groups(bool on) {
    decay_groups_ = on;
    return *this;
  }
  /// Whether the update runs in ATen's fused kernel where the device has one (CPU, CUDA). Default: true.
  AdamWFactory& fused(bool on) {
    fused_ = on;
    return *this;
  }

  /// The options of the decayed group for this run's knobs.
  torch::optim::AdamWOptions options(const Knobs& knobs) const {
    return torch::optim::AdamWOptions(lr_).betas(betas_).eps(eps_).weight_decay(weight_decay_.get(knobs));
  }

  /// The optimizer over `parameters` (Training::optimizer calls it once per rank, on the device). Out of line where
  /// the runtime is compiled apart: a program's unit does not generate the fused update's code.
  HPCTRAIN_RUNTIME_INLINE std::unique_ptr<torch::optim::Optimizer> operator()(const NamedParameters& parameters,
                                                                              const Knobs& knobs) const;

  /// ATen's fused AdamW runs on CPU and CUDA tensors; elsewhere torch::optim::AdamW's per-tensor ops do.
  static bool has_fused_kernel(const NamedParameters& parameters) {
    for (const auto& [name, tensor] : parameters)
      if (!tensor.device().is_cpu() && !tensor.device().is_cuda()) return false;
    return true;
  }

 private:
  double lr_;
  std::tuple<double, double> betas_{0.9, 0.999};
  double eps_ = 1e-8;
  Setting<double> weight_decay_ = 0.01;
  bool decay_groups_ = true;
  bool fused_ = true;
};

/// `Training().optimizer(ht::adamw(3e-4).betas({0.9, 0.95}).weight_decay(0.1))`: AdamW at base learning rate `lr`.
inline AdamWFactory adamw(double lr) { return AdamWFactory(lr); }

#if HPCTRAIN_RUNTIME_DEFINITIONS
HPCTRAIN_RUNTIME_INLINE std::unique_ptr<torch::optim::Optimizer> AdamWFactory::operator()(
    const NamedParameters& parameters, const Knobs& knobs) const {
  const auto opts = options(knobs);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (decay_groups_) {
    groups = weight_decay_groups(parameters, opts);
  } else {
    std::vector<torch::Tensor> all;
    for (const auto& [name, tensor] : parameters) all.push_back(tensor);
    groups.emplace_back(std::move(all), std::make_unique<torch::optim::AdamWOptions>(opts));
  }
  if (fused_ && has_fused_kernel(parameters)) return std::make_unique<FusedAdamW>(std::move(groups), opts);
  return std::make_unique<torch::optim::AdamW>(std::move(groups), opts);
}
#endif

}  // namespace hpctrain
