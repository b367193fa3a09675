#pragma once
// AdamW through ATen's fused kernel (at::_fused_adamw_, what PyTorch's `AdamW(fused=True)` calls): one kernel
// launch per device and dtype for every parameter of a group, instead of torch::optim::AdamW's dozen small ops
// per parameter (on a GPU, ~12 launches x 148 tensors for GPT-2 124M, each a few microseconds of launch
// overhead). The update is AdamW's, decoupled weight decay included; the arithmetic runs in fp32 for bf16 or
// fp16 parameters, as PyTorch's fused path does.
//
// It is a torch::optim::AdamW: same options, same per-parameter state (AdamWParamState), so its checkpoints,
// ZeRO's sharded state and resharding are AdamW's, and a run may switch between the two across a resume. The
// switch is the user's: return hpctrain::FusedAdamW where a program returned torch::optim::AdamW.
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/optim/adamw.h>
#include <torch/utils.h>  // NoGradGuard

namespace hpctrain {

class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;

  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    torch::Tensor loss;
    if (closure) {
      at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    for (auto& group : param_groups()) step_group(group);
    return loss;
  }

 private:
  /// The lists the kernel takes for one (device, dtype, step): it wants one device and dtype per call. Grouping
  /// by step too (parameters that had no gradient on some step fall behind) lets one torch::full on the device
  /// fill every step of a launch, with no host-to-device copy.
  struct Launch {
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  };

  void step_group(torch::optim::OptimizerParamGroup& group) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, Launch> launches;  // (device, dtype, step)
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "FusedAdamW does not support sparse gradients");
      auto& state = state_of(p, options.amsgrad());
      state.step(state.step() + 1);
      const auto key = std::make_tuple(static_cast<std::int64_t>(p.device().type()) * 1024 + p.device().index(),
                                       static_cast<std::int64_t>(p.scalar_type()), state.step());
      auto& launch = launches[key];
      launch.params.push_back(p);
      launch.grads.push_back(p.grad());
      launch.exp_avgs.push_back(state.exp_avg());
      launch.exp_avg_sqs.push_back(state.exp_avg_sq());
      if (options.amsgrad()) launch.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
    }
    const auto [beta1, beta2] = options.betas();
    for (auto& [key, launch] : launches) {
      // The kernel reads each parameter's step from a float tensor on its device; filled there, no host copy.
      const auto steps =
          torch::full({static_cast<std::int64_t>(launch.params.size())}, static_cast<double>(std::get<2>(key)),
                      torch::TensorOptions().dtype(torch::kFloat32).device(launch.params.front().device()));
      at::_fused_adamw_(launch.params, launch.grads, launch.exp_avgs, launch.exp_avg_sqs, launch.max_exp_avg_sqs,
                        steps.unbind(0), options.lr(), beta1, beta2, options.weight_decay(), options.eps(),
                        options.amsgrad(),
                        /*maximize=*/false);
    }
  }

  /// The parameter's AdamW state, made at its first step as torch::optim::AdamW makes it.
  torch::optim::AdamWParamState& state_of(const torch::Tensor& p, bool amsgrad) {
    auto& states = state();
    auto found = states.find(p.unsafeGetTensorImpl());
    if (found == states.end()) {
      auto fresh = std::make_unique<torch::optim::AdamWParamState>();
      fresh->step(0);
      fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      if (amsgrad) fresh->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      found = states.emplace(p.unsafeGetTensorImpl(), std::move(fresh)).first;
    }
    return static_cast<torch::optim::AdamWParamState&>(*found->second);
  }
};

}  // namespace hpctrain
