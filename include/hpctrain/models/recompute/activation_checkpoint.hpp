#pragma once
// Activation checkpointing for LibTorch, which has no torch.utils.checkpoint: a custom autograd Function
// runs a block without recording its graph, keeps only the block's input, and in backward runs the block
// again with grad enabled and back-propagates through that copy (the "reentrant" checkpoint of PyTorch).
// Gradients of the block's parameters accumulate into their .grad as usual. The random state (dropout)
// and the autocast state of the forward are restored for the recomputation, so it computes the same
// values. Hooks around the forward call and around recomputation + backward let the fully sharded strategy
// gather a block's parameters just before each and free them after (train/strategies/fully_sharded.hpp).
// Selective (Recompute::selective) keeps the block's matrix products from the forward and replays them in the
// recomputation, which then runs only the elementwise work again (models/recompute/selective_recompute.hpp).
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <hpctrain/models/recompute/recompute.hpp>
#include <hpctrain/models/recompute/selective_recompute.hpp>

namespace hpctrain::models {

/// Called around a checkpointed block's two runs; any may be empty.
struct CheckpointHooks {
  std::function<void()> before_forward;    ///< before the forward run (no grad)
  std::function<void()> after_forward;     ///< after it
  std::function<void()> before_recompute;  ///< in backward, before the block runs again with grad
  std::function<void()> after_backward;    ///< once the block's gradients (parameters and input) are computed
};

namespace detail {

inline void call_hook(const std::function<void()>& hook) {
  if (hook) hook();
}

/// What the recomputation needs, carried through the autograd context.
struct Recomputation : torch::CustomClassHolder {
  std::function<torch::Tensor(const torch::Tensor&)> block;
  CheckpointHooks hooks;
  torch::Tensor rng_state;
  bool autocast_enabled = false;
  at::ScalarType autocast_dtype = at::kFloat;
  /// Selective recomputation: the forward's matrix products, replayed by the recomputation. Null for full.
  std::unique_ptr<MatrixProducts> products;
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // `anchor` is a 0-dim tensor that requires grad: the output then requires grad (and backward runs, giving
  // the block's parameters their gradients) even when `input` does not (raw data into a first block).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor input,
                               c10::intrusive_ptr<Recomputation> recomputation, torch::Tensor anchor) {
    (void)anchor;
    const auto device_type = input.device().type();
    recomputation->autocast_enabled = at::autocast::is_autocast_enabled(device_type);
    recomputation->autocast_dtype = at::autocast::get_autocast_dtype(device_type);
    auto generator = at::globalContext().defaultGenerator(input.device());
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      recomputation->rng_state = generator.get_state();
    }
    ctx->save_for_backward({input});
    ctx->saved_data["recomputation"] =
        c10::IValue::make_capsule(c10::static_intrusive_pointer_cast<torch::CustomClassHolder>(recomputation));
    torch::NoGradGuard no_grad;
    call_hook(recomputation->hooks.before_forward);
    torch::Tensor output;
    if (recomputation->products) {
      MatrixProductsScope recording(*recomputation->products, MatrixProducts::Phase::record);
      output = recomputation->block(input);
    } else {
      output = recomputation->block(input);
    }
    call_hook(recomputation->hooks.after_forward);
    return output;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto recomputation =
        c10::static_intrusive_pointer_cast<Recomputation>(ctx->saved_data["recomputation"].toCapsule());
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
    call_hook(recomputation->hooks.before_recompute);
    torch::Tensor output;
    {
      torch::AutoGradMode enable(true);
      if (recomputation->products) {
        MatrixProductsScope replaying(*recomputation->products, MatrixProducts::Phase::replay);
        output = recomputation->block(input);
        recomputation->products->finish_replay();  // the recomputed graph holds the products now
      } else {
        output = recomputation->block(input);
      }
    }
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_type, previous_enabled);
    at::autocast::set_autocast_dtype(device_type, previous_dtype);
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(current);
    }
    torch::autograd::backward({output}, {grads[0]});
    call_hook(recomputation->hooks.after_backward);
    return {input.grad(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace detail

namespace detail {

struct BackwardHook : torch::CustomClassHolder {
  std::function<void()> hook;
};

/// The identity, whose backward calls a hook when the gradient of its output arrives.
struct OnBackwardFunction : torch::autograd::Function<OnBackwardFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               c10::intrusive_ptr<BackwardHook> hook, torch::Tensor anchor) {
    (void)anchor;
    ctx->saved_data["hook"] =
        c10::IValue::make_capsule(c10::static_intrusive_pointer_cast<torch::CustomClassHolder>(hook));
    return x;  // returned as a view of itself, with this node as its grad_fn
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    c10::static_intrusive_pointer_cast<BackwardHook>(ctx->saved_data["hook"].toCapsule())->hook();
    return {grads[0], torch::Tensor(), torch::Tensor()};
  }
};

struct GradientHook : torch::CustomClassHolder {
  std::function<void(const torch::Tensor&)> hook;
};

/// The identity on a tensor that needs no gradient, whose backward hands the gradient of its output to a hook and
/// nothing further: the hook does with it what autograd would not (a lookup whose weight is not in the graph).
struct GradientSinkFunction : torch::autograd::Function<GradientSinkFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               c10::intrusive_ptr<GradientHook> hook, torch::Tensor anchor) {
    (void)anchor;
    ctx->saved_data["hook"] =
        c10::IValue::make_capsule(c10::static_intrusive_pointer_cast<torch::CustomClassHolder>(hook));
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (grads[0].defined())
      c10::static_intrusive_pointer_cast<GradientHook>(ctx->saved_data["hook"].toCapsule())->hook(grads[0]);
    return {torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace detail

/// `x` (which needs no gradient) unchanged, in the graph: in backward `hook` receives the gradient of the result, and
/// nothing flows further. ZeRO-3's embedding (train/strategies/fully_sharded.hpp) computes its weight's gradient there
/// from the ids alone, without gathering the weight again for backward.
inline torch::Tensor on_gradient(const torch::Tensor& x, std::function<void(const torch::Tensor&)> hook) {
  auto holder = c10::make_intrusive<detail::GradientHook>();
  holder->hook = std::move(hook);
  auto anchor = torch::zeros({}, torch::TensorOptions().device(x.device()).requires_grad(true));
  return detail::GradientSinkFunction::apply(x, holder, anchor);
}

/// `x` unchanged, with `hook` called in backward once the gradient of the result has been computed: on a block's
/// output, before the block's own backward; on its input, after it (autograd runs the parameters' gradient
/// accumulation first, as soon as each is ready). The hook runs even when `x` needs no gradient.
inline torch::Tensor on_backward(const torch::Tensor& x, std::function<void()> hook) {
  auto holder = c10::make_intrusive<detail::BackwardHook>();
  holder->hook = std::move(hook);
  auto anchor = torch::zeros({}, torch::TensorOptions().device(x.device()).requires_grad(true));
  return detail::OnBackwardFunction::apply(x, holder, anchor);
}

/// `block(input)`, keeping only `input` for backward: the block runs again there. The result must depend
/// on `input` (which must require grad) for the block's parameters to receive gradients.
/// With `hooks`, each is called at its point (see CheckpointHooks); the block's parameters then receive
/// gradients even when `input` does not require grad. `recompute` selective keeps the outputs of the block's
/// projections (models::linear) too, and the recomputation reuses them; full (or none, here) keeps nothing else.
inline torch::Tensor checkpointed(std::function<torch::Tensor(const torch::Tensor&)> block, const torch::Tensor& input,
                                  CheckpointHooks hooks = {}, Recompute recompute = Recompute::full) {
  auto recomputation = c10::make_intrusive<detail::Recomputation>();
  recomputation->block = std::move(block);
  recomputation->hooks = std::move(hooks);
  if (recompute == Recompute::selective) recomputation->products = std::make_unique<detail::MatrixProducts>();
  // A fresh leaf per call: autograd then runs backward whenever the block's output is used in a loss.
  auto anchor =
      torch::zeros({}, torch::TensorOptions().device(input.device()).requires_grad(torch::GradMode::is_enabled()));
  return detail::CheckpointFunction::apply(input, recomputation, anchor);
}

}  // namespace hpctrain::models
