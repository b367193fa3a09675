#pragma once
// Seam 1 of the Trainer (docs/seams.md): what one micro-step computes. The Trainer calls a StepFunction for
// every micro-batch, inside the precision scope, and backpropagates the loss it returns; evaluation calls an
// EvalStepFunction for every evaluation batch under NoGradGuard. The defaults are `loss(forward(inputs),
// targets)` and, for evaluation, the same loss with the output handed to the metrics.
#include <concepts>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <hpctrain/job/knobs.hpp>
#include <hpctrain/train/data/source.hpp>
#include <hpctrain/train/precision.hpp>

namespace hpctrain {

/// A loss `(output, target) -> 0-dim tensor`: the Training's `.loss(...)`.
using LossFunction = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>;

/// The model's own forward `(inputs) -> output`.
using ForwardFunction = std::function<torch::Tensor(torch::Tensor)>;

/// Named values a step reports besides its loss (DPO's rewards, ...): 0-dim tensors on the device, summed here
/// without a host synchronisation; the Trainer all-reduces them once per log interval and logs each as its mean over
/// the interval's micro-batches and the ranks, in the train record, under the name given.
class StepValues {
 public:
  /// Adds `value` (0-dim, detached) to the running sum of `name`.
  void add(std::string_view name, const torch::Tensor& value) {
    const auto v = value.detach().to(torch::kFloat64).reshape({});
    for (auto& entry : entries_)
      if (entry.name == name) {
        entry.sum = entry.sum + v;
        ++entry.count;
        return;
      }
    entries_.push_back({std::string(name), v.clone(), 1});
  }
  struct Entry {
    std::string name;
    torch::Tensor sum;  ///< 0-dim float64, on the device
    std::int64_t count = 0;
  };
  /// The values reported since the last take(), in the order first reported (the same on every rank); cleared.
  std::vector<Entry> take() { return std::exchange(entries_, {}); }

 private:
  std::vector<Entry> entries_;
};

/// What a step sees: the model, where it runs, where the run stands, and the Training's loss.
struct StepContext {
  torch::nn::Module& module;      ///< the user's module (parameters, submodules, train/eval mode)
  const ForwardFunction& model;   ///< the model's forward; `forward(x)` calls it
  torch::Device device;           ///< where the batch and the model are
  Precision precision;            ///< autocast is already entered around the step call when bf16
  int rank = 0;                   ///< this rank
  int world_size = 1;             ///< ranks in the run
  std::int64_t step = 0;          ///< optimizer steps completed before this one
  std::int64_t micro_step = 0;    ///< micro-batch within the step, 0 .. accumulation - 1 (0 in evaluation)
  std::int64_t accumulation = 1;  ///< micro-batches per optimizer step
  const LossFunction& loss;       ///< the Training's loss
  const Knobs& knobs;             ///< this run's knob values: `ctx.knobs.get<double>("warmup_steps")`
  StepValues* values = nullptr;   ///< where report() goes: the Trainer's in training, none in evaluation

  /// The model's forward on `inputs`.
  torch::Tensor forward(const torch::Tensor& inputs) const { return model(inputs); }
  /// Reports `value` (0-dim) under `name` for the train record (StepValues); nothing in evaluation.
  void report(std::string_view name, const torch::Tensor& value) const {
    if (values != nullptr) values->add(name, value);
  }
};

/// One micro-step: returns the micro-batch's mean loss (a 0-dim tensor; the Trainer does not read it on the
/// host). The Trainer divides it by the accumulation and calls backward.
using StepFunction = std::function<torch::Tensor(StepContext&, const data::Batch&)>;

/// What a micro-batch's loss is a mean over: `(StepContext&, const data::Batch&) -> 0-dim count` (a language model's
/// counted targets), or an undefined tensor for "weigh this step's micro-batches alike". With a count the Trainer
/// weighs each micro-batch's mean by its share of the whole global batch's count, on every rank (docs/seams.md: the
/// loss of a step), so the step's loss and gradients are the mean over every counted item however the global batch
/// is split into ranks, micro-batches and accumulation steps. Without one (the default), each micro-batch's mean
/// weighs 1 / accumulation and the ranks' gradients are averaged: the mean of the micro-batches' means.
using LossCountFunction = std::function<torch::Tensor(StepContext&, const data::Batch&)>;

/// What one evaluation batch gives the metrics.
struct EvalOutput {
  torch::Tensor loss;    ///< mean loss of the batch (0-dim)
  torch::Tensor output;  ///< what metrics read (logits, for the built-in ones)
  torch::Tensor weight;  ///< what the mean is over (0-dim): rows by default, target tokens for a language model
};

/// One evaluation batch (under NoGradGuard, in eval mode, inside the precision scope).
using EvalStepFunction = std::function<EvalOutput(StepContext&, const data::Batch&)>;

namespace detail {
/// Wraps a loss: any callable of (output, target), or a torch::nn::functional function whose third
/// parameter is its options (`torch::nn::functional::cross_entropy`), called with default options.
template <class Options>
LossFunction wrap_loss(torch::Tensor (*function)(const torch::Tensor&, const torch::Tensor&, const Options&)) {
  return [function](const torch::Tensor& output, const torch::Tensor& target) {
    return function(output, target, Options{});
  };
}
template <class F>
requires std::invocable<F, const torch::Tensor&, const torch::Tensor&> LossFunction wrap_loss(F function) {
  return [function](const torch::Tensor& output, const torch::Tensor& target) -> torch::Tensor {
    return function(output, target);
  };
}
}  // namespace detail

/// The default step: `loss(forward(inputs), targets)`.
inline torch::Tensor default_step(StepContext& context, const data::Batch& batch) {
  return context.loss(context.forward(batch.inputs), batch.targets);
}

/// The default evaluation step: the same loss, the output for the metrics, weighted by the batch's rows.
inline EvalOutput default_eval_step(StepContext& context, const data::Batch& batch) {
  auto output = context.forward(batch.inputs);
  auto loss = context.loss(output, batch.targets);
  auto weight = torch::scalar_tensor(static_cast<double>(batch.size()),
                                     torch::TensorOptions(torch::kFloat64).device(context.device));
  return {std::move(loss), std::move(output), std::move(weight)};
}

}  // namespace hpctrain
