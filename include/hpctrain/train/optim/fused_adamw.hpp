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
//
// A step captured in a CUDA graph (Training::cuda_graphs) replays its launches with the arguments of the capture,
// so there the step counts and learning rates live in tensors on the device (keep_counters_on_device): the graph
// increments the counts itself and reads the rates that load_learning_rates() last wrote. The host keeps its
// own counts all the same (count_replayed_step), so checkpoints read them as ever.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>
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
    if (!on_device_) {
      for (auto& group : param_groups()) step_group(group);
      return loss;
    }
    if (!capturing_) load_learning_rates();
    for (std::size_t index = 0; index < param_groups().size(); ++index) step_group_on_device(index);
    return loss;
  }

  /// From the next step on, the step counts and learning rates are read from tensors on the parameters'
  /// devices, and a step reads nothing from the host that changes between steps: what a CUDA graph of the step
  /// needs. The arithmetic is the same.
  void keep_counters_on_device() { on_device_ = true; }
  bool counters_on_device() const { return on_device_; }

  /// Copies each group's learning rate (its options' lr, which the schedule sets) into its tensors on the
  /// device. A step does it itself, except while it is being captured: a replay reads what this wrote last.
  void load_learning_rates() {
    for (auto& [key, rate] : learning_rates_)
      rate.fill_(static_cast<const torch::optim::AdamWOptions&>(param_groups().at(key.first).options()).lr());
  }

  /// While on, a step is being captured: it leaves the learning rates' tensors alone and notes the parameters
  /// it updates. It must not make any state either: a tensor made inside a capture is made again by every replay.
  void set_capturing(bool on) {
    capturing_ = on;
    if (on) captured_.clear();
  }

  /// The host's counts after a replay of the captured step: each parameter it updated took one more step.
  void count_replayed_step() {
    for (auto* parameter : captured_) {
      auto& counts = static_cast<torch::optim::AdamWParamState&>(*state().at(parameter));
      counts.step(counts.step() + 1);
      device_steps_.at(parameter).host_step = counts.step();
    }
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

  /// A parameter's step count on its device, and the host's count it was last equal to: when the host's count
  /// differs (a checkpoint loaded, shards rearranged), the device's is made again from it.
  struct DeviceStep {
    torch::Tensor value;  ///< float32, 0-dim, as the kernel reads it
    std::int64_t host_step = 0;
  };

  /// One group's step with the counts and the learning rate on the device: one increment of the counts and
  /// one kernel per device and dtype.
  void step_group_on_device(std::size_t index) {
    auto& group = param_groups()[index];
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    struct DeviceLaunch : Launch {
      std::vector<torch::Tensor> steps;
      torch::Device device = torch::kCPU;
    };
    std::map<std::pair<std::int64_t, std::int64_t>, DeviceLaunch> launches;  // (device, dtype)
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "FusedAdamW does not support sparse gradients");
      auto& state = state_of(p, options.amsgrad());
      auto& counter = device_step(p, state.step());
      state.step(state.step() + 1);
      counter.host_step = state.step();
      if (capturing_) captured_.push_back(p.unsafeGetTensorImpl());
      auto& launch = launches[{device_key(p.device()), static_cast<std::int64_t>(p.scalar_type())}];
      launch.device = p.device();
      launch.params.push_back(p);
      launch.grads.push_back(p.grad());
      launch.exp_avgs.push_back(state.exp_avg());
      launch.exp_avg_sqs.push_back(state.exp_avg_sq());
      if (options.amsgrad()) launch.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
      launch.steps.push_back(counter.value);
    }
    const auto [beta1, beta2] = options.betas();
    for (auto& [key, launch] : launches) {
      torch::_foreach_add_(launch.steps, 1.0);
      at::_fused_adamw_(launch.params, launch.grads, launch.exp_avgs, launch.exp_avg_sqs, launch.max_exp_avg_sqs,
                        launch.steps, learning_rate(index, launch.device), beta1, beta2, options.weight_decay(),
                        options.eps(), options.amsgrad(),
                        /*maximize=*/false);
    }
  }

  static std::int64_t device_key(const torch::Device& device) {
    return static_cast<std::int64_t>(device.type()) * 1024 + device.index();
  }

  /// `p`'s count on its device, equal to the host's `host_step`.
  DeviceStep& device_step(const torch::Tensor& p, std::int64_t host_step) {
    auto& counter = device_steps_[p.unsafeGetTensorImpl()];
    if (!counter.value.defined() || counter.host_step != host_step) {
      refuse_inside_capture("step count");
      counter.value = torch::full({}, static_cast<double>(host_step),
                                  torch::TensorOptions().dtype(torch::kFloat32).device(p.device()));
      counter.host_step = host_step;
    }
    return counter;
  }

  /// Group `index`'s learning rate on `device`: float32 on a GPU, as PyTorch's capturable AdamW keeps it; float64
  /// on the CPU, whose kernel reads it as a double (so it equals the host-count path's).
  const torch::Tensor& learning_rate(std::size_t index, const torch::Device& device) {
    auto& rate = learning_rates_[{index, device_key(device)}];
    if (!rate.defined()) {
      refuse_inside_capture("learning rate");
      rate =
          torch::full({}, static_cast<const torch::optim::AdamWOptions&>(param_groups()[index].options()).lr(),
                      torch::TensorOptions().dtype(device.is_cpu() ? torch::kFloat64 : torch::kFloat32).device(device));
    }
    return rate;
  }

  /// A state tensor made inside a capture would be made again, from its first value, by every replay.
  void refuse_inside_capture(const char* what) const {
    TORCH_CHECK(!capturing_, "FusedAdamW: a parameter's ", what,
                " would be made inside the captured step; every parameter must have stepped once before the capture");
  }

  /// The parameter's AdamW state, made at its first step as torch::optim::AdamW makes it.
  torch::optim::AdamWParamState& state_of(const torch::Tensor& p, bool amsgrad) {
    auto& states = state();
    auto found = states.find(p.unsafeGetTensorImpl());
    if (found == states.end()) {
      refuse_inside_capture("state");
      auto fresh = std::make_unique<torch::optim::AdamWParamState>();
      fresh->step(0);
      fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      if (amsgrad) fresh->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      found = states.emplace(p.unsafeGetTensorImpl(), std::move(fresh)).first;
    }
    return static_cast<torch::optim::AdamWParamState&>(*found->second);
  }

  bool on_device_ = false;
  bool capturing_ = false;
  std::vector<c10::TensorImpl*> captured_;                         ///< the parameters the captured step updates
  std::unordered_map<c10::TensorImpl*, DeviceStep> device_steps_;  ///< by parameter
  std::map<std::pair<std::size_t, std::int64_t>, torch::Tensor> learning_rates_;  ///< by (group, device)
};

}  // namespace hpctrain
