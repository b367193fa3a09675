#pragma once
// The training description: what to train, on what, for how long and how. Plain data with chained setters
// (as torch::nn options are); nothing runs and no data is read until a worker starts. `validate()` names the
// first invalid field; hpctrain::run calls it before any mode (so `--submit` refuses a broken description).
#include <algorithm>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include <hpctrain/error.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/train/data/source.hpp>
#include <hpctrain/train/metrics.hpp>
#include <hpctrain/train/precision.hpp>
#include <hpctrain/train/schedule.hpp>

namespace hpctrain {

/// Whether a batch size counts examples per rank or across all ranks.
enum class BatchScope { per_rank, global };

/// A batch size with its scope stated: `per_rank(64)` or `global(256)`.
struct BatchSize {
  std::int64_t value = 0;
  BatchScope scope = BatchScope::per_rank;
};
/// `n` examples per rank per optimizer step (the global batch grows with the world).
inline BatchSize per_rank(std::int64_t n) { return {n, BatchScope::per_rank}; }
/// `n` examples per optimizer step across all ranks (must divide by world size × accumulation steps).
inline BatchSize global(std::int64_t n) { return {n, BatchScope::global}; }

namespace detail {
/// A model made in the worker: the module (for parameters, state, train/eval) and its forward.
struct ModelInstance {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(torch::Tensor)> forward;
};

template <class Made>
ModelInstance make_model_instance(Made made) {
  if constexpr (requires { made.ptr(); }) {  // a TORCH_MODULE holder such as torch::nn::Sequential
    auto module = made.ptr();
    return {module, [module](torch::Tensor x) -> torch::Tensor { return module->forward(std::move(x)); }};
  } else if constexpr (requires { made.get(); made.use_count(); }) {  // std::shared_ptr<SomeModule>
    auto module = made;
    return {module, [module](torch::Tensor x) -> torch::Tensor { return module->forward(std::move(x)); }};
  } else {
    static_assert(std::is_base_of_v<torch::nn::Module, Made>, "model(): the factory must return a torch::nn module");
    auto module = std::make_shared<Made>(std::move(made));
    return {module, [module](torch::Tensor x) -> torch::Tensor { return module->forward(std::move(x)); }};
  }
}

using LossFunction = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>;

/// Wraps a loss: any callable of (output, target), or a torch::nn::functional function whose third
/// parameter is its options (`torch::nn::functional::cross_entropy`), called with default options.
template <class Options>
LossFunction wrap_loss(torch::Tensor (*function)(const torch::Tensor&, const torch::Tensor&, const Options&)) {
  return [function](const torch::Tensor& output, const torch::Tensor& target) { return function(output, target, Options{}); };
}
template <class F>
  requires std::invocable<F, const torch::Tensor&, const torch::Tensor&>
LossFunction wrap_loss(F function) {
  return [function](const torch::Tensor& output, const torch::Tensor& target) -> torch::Tensor { return function(output, target); };
}
}  // namespace detail

/// Everything about a training except the job it runs in.
class Training {
 public:
  using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

