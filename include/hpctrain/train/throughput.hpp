#pragma once
// The train record of a log interval: the running loss stays on the device between log intervals (no
// host synchronisation per step) and is all-reduced and read once per interval; samples/s over the wall
// time of the interval's training steps; tokens/s when the inputs are integer token sequences; MFU when
// the Training states FLOPs per example and the device's peak.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include <torch/torch.h>

#include <hpctrain/dist/collectives.hpp>
#include <hpctrain/dist/process_group.hpp>
#include <hpctrain/train/data/source.hpp>
#include <hpctrain/train/loggers/loggers.hpp>
#include <hpctrain/train/step.hpp>

namespace hpctrain::detail {

/// Tokens in a batch whose inputs are integer sequences (batch × length or more), else 0.
inline std::int64_t tokens_in(const data::Batch& batch) {
  const auto& inputs = batch.inputs;
  if (!inputs.defined() || inputs.dim() < 2 || torch::isFloatingType(inputs.scalar_type()) ||
      inputs.scalar_type() == torch::kBool)
    return 0;
  return inputs.numel();
}

/// Accumulates the steps of one log interval.
class TrainMeter {
 public:
  TrainMeter(int world_size, std::int64_t examples_per_step, std::optional<double> flops_per_example,
             std::optional<double> peak_flops)
      : world_size_(world_size),
        examples_per_step_(examples_per_step),
        flops_per_example_(flops_per_example),
        peak_flops_(peak_flops) {}

  /// One optimizer step: its mean loss (0-dim, on the device; not read), the tokens of its batch on this rank.
  void add_step(const torch::Tensor& loss, std::int64_t tokens) {
    running_loss_ = running_loss_.defined() ? running_loss_ + loss : loss.clone();
    tokens_ += tokens;
    ++steps_;
  }
  /// Where the step function's reports go (StepContext::report).
  StepValues& step_values() { return step_values_; }
  /// Time spent outside training steps (evaluation, checkpoints) does not count towards throughput.
  void restart_clock() { start_ = clock::now(); }

  /// The interval's record (collective: every rank calls it at the same step); starts the next interval.
  LogRecord record(dist::ProcessGroup& group, std::int64_t step, std::int64_t epoch, double lr,
                   const torch::Tensor& grad_norm) {
    const double seconds = std::chrono::duration<double>(clock::now() - start_).count();
    const auto steps = static_cast<double>(std::max<std::int64_t>(1, steps_));
    auto loss =
        running_loss_.defined() ? running_loss_.to(torch::kFloat64).reshape({1}) : torch::zeros({1}, torch::kFloat64);
    const double mean_loss =
        dist::all_reduce_sum(group, loss.to(group.device())).item<double>() / steps / group.world_size();
    const double samples_per_s = steps * static_cast<double>(examples_per_step_ * world_size_) / seconds;
    LogRecord record{
        step,
        "train",
        {{"epoch", static_cast<double>(epoch)}, {"loss", mean_loss}, {"lr", lr}, {"samples_per_s", samples_per_s}}};
    if (tokens_ > 0) record.values.emplace_back("tokens_per_s", static_cast<double>(tokens_ * world_size_) / seconds);
    if (grad_norm.defined()) record.values.emplace_back("grad_norm", grad_norm.item<double>());
    if (flops_per_example_ && peak_flops_)
      record.values.emplace_back("mfu", *flops_per_example_ * samples_per_s / (*peak_flops_ * world_size_));
    add_step_values(group, record);
    running_loss_ = torch::Tensor();
    tokens_ = 0;
    steps_ = 0;
    restart_clock();
    return record;
  }

 private:
  /// The step functions' reports of the interval, each its mean over the micro-batches of every rank: one all-reduce.
  void add_step_values(dist::ProcessGroup& group, LogRecord& record) {
    auto entries = step_values_.take();
    if (entries.empty()) return;
    std::vector<torch::Tensor> all;
    for (const auto& entry : entries) all.push_back(entry.sum.to(group.device()));
    for (const auto& entry : entries)
      all.push_back(torch::scalar_tensor(static_cast<double>(entry.count),
                                         torch::TensorOptions(torch::kFloat64).device(group.device())));
    auto totals = torch::stack(all);
    dist::all_reduce_sum(group, totals);
    totals = totals.cpu();
    const auto* t = totals.data_ptr<double>();
    for (std::size_t i = 0; i < entries.size(); ++i)
      record.values.emplace_back(entries[i].name, t[i] / std::max(1.0, t[entries.size() + i]));
  }

  using clock = std::chrono::steady_clock;
  int world_size_;
  std::int64_t examples_per_step_;
  std::optional<double> flops_per_example_, peak_flops_;
  torch::Tensor running_loss_;
  StepValues step_values_;
  std::int64_t tokens_ = 0, steps_ = 0;
  clock::time_point start_ = clock::now();
};

}  // namespace hpctrain::detail
