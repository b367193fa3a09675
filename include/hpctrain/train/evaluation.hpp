#pragma once
// Evaluation: every rank runs the evaluation step on a strided share of the eval set (or of its first
// Training::max_eval_examples), in eval mode, under NoGradGuard and the precision scope; the loss (weighted by
// EvalOutput::weight) and each metric's (sum, count) accumulate on the device and are all-reduced once, as one
// tensor, at the end.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include <hpctrain/dist/collectives.hpp>
#include <hpctrain/dist/process_group.hpp>
#include <hpctrain/train/data/sampler.hpp>
#include <hpctrain/train/data/source.hpp>
#include <hpctrain/train/metrics.hpp>
#include <hpctrain/train/precision.hpp>
#include <hpctrain/train/preemption.hpp>  // note_training_progress
#include <hpctrain/train/step.hpp>
#include <hpctrain/train/training.hpp>

namespace hpctrain {

/// The result of one evaluation, the same on every rank.
struct Evaluation {
  double loss = 0;                                      ///< weighted mean loss
  std::int64_t examples = 0;                            ///< examples evaluated (all ranks)
  std::vector<std::pair<std::string, double>> metrics;  ///< the Training's metrics, in order

  /// The value of metric `name`, if it was computed.
  std::optional<double> metric(const std::string& name) const {
    for (const auto& [key, value] : metrics)
      if (key == name) return value;
    return std::nullopt;
  }
};

namespace detail {

/// Runs `training`'s eval step over `dataset` on every rank; all ranks call it together.
inline Evaluation evaluate(const Training& training, const ModelInstance& model, const data::Dataset& dataset,
                           dist::ProcessGroup& group, std::int64_t step, bool forward_is_collective = false) {
  const auto device = group.device();
  const auto f64 = torch::TensorOptions(torch::kFloat64).device(device);
  const auto& metrics = training.metrics();
  model.module->eval();
  torch::NoGradGuard no_grad;
  torch::Tensor loss_sum = torch::zeros({}, f64), weight_sum = torch::zeros({}, f64);
  std::vector<torch::Tensor> sums, counts;  // one tensor each (not copies of one handle: they add in place)
  for (std::size_t m = 0; m < metrics.size(); ++m) {
    sums.push_back(torch::zeros({}, f64));
    counts.push_back(torch::zeros({}, f64));
  }
  const auto examples =
      training.max_eval_examples() > 0 ? std::min(dataset.size(), training.max_eval_examples()) : dataset.size();
  const auto mine = data::strided_indices(examples, group.world_size(), group.rank());
  const auto batch_size = static_cast<std::size_t>(training.eval_batch_size());
  const auto run = [&](const data::Batch& batch) {
    StepContext context{
        *model.module,   model.forward,    device, training.precision(), group.rank(), group.world_size(), step, 0, 1,
        training.loss(), training.knobs(), nullptr};
    AutocastScope autocast(training.precision(), device);
    return training.eval_step()(context, batch);
  };
  for (std::size_t begin = 0; begin < mine.size(); begin += batch_size) {
    note_training_progress();  // a long evaluation after a preemption SIGTERM is progress, not a rank stuck
    const std::size_t end = std::min(mine.size(), begin + batch_size);
    const auto batch = dataset
                           .batch(std::vector<std::int64_t>(mine.begin() + static_cast<std::ptrdiff_t>(begin),
                                                            mine.begin() + static_cast<std::ptrdiff_t>(end)))
                           .to(device);
    const EvalOutput out = run(batch);
    const auto weight =
        out.weight.defined() ? out.weight.to(f64) : torch::scalar_tensor(static_cast<double>(end - begin), f64);
    loss_sum += out.loss.detach().to(f64) * weight;
    weight_sum += weight;
    for (std::size_t m = 0; m < metrics.size(); ++m) {
      const auto part = metrics[m].update({out.output, batch, out.loss, weight});
      sums[m] += part.sum.to(f64);
      counts[m] += part.count.to(f64);
    }
  }
  // A forward that gathers from every rank needs every rank: one with fewer batches (rank 0 has the most) runs
  // one example again for each batch it lacks, its output discarded.
  const auto batches = [&](std::size_t indices) { return (indices + batch_size - 1) / batch_size; };
  const auto most = static_cast<std::size_t>((examples + group.world_size() - 1) / group.world_size());
  if (forward_is_collective && examples > 0)
    for (auto k = batches(mine.size()); k < batches(most); ++k)
      run(dataset.batch(std::vector<std::int64_t>{0}).to(device));
  std::vector<torch::Tensor> all{loss_sum, weight_sum, torch::scalar_tensor(static_cast<double>(mine.size()), f64)};
  all.insert(all.end(), sums.begin(), sums.end());
  all.insert(all.end(), counts.begin(), counts.end());
  auto totals = torch::stack(all);
  dist::all_reduce_sum(group, totals);
  totals = totals.cpu();
  const auto* t = totals.data_ptr<double>();
  model.module->train();
  Evaluation evaluation{metrics::Metric::mean(t[0], t[1]), static_cast<std::int64_t>(t[2]), {}};
  for (std::size_t m = 0; m < metrics.size(); ++m)
    evaluation.metrics.emplace_back(metrics[m].name(), metrics[m].finish(t[3 + m], t[3 + metrics.size() + m]));
  return evaluation;
}

}  // namespace detail
}  // namespace hpctrain