  /// A factory returning the model: a module, a TORCH_MODULE holder or a shared_ptr to a module. Called
  /// once per rank after seeding, so every rank starts from the same weights (rank 0's are broadcast too).
  template <class Factory>
  Training& model(Factory factory) {
    model_ = [factory]() { return detail::make_model_instance(factory()); };
    return *this;
  }
  /// A factory `(std::vector<torch::Tensor> parameters) -> optimizer` returning any torch::optim optimizer by
  /// value. Its learning rate is the base the schedule multiplies (unless `lr()` or `--lr` overrides it).
  template <class Factory>
  Training& optimizer(Factory factory) {
    optimizer_ = [factory](std::vector<torch::Tensor> parameters) -> std::unique_ptr<torch::optim::Optimizer> {
      auto made = factory(std::move(parameters));
      return std::make_unique<decltype(made)>(std::move(made));
    };
    return *this;
  }
  /// The loss `(output, target) -> scalar`. Default: cross entropy.
  template <class Loss>
  Training& loss(Loss function) {
    loss_ = detail::wrap_loss(function);
    return *this;
  }
  /// Training data (required).
  Training& train_data(data::Source source) { train_data_ = std::move(source); return *this; }
  /// Evaluation data; without it there is no evaluation.
  Training& eval_data(data::Source source) { eval_data_ = std::move(source); return *this; }
  /// Batch size per optimizer step, `per_rank(n)` or `global(n)` (required).
  Training& batch_size(BatchSize size) { batch_size_ = size; return *this; }
  /// Batch size for evaluation, per rank. Default: 1000.
  Training& eval_batch_size(std::int64_t n) { eval_batch_size_ = n; return *this; }
  /// Number of passes over the training data. At least one of epochs and max_steps is required; with both,
  /// the run stops at whichever comes first.
  Training& epochs(std::int64_t n) { epochs_ = n; return *this; }
  /// Number of optimizer steps.
  Training& max_steps(std::int64_t n) { max_steps_ = n; return *this; }
  /// Base learning rate, replacing the optimizer's own. Default: the optimizer's.
  Training& lr(double rate) { lr_ = rate; return *this; }
  /// Learning-rate schedule. Default: LrSchedule::constant().
  Training& schedule(LrSchedule schedule) { schedule_ = schedule; return *this; }
  /// Clip the global gradient norm to `max_norm` before each step. Default: no clipping.
  Training& clip_grad_norm(double max_norm) { clip_grad_norm_ = max_norm; return *this; }
  /// Micro-batches per optimizer step; gradients are synchronised only on the last. Default: 1.
  Training& gradient_accumulation(std::int64_t micro_steps) { accumulation_ = micro_steps; return *this; }
  /// Forward precision. Default: fp32.
  Training& precision(Precision precision) { precision_ = precision; return *this; }
  /// Seed of weights, shuffling and dropout. Default: 0.
  Training& seed(std::int64_t seed) { seed_ = seed; return *this; }
  /// Evaluate every `n` steps (0: only at the end). Default: 0.
  Training& eval_every(std::int64_t n) { eval_every_ = n; return *this; }
  /// Progress line, metrics.jsonl and TensorBoard scalars every `n` steps. Default: 50.
  Training& log_every(std::int64_t n) { log_every_ = n; return *this; }
  /// Checkpoint every `n` steps (0: only on preemption and at the end). Default: 0.
  Training& checkpoint_every(std::int64_t n) { checkpoint_every_ = n; return *this; }
  /// Checkpoints kept. Default: 3.
  Training& keep_checkpoints(int n) { keep_checkpoints_ = n; return *this; }
  /// Report `metric` at evaluation besides the loss.
  Training& metric(metrics::Metric metric) { metrics_.push_back(metric); return *this; }
  /// Intra-op CPU threads per rank (0: SLURM_CPUS_PER_TASK, else the cores divided among local ranks). Default: 0.
  Training& threads(int n) { threads_ = n; return *this; }
  /// Called on every rank after each optimizer step with the number of steps completed (custom logging,
  /// fault injection in tests). Default: none.
  Training& on_step(std::function<void(std::int64_t)> callback) { on_step_ = std::move(callback); return *this; }
  /// Where checkpoints and metrics go (default: $HPCTRAIN_RUN_DIR, else ./hpctrain-run).
  Training& run_dir(std::filesystem::path directory) { run_dir_ = std::move(directory); return *this; }
  /// Declares a knob of this program: `--warmup-steps N` on the command line, checked at the login node
  /// before anything is queued, listed by `--help`, read in the worker with `knobs().get<T>(name)`.
  /// `.knob<std::int64_t>("warmup_steps", 100, "steps of linear warm-up", ht::non_negative())`
  template <KnobType T>
  Training& knob(std::string name, T default_value, std::string help, KnobCheck<T> check = {}) {
    knobs_.declare<T>(std::move(name), std::move(default_value), std::move(help), std::move(check));
    return *this;
  }
  /// This run's knob values (replaced by the worker with what the command line gave).
  Training& knob_values(Knobs values) { knobs_ = std::move(values); return *this; }

  /// Throws SpecError naming the first invalid field.
  void validate() const {
    detail::require(static_cast<bool>(model_), "training.model", "none", "a model factory is required: .model([] { return Net(); })");
    detail::require(static_cast<bool>(optimizer_), "training.optimizer", "none", "an optimizer factory is required");
    detail::require(static_cast<bool>(train_data_), "training.train_data", "none", "training data is required");
    detail::require(batch_size_.value > 0, "training.batch_size", batch_size_.value, "must be positive: .batch_size(hpctrain::per_rank(64))");
    detail::require(eval_batch_size_ > 0, "training.eval_batch_size", eval_batch_size_, "must be positive");
    detail::require(epochs_ || max_steps_, "training.epochs", "none", "set epochs, max_steps or both");
    if (epochs_) detail::require(*epochs_ > 0, "training.epochs", *epochs_, "must be positive");
    if (max_steps_) detail::require(*max_steps_ > 0, "training.max_steps", *max_steps_, "must be positive");
    if (lr_) detail::require(*lr_ > 0, "training.lr", *lr_, "must be positive");
    if (clip_grad_norm_) detail::require(*clip_grad_norm_ > 0, "training.clip_grad_norm", *clip_grad_norm_, "must be positive");
    detail::require(accumulation_ >= 1, "training.gradient_accumulation", accumulation_, "must be at least 1");
    detail::require(eval_every_ >= 0, "training.eval_every", eval_every_, "must not be negative");
    detail::require(log_every_ >= 1, "training.log_every", log_every_, "must be at least 1");
    detail::require(checkpoint_every_ >= 0, "training.checkpoint_every", checkpoint_every_, "must not be negative");
    detail::require(keep_checkpoints_ >= 1, "training.keep_checkpoints", keep_checkpoints_, "must be at least 1");
    detail::require(threads_ >= 0, "training.threads", threads_, "must not be negative");
    if (batch_size_.scope == BatchScope::global)
      detail::require(batch_size_.value % accumulation_ == 0, "training.batch_size", batch_size_.value,
                      fmt::format("a global batch must divide by gradient_accumulation ({})", accumulation_));
  }

