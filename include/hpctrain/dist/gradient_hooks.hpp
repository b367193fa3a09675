#pragma once
// The hook both data-parallel gradient paths hang on every parameter (dist/gradient_sync.hpp all-reduces,
// dist/sharded_gradients.hpp reduce-scatters): autograd calls it once it has accumulated a parameter's gradient
// into .grad, and it tells the state that owns the buckets which parameter is ready, so a full bucket can launch
// while backward goes on.
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>

namespace hpctrain::dist::detail {

/// Calls `state->on_gradient(parameter)` after autograd accumulated that parameter's gradient.
template <class State>
class GradientArrived : public torch::autograd::PostAccumulateGradHook {
 public:
  GradientArrived(std::shared_ptr<State> state, std::size_t parameter)
      : state_(std::move(state)), parameter_(parameter) {}
  void operator()(const torch::autograd::Variable& /*tensor*/) override { state_->on_gradient(parameter_); }

 private:
  std::shared_ptr<State> state_;
  std::size_t parameter_;
};

/// Hangs GradientArrived on each of `parameters` (the i-th reports i), replacing the hook a former owner hung.
template <class State>
void install_gradient_hooks(const std::vector<torch::Tensor>& parameters, const std::shared_ptr<State>& state) {
  for (std::size_t i = 0; i < parameters.size(); ++i)
    torch::autograd::impl::set_post_acc_grad_hooks(parameters[i], std::make_unique<GradientArrived<State>>(state, i));
}

}  // namespace hpctrain::dist::detail
