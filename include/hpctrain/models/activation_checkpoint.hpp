#pragma once
// Activation checkpointing for LibTorch, which has no torch.utils.checkpoint: a custom autograd Function
// runs a block without recording its graph, keeps only the block's input, and in backward runs the block
// again with grad enabled and back-propagates through that copy (the "reentrant" checkpoint of PyTorch).
// Gradients of the block's parameters accumulate into their .grad as usual. The random state (dropout)
// and the autocast state of the forward are restored for the recomputation, so it computes the same
// values.
#include <functional>
#include <mutex>
#include <utility>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

namespace hpctrain::models {

namespace detail {

/// What the recomputation needs, carried through the autograd context.
struct Recomputation : torch::CustomClassHolder {
  std::function<torch::Tensor(const torch::Tensor&)> block;
  torch::Tensor rng_state;
  bool autocast_enabled = false;
  at::ScalarType autocast_dtype = at::kFloat;
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor input,
                               c10::intrusive_ptr<Recomputation> recomputation) {
    const auto device_type = input.device().type();
    recomputation->autocast_enabled = at::autocast::is_autocast_enabled(device_type);
    recomputation->autocast_dtype = at::autocast::get_autocast_dtype(device_type);
    auto generator = at::globalContext().defaultGenerator(input.device());
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      recomputation->rng_state = generator.get_state();
    }
    ctx->save_for_backward({input});
    ctx->saved_data["recomputation"] = c10::IValue::make_capsule(c10::static_intrusive_pointer_cast<torch::CustomClassHolder>(recomputation));
    torch::NoGradGuard no_grad;
    return recomputation->block(input);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    auto recomputation = c10::static_intrusive_pointer_cast<Recomputation>(ctx->saved_data["recomputation"].toCapsule());
    auto input = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    const auto device_type = input.device().type();
    auto generator = at::globalContext().defaultGenerator(input.device());
    // Fork the random state: replay the forward's, then give back the current one. (The generator's mutex
    // is held only around get/set: dropout in the block takes it too.)
    torch::Tensor current;
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      current = generator.get_state();
      generator.set_state(recomputation->rng_state);
    }
    const bool previous_enabled = at::autocast::is_autocast_enabled(device_type);
    const auto previous_dtype = at::autocast::get_autocast_dtype(device_type);
    at::autocast::set_autocast_dtype(device_type, recomputation->autocast_dtype);
    at::autocast::set_autocast_enabled(device_type, recomputation->autocast_enabled);
    // Cast weights cached here must not outlive the recomputation (the optimizer changes the weights).
    at::autocast::increment_nesting();
    torch::Tensor output;
    {
      torch::AutoGradMode enable(true);
      output = recomputation->block(input);
    }
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_type, previous_enabled);
    at::autocast::set_autocast_dtype(device_type, previous_dtype);
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(current);
    }
    torch::autograd::backward({output}, {grads[0]});
    return {input.grad(), torch::Tensor()};
  }
};

}  // namespace detail

/// `block(input)`, keeping only `input` for backward: the block runs again there. The result must depend
/// on `input` (which must require grad) for the block's parameters to receive gradients.
inline torch::Tensor checkpointed(std::function<torch::Tensor(const torch::Tensor&)> block, const torch::Tensor& input) {
  auto recomputation = c10::make_intrusive<detail::Recomputation>();
  recomputation->block = std::move(block);
  return detail::CheckpointFunction::apply(input, recomputation);
}

}  // namespace hpctrain::models