  /// Examples per rank per micro-step for `world_size` ranks; throws SpecError if a global batch does not divide.
  std::int64_t micro_batch_per_rank(int world_size) const {
    if (batch_size_.scope == BatchScope::per_rank) {
      detail::require(batch_size_.value % accumulation_ == 0, "training.batch_size", batch_size_.value,
                      fmt::format("must divide by gradient_accumulation ({})", accumulation_));
      return batch_size_.value / accumulation_;
    }
    const std::int64_t parts = static_cast<std::int64_t>(world_size) * accumulation_;
    detail::require(batch_size_.value % parts == 0, "training.batch_size", batch_size_.value,
                    fmt::format("a global batch must divide by world size × gradient_accumulation ({})", parts));
    return batch_size_.value / parts;
  }

  // Accessors, read by the loop (and tests).
  detail::ModelInstance make_model() const { return model_(); }
  std::unique_ptr<torch::optim::Optimizer> make_optimizer(std::vector<torch::Tensor> parameters) const { return optimizer_(std::move(parameters)); }
  const detail::LossFunction& loss_function() const { return loss_; }
  const data::Source& train_source() const { return train_data_; }
  const data::Source& eval_source() const { return eval_data_; }
  BatchSize batch() const { return batch_size_; }
  std::int64_t eval_batch() const { return eval_batch_size_; }
  std::optional<std::int64_t> epoch_count() const { return epochs_; }
  std::optional<std::int64_t> step_limit() const { return max_steps_; }
  std::optional<double> base_lr() const { return lr_; }
  const LrSchedule& lr_schedule() const { return schedule_; }
  std::optional<double> max_grad_norm() const { return clip_grad_norm_; }
  std::int64_t accumulation_steps() const { return accumulation_; }
  Precision forward_precision() const { return precision_; }
  std::int64_t run_seed() const { return seed_; }
  std::int64_t eval_interval() const { return eval_every_; }
  std::int64_t log_interval() const { return log_every_; }
  std::int64_t checkpoint_interval() const { return checkpoint_every_; }
  int checkpoints_kept() const { return keep_checkpoints_; }
  bool reports(metrics::Metric metric) const { return std::find(metrics_.begin(), metrics_.end(), metric) != metrics_.end(); }
  int thread_count() const { return threads_; }
  const std::optional<std::filesystem::path>& run_directory() const { return run_dir_; }
  /// The program's knobs: declared with `knob`; in the worker, with this run's values (built-ins included).
  const Knobs& knobs() const { return knobs_; }
  const std::function<void(std::int64_t)>& step_callback() const { return on_step_; }

 private:
  std::function<detail::ModelInstance()> model_;
  OptimizerFactory optimizer_;
  detail::LossFunction loss_ = detail::wrap_loss(torch::nn::functional::cross_entropy);
  data::Source train_data_, eval_data_;
  BatchSize batch_size_;
  std::int64_t eval_batch_size_ = 1000;
  std::optional<std::int64_t> epochs_, max_steps_;
  std::optional<double> lr_, clip_grad_norm_;
  LrSchedule schedule_;
  std::int64_t accumulation_ = 1;
  Precision precision_ = Precision::fp32;
  std::int64_t seed_ = 0;
  std::int64_t eval_every_ = 0, log_every_ = 50, checkpoint_every_ = 0;
  int keep_checkpoints_ = 3;
  std::vector<metrics::Metric> metrics_;
  int threads_ = 0;
  std::optional<std::filesystem::path> run_dir_;
  Knobs knobs_;
  std::function<void(std::int64_t)> on_step_;
};

}  // namespace hpctrain
