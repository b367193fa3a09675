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

#include <fmt/format.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <hpctrain/compiled_runtime.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/job/plan_request.hpp>
#include <hpctrain/models/lora/lora_config.hpp>
#include <hpctrain/train/data/source.hpp>
#include <hpctrain/train/loggers/logger.hpp>
#include <hpctrain/train/loggers/wandb_settings.hpp>
#include <hpctrain/train/metrics.hpp>
#include <hpctrain/train/optim/optimizer_factory.hpp>
#include <hpctrain/train/optim/schedule.hpp>
#include <hpctrain/train/precision.hpp>
#include <hpctrain/train/run_context.hpp>
#include <hpctrain/train/step.hpp>
#include <hpctrain/train/strategies/sharding.hpp>
#if HPCTRAIN_RUNTIME_DEFINITIONS
// The defaults (Replicated, cross entropy) and the sharded strategies behind sharding(): where the runtime is
// compiled apart, a program's description names the strategy seam only (compiled_runtime.hpp).
#include <torch/nn/functional/loss.h>

#include <hpctrain/models/hf/pretrained_config.hpp>  // the LoRA targets' check at login
#include <hpctrain/train/loggers/loggers.hpp>
#include <hpctrain/train/strategies/replicated.hpp>
#include <hpctrain/train/strategies/sharded.hpp>
#include <hpctrain/train/strategies/strategy.hpp>
#endif

namespace hpctrain {

class DataParallelStrategy;  // train/strategies/strategy.hpp

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

/// A model made in the worker: the module (parameters, state, train/eval mode) and its forward.
struct ModelInstance {
  std::shared_ptr<torch::nn::Module> module;
  ForwardFunction forward;
};

namespace detail {

template <class Made>
ModelInstance make_model_instance(Made made) {
  if constexpr (requires { made.ptr(); }) {  // a TORCH_MODULE holder such as torch::nn::Sequential
    auto module = made.ptr();
    return {module, [module](torch::Tensor x) -> torch::Tensor { return module->forward(std::move(x)); }};
  } else if constexpr (requires {
                         made.get();
                         made.use_count();
                       }) {  // std::shared_ptr<SomeModule>
    auto module = made;
    return {module, [module](torch::Tensor x) -> torch::Tensor { return module->forward(std::move(x)); }};
  } else {
    static_assert(std::is_base_of_v<torch::nn::Module, Made>, "model(): the factory must return a torch::nn module");
    auto module = std::make_shared<Made>(std::move(made));
    return {module, [module](torch::Tensor x) -> torch::Tensor { return module->forward(std::move(x)); }};
  }
}

/// Calls a factory of the run in whichever form it takes: `(const RunContext&)`, `(const Knobs&)` or `()`.
template <class Factory>
decltype(auto) call_with_run(const Factory& factory, const RunContext& run) {
  if constexpr (std::is_invocable_v<const Factory&, const RunContext&>) return factory(run);
  else if constexpr (std::is_invocable_v<const Factory&, const Knobs&>) return factory(run.knobs);
  else {
    static_assert(std::is_invocable_v<const Factory&>,
                  "the factory takes (), (const hpctrain::Knobs&) or (const hpctrain::RunContext&)");
    return factory();
  }
}

/// A data factory: a data::Source itself, or a callable returning one (in any of call_with_run's forms).
template <class Factory>
std::function<data::Source(const RunContext&)> data_factory(Factory factory) {
  if constexpr (std::is_convertible_v<Factory, data::Source>)
    return [source = data::Source(std::move(factory))](const RunContext&) { return source; };
  else
    return
        [factory = std::move(factory)](const RunContext& run) -> data::Source { return call_with_run(factory, run); };
}

/// An optimizer returned by value, or already in a unique_ptr.
template <class Made>
std::unique_ptr<torch::optim::Optimizer> own_optimizer(Made made) {
  if constexpr (requires { made.release(); }) return std::unique_ptr<torch::optim::Optimizer>(std::move(made));
  else return std::make_unique<Made>(std::move(made));
}
}  // namespace detail

/// Makes the run's data-parallel strategy (in the worker, once per rank).
using StrategyFactory = std::function<std::unique_ptr<DataParallelStrategy>()>;

/// Splits `parameters` for weight decay as LM recipes do: matrices (2-D and up) decay; biases, norm
/// weights and other 1-D (or 0-D) tensors do not; a sharded strategy's flat piece as its parameter's shape says
/// (detail::make_optimizer_over_pieces). Returns {decayed, not decayed}.
inline std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> split_for_weight_decay(
    const NamedParameters& parameters) {
  std::vector<torch::Tensor> decayed, not_decayed;
  for (const auto& [name, tensor] : parameters) {
    const bool is_bias = name == "bias" || (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0);
    (detail::parameter_dimensions(tensor) >= 2 && !is_bias ? decayed : not_decayed).push_back(tensor);
  }
  return {std::move(decayed), std::move(not_decayed)};
}

/// Two parameter groups for an optimizer with options `options`: the decayed ones with `options` as given,
/// the biases, norms and other 1-D tensors with weight decay 0 (empty groups are left out). Usage:
///   auto options = torch::optim::AdamWOptions(3e-4).weight_decay(0.1);
///   return torch::optim::AdamW(hpctrain::weight_decay_groups(parameters, options), options);
template <class Options>
std::vector<torch::optim::OptimizerParamGroup> weight_decay_groups(const NamedParameters& parameters,
                                                                   const Options& options) {
  auto [decayed, not_decayed] = split_for_weight_decay(parameters);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decayed.empty()) groups.emplace_back(std::move(decayed), std::make_unique<Options>(options));
  if (!not_decayed.empty()) {
    auto without = std::make_unique<Options>(options);
    without->weight_decay(0.0);
    groups.emplace_back(std::move(not_decayed), std::move(without));
  }
  return groups;
}

/// Everything about a training except the job it runs in. Setters and readers share a name, as in
/// LibTorch's options: `epochs(6)` sets, `epochs()` reads.
class Training;
/// `--plan` for a Training: prints what each rank will hold for `knobs` at the request's geometry and says
/// whether it fits (lm::plan_memory_of_run, which lm::causal_lm_training installs).
using TrainingPlanner = std::function<PlanVerdict(const Training&, const Knobs&, const PlanRequest&, std::ostream&)>;

namespace detail {
/// SpecError `[hpctrain.spec.training.float8]` where float8 projections (Training::float8) are asked for with a
/// precision other than bf16 (they replace bf16 autocast's products) or with LoRA (its frozen base keeps bf16
/// products: float8 trains what changes). The login command asks it of the stated precision, the worker of the
/// resolved one (train/float8_setup.hpp, which refuses the device too).
inline void refuse_float8_setting(bool float8, Precision precision, bool lora) {
  if (!float8) return;
  require(precision == Precision::bf16, errors::spec_training_float8,
          fmt::format("on, with --precision {}", to_string(precision)),
          "float8 projections replace bf16 autocast's products; they run under --precision bf16");
  require(!lora, errors::spec_training_float8, "on, with LoRA",
          "LoRA's base is frozen and keeps its bf16 products; float8 is for a full fine-tuning's projections");
}
}  // namespace detail

class Training {
 public:
  using OptimizerFactory = hpctrain::OptimizerFactory;

  /// The defaults: Replicated, cross entropy, the plain step. Out of line where the runtime is compiled apart
  /// (compiled_runtime.hpp): the defaults reach the whole data-parallel machinery.
  HPCTRAIN_RUNTIME_INLINE Training();
  /// Copies, moves and the destructor: out of line too, so that a program's unit does not generate the code that
  /// copies and destroys every member (about forty std::function slots).
  HPCTRAIN_RUNTIME_INLINE Training(const Training&);
  HPCTRAIN_RUNTIME_INLINE Training(Training&&) noexcept;
  HPCTRAIN_RUNTIME_INLINE Training& operator=(const Training&);
  HPCTRAIN_RUNTIME_INLINE Training& operator=(Training&&) noexcept;
  HPCTRAIN_RUNTIME_INLINE ~Training();

  /// A factory returning the model: a module, a TORCH_MODULE holder or a shared_ptr to a module. It takes
  /// nothing, the run's knobs (`const hpctrain::Knobs&`) or the whole `const hpctrain::RunContext&`. Called
  /// once per rank after seeding, so every rank starts from the same weights (rank 0's are broadcast too).
  /// A factory that knows a directory of pretrained files (`pretrained_directory(knobs)`, as
  /// lm::from_pretrained does) tells the rest of the run (`RunContext::pretrained_dir`).
  template <class Factory>
  Training& model(Factory factory) {
    if constexpr (requires(const Factory& f, const RunContext& run) {
                    { f.model_instance(run) } -> std::same_as<ModelInstance>;
                  })
      model_ = [factory](const RunContext& run) { return factory.model_instance(run); };  // lm::from_pretrained
    else
      model_ = [factory](const RunContext& run) {
        return detail::make_model_instance(detail::call_with_run(factory, run));
      };
    pretrained_dir_ = nullptr;
    add_login_check_of(factory, model_check_);
    if constexpr (requires(const Factory& f, const Knobs& k) {
                    { f.pretrained_directory(k) } -> std::convertible_to<std::filesystem::path>;
                  })
      pretrained_dir_ = [factory](const Knobs& knobs) {
        return std::filesystem::path(factory.pretrained_directory(knobs));
      };
    return *this;
  }
  /// The optimizer factory, returning any torch::optim optimizer by value (or in a unique_ptr). Either of
  /// `(std::vector<torch::Tensor> parameters)` — `[](auto parameters) { return torch::optim::AdamW(parameters, ...); }`
  /// — or of `(const hpctrain::NamedParameters&)`, to build parameter groups by name (weight_decay_groups).
  /// Its learning rates are the bases the schedule multiplies (unless `lr()` or `--lr` overrides them). A
  /// second parameter `const hpctrain::Knobs&` gives it the run's knobs.
  template <class Factory>
  Training& optimizer(Factory factory) {
    optimizer_ = [factory](const NamedParameters& named,
                           const Knobs& knobs) -> std::unique_ptr<torch::optim::Optimizer> {
      const auto tensors = [&] {
        std::vector<torch::Tensor> list;
        list.reserve(named.size());
        for (const auto& [name, tensor] : named) list.push_back(tensor);
        return list;
      };
      if constexpr (std::is_invocable_v<const Factory&, std::vector<torch::Tensor>>) {
        return detail::own_optimizer(factory(tensors()));
      } else if constexpr (std::is_invocable_v<const Factory&, std::vector<torch::Tensor>, const Knobs&>) {
        return detail::own_optimizer(factory(tensors(), knobs));
      } else if constexpr (std::is_invocable_v<const Factory&, const NamedParameters&, const Knobs&>) {
        return detail::own_optimizer(factory(named, knobs));
      } else {
        static_assert(std::is_invocable_v<const Factory&, const NamedParameters&>,
                      "optimizer(): the factory takes std::vector<torch::Tensor> or const hpctrain::NamedParameters&, "
                      "and optionally const hpctrain::Knobs& after it");
        return detail::own_optimizer(factory(named));
      }
    };
    return *this;
  }
  /// Train LoRA adapters instead of the whole model (models/lora/lora.hpp): applied to the model right after its
  /// factory, every other parameter frozen; only the adapters reach the optimizer, the gradients and the
  /// strategy's buckets and shards. Default: none (every parameter trains). Where the description declares the
  /// LoRA knobs (lm::causal_lm_training: --lora-r and friends), `config` becomes their defaults instead: `--help`
  /// shows it, and the command line overrides it (`--lora-r 0` trains every parameter).
  Training& lora(models::LoraConfig config) {
    config.validate();
    if (knobs_.find("lora_r") != nullptr) {
      knobs_.set_default<std::int64_t>("lora_r", config.r);
      knobs_.set_default<double>("lora_alpha", config.alpha);
      knobs_.set_default<double>("lora_dropout", config.dropout);
      knobs_.set_default<std::string>("lora_targets", fmt::format("{}", fmt::join(config.targets, ",")));
      knobs_.set_default<bool>("lora_rslora", config.use_rslora);
      return *this;
    }
    lora_from_knobs_ = [config](const Knobs&) { return std::optional<models::LoraConfig>(config); };
    return *this;
  }
  /// LoRA when the knobs ask for it (lm::causal_lm_training declares --lora-r and friends): nothing means none.
  Training& lora(std::function<std::optional<models::LoraConfig>(const Knobs&)> from_knobs) {
    lora_from_knobs_ = std::move(from_knobs);
    return *this;
  }
  /// The data-parallel strategy: a callable returning a std::unique_ptr to a DataParallelStrategy, made
  /// on every rank (`hpctrain::replicated`, or a sharded one). Default: Replicated.
  template <class Factory>
  Training& strategy(Factory factory) {
    strategy_ = [factory]() -> std::unique_ptr<DataParallelStrategy> { return factory(); };
    sharding_.reset();
    own_strategy_ = true;
    return *this;
  }
  /// Shortcut for the strategy of a ZeRO stage: `.sharding(hpctrain::zero2)` is
  /// `.strategy(hpctrain::sharded(hpctrain::zero2))`; `hpctrain::no_sharding` is Replicated. The built-in
  /// knob `--sharding none|zero1|zero2|zero3|hsdp` overrides it (docs/distributed.md: when to choose which).
  HPCTRAIN_RUNTIME_INLINE Training& sharding(ZeroStage stage);
  /// Under `hpctrain::hsdp`: ranks per shard group (consecutive ranks; the groups replicate each other); it must
  /// divide the world size (checked at setup). The built-in knob `--hsdp-group-size N` overrides it.
  /// Default: 0, the ranks of a node.
  HPCTRAIN_RUNTIME_INLINE Training& hsdp_group_size(int ranks);
  /// The loss `(output, target) -> scalar`. Default: cross entropy.
  template <class Loss>
  Training& loss(Loss function) {
    loss_ = detail::wrap_loss(function);
    return *this;
  }
  /// What one micro-step computes: `(StepContext&, const data::Batch&) -> mean loss`. Default: default_step,
  /// `loss(forward(inputs), targets)`.
  Training& step(StepFunction function) {
    step_ = std::move(function);
    return *this;
  }
  /// What each micro-batch's mean loss is a mean over (step.hpp's LossCountFunction): the Trainer then weighs the
  /// micro-batches by their counts over the global batch's. lm::causal_lm_training and lm::masked_lm_training
  /// count the targets that take a loss. Default: none, every micro-batch's mean weighs the same.
  Training& loss_count(LossCountFunction function) {
    loss_count_ = std::move(function);
    return *this;
  }
  /// What one evaluation batch computes: `(StepContext&, const data::Batch&) -> EvalOutput`. Default:
  /// default_eval_step, the loss weighted by rows, the output for the metrics.
  Training& eval_step(EvalStepFunction function) {
    eval_step_ = std::move(function);
    return *this;
  }
  /// Training data (required): a data::Source, or a factory returning one that takes nothing, the knobs or
  /// the `const RunContext&` (the prepared files, the pretrained directory). A factory with a
  /// `check_at_login(const Knobs&)` member is also checked on the login node (lm::sft_jsonl validates its file); one
  /// that returns std::optional<DataSizeAtLogin> has the batch checked against that size there
  /// (check_training_at_login). A factory with a `prepare_in_job(const Knobs&, pretrained directory, prepared
  /// directory)` member has its part in the job's preparation step (lm::sft_jsonl tokenizes its file there once): `run`
  /// adds the step.
  template <class Factory>
  Training& train_data(Factory factory) {
    add_login_check_of(factory, train_check_);
    add_preparation_of(factory, train_preparation_);
    train_data_ = detail::data_factory(std::move(factory));
    return *this;
  }
  /// Evaluation data, in the same forms; without it there is no evaluation.
  template <class Factory>
  Training& eval_data(Factory factory) {
    add_login_check_of(factory, eval_check_);
    add_preparation_of(factory, eval_preparation_);
    eval_data_ = detail::data_factory(std::move(factory));
    return *this;
  }
  /// Batch size per optimizer step, `per_rank(n)` or `global(n)` (required).
  Training& batch_size(BatchSize size) {
    batch_size_ = size;
    return *this;
  }
  /// Batch size for evaluation, per rank. Default: 1000.
  Training& eval_batch_size(std::int64_t n) {
    eval_batch_size_ = n;
    return *this;
  }
  /// Number of passes over the training data. At least one of epochs and max_steps is required; with both,
  /// the run stops at whichever comes first.
  Training& epochs(std::int64_t n) {
    epochs_ = n;
    return *this;
  }
  /// Number of optimizer steps.
  Training& max_steps(std::int64_t n) {
    max_steps_ = n;
    return *this;
  }
  /// Base learning rate, replacing the optimizer's own (every group's). Default: the optimizer's.
  Training& lr(double rate) {
    lr_ = rate;
    return *this;
  }
  /// Learning-rate schedule. Default: LrSchedule::constant().
  Training& schedule(LrSchedule schedule) {
    schedule_ = schedule;
    schedule_from_knobs_ = nullptr;
    return *this;
  }
  /// A schedule made from the run's knobs: `[](const Knobs& k) { return
  /// LrSchedule::warmup_cosine(k.get<std::int64_t>("warmup_steps"), 0.1); }`.
  Training& schedule(std::function<LrSchedule(const Knobs&)> factory) {
    schedule_from_knobs_ = std::move(factory);
    return *this;
  }
  /// Clip the global gradient norm to `max_norm` before each step (train records then carry grad_norm).
  /// Default: no clipping.
  Training& clip_grad_norm(double max_norm) {
    clip_grad_norm_ = max_norm;
    return *this;
  }
  /// Micro-batches per optimizer step; gradients are synchronised only on the last. Default: 1.
  Training& gradient_accumulation(std::int64_t micro_steps) {
    accumulation_ = micro_steps;
    return *this;
  }
  /// Forward precision. Default: fp32.
  Training& precision(Precision precision) {
    precision_ = precision;
    return *this;
  }
  /// The dtype zero2, zero3 and hsdp reduce gradients in (FSDP2's reduce_dtype; train/precision.hpp's ReduceDtype):
  /// bf16 halves the bytes of the reduce-scatters and of hsdp's all-reduce across replicas. The other strategies
  /// all-reduce in fp32: the worker refuses bf16 for them, naming the strategy. Default: fp32 (torchtitan's).
  Training& reduce_dtype(ReduceDtype dtype) {
    reduce_dtype_ = dtype;
    return *this;
  }
  /// Seed of weights, shuffling and dropout. Default: 0.
  Training& seed(std::int64_t seed) {
    seed_ = seed;
    return *this;
  }
  /// Also evaluate before the first step of a fresh run (not after a resume): the model as it starts, logged at
  /// step 0 and kept in TrainResult::eval_loss_at_start (fine-tuning's "loss before"). Default: off.
  Training& evaluate_at_start(bool on) {
    evaluate_at_start_ = on;
    return *this;
  }
  /// Evaluate every `n` steps (0: only at the end). Default: 0.
  Training& eval_every(std::int64_t n) {
    eval_every_ = n;
    return *this;
  }
  /// Evaluate on the first `n` examples of the evaluation data only (0: all of them), like Lightning's
  /// limit_val_batches or transformers' max_eval_samples: a quick look at a long eval set. Default: 0.
  Training& max_eval_examples(std::int64_t n) {
    max_eval_examples_ = n;
    return *this;
  }
  /// A train record (progress line, metrics.jsonl, TensorBoard, own loggers) every `n` steps. The running
  /// loss stays on the device in between. Default: 50.
  Training& log_every(std::int64_t n) {
    log_every_ = n;
    return *this;
  }
  /// Checkpoint every `n` steps (0: only on preemption and at the end). Default: 0.
  Training& checkpoint_every(std::int64_t n) {
    checkpoint_every_ = n;
    return *this;
  }
  /// Checkpoints kept. Default: 3.
  Training& keep_checkpoints(int n) {
    keep_checkpoints_ = n;
    return *this;
  }
  /// Write checkpoints in the background (train/checkpoint/async_checkpoint.hpp): the step boundary only serialises
  /// each rank's archive into host memory; sealing and writing overlap the next steps, and the checkpoint is committed
  /// at a later step boundary. Default: false.
  Training& checkpoint_async(bool on) {
    checkpoint_async_ = on;
    return *this;
  }
  /// Ask the ranks whether a preemption signal arrived every `n` steps: one all-reduce of two numbers that runs
  /// during the next steps and is read `n` steps later (no wait on the step's path); all ranks stop at the same step,
  /// at most steps_until_stop() after the signal. It also tells when an asynchronous save's writers are all done.
  /// Default: 1.
  Training& preemption_check_every(std::int64_t n) {
    preemption_check_every_ = n;
    return *this;
  }
  /// Report `metric` at evaluation besides the loss (metrics::accuracy, metrics::top_k_accuracy(5),
  /// metrics::perplexity, or your own metrics::Metric).
  Training& metric(metrics::Metric metric) {
    metrics_.push_back(std::move(metric));
    return *this;
  }
  /// Adds a logger: a callable returning a std::unique_ptr to a Logger, made on rank 0 when the run starts
  /// (besides the progress lines, metrics.jsonl and TensorBoard).
  template <class Factory>
  Training& logger(Factory factory) {
    loggers_.push_back([factory]() -> std::unique_ptr<Logger> { return factory(); });
    return *this;
  }
  /// Logs the run to Weights & Biases as an offline run under the run directory, for `wandb sync` from the login
  /// node (`--wandb-sync`): `.wandb("fashion")` or `.wandb(ht::Wandb("fashion").entity("team").tags({"baseline"}))`.
  /// The knob `--wandb [PROJECT]` turns it on, changes the project, or (`--wandb off`) turns it off. Default: off.
  Training& wandb(Wandb settings) {
    wandb_ = std::move(settings);
    return *this;
  }
  /// No W&B run (what `--wandb off` sets).
  Training& no_wandb() {
    wandb_.reset();
    return *this;
  }
  /// FLOPs of one training example (forward and backward); with peak_flops, train records carry mfu.
  Training& flops_per_example(double flops) {
    flops_per_example_ = flops;
    return *this;
  }
  /// Peak FLOP/s of one rank's device, as you state it (e.g. 989e12 for an H100's dense bf16).
  Training& peak_flops(double flops) {
    peak_flops_ = flops;
    return *this;
  }
  /// At one rank, a sharded stage (sharding(), --sharding) runs its own strategy instead of training as Replicated
  /// (ShardedAtOneRank, train/strategies/one_rank.hpp): to reproduce a sharded run's behaviour in one process, or to
  /// measure ZeRO-3's own cost on one GPU. The knob --shard-at-one-rank sets it. Default: off.
  Training& shard_at_one_rank(bool on) {
    shard_at_one_rank_ = on;
    return *this;
  }
  /// Every rank prints `rank <r> parameters_crc32c=<digest>` at the end (reads the whole model; tests and
  /// reproducibility checks). The knob --report-digest sets it. Default: off.
  Training& report_digest(bool on) {
    report_digest_ = on;
    return *this;
  }
  /// Intra-op CPU threads per rank (0: SLURM_CPUS_PER_TASK, else the cores divided among local ranks). Default: 0.
  Training& threads(int n) {
    threads_ = n;
    return *this;
  }
  /// On a CPU device, keep freed host memory for the next step instead of returning it to the kernel
  /// (train/host_memory.hpp): every step frees and allocates the same big tensors, and glibc hands each block
  /// over 32 MB back (munmap), so the next step page-faults it in again, zeroed. A rank's resident memory then
  /// stays at its peak, as under a caching allocator. Default: on; no effect on GPUs or without glibc.
  Training& keep_freed_memory(bool on) {
    keep_freed_memory_ = on;
    return *this;
  }
  /// On a CUDA device, the prefetch thread copies each batch into page-locked (pinned) host memory, and the step
  /// copies it to the GPU without waiting (non_blocking): the copy overlaps the previous step's kernels instead of
  /// stalling the stream, as PyTorch's DataLoader(pin_memory=True) does. Default: off until the GPU suite's
  /// switches.pinned_batches row has measured it (docs/gpu.md); no effect on a CPU device.
  Training& pin_memory(bool on) {
    pin_memory_ = on;
    return *this;
  }
  /// On a CUDA device at one rank, the whole step (forward, backward, clipping, the optimizer) is captured once in
  /// a CUDA graph and replayed every step: one launch instead of a step's ~1,000, for batches of fixed shapes (a
  /// batch of other shapes runs uncaptured). Needs FusedAdamW (ht::adamw's default) and a step that reads no
  /// tensor on the host (train/step_graph.hpp). `--cuda-graphs`. Default: off.
  Training& cuda_graphs(bool on) {
    cuda_graphs_ = on;
    return *this;
  }
  /// The blocks' projections (q, k, v, o, gate, up, down: models::projection) of a full fine-tuning in float8 with
  /// rowwise scales, the head, the embedding and the norms in bf16: torchao's rowwise recipe, at::_scaled_mm
  /// (models/kernels/float8_projections.hpp). Refused before the run unless the device is CUDA with compute
  /// capability 8.9 or above, the precision bf16, and no LoRA (its base is frozen, its products stay bf16).
  /// `--float8`. Default: off.
  Training& float8(bool on) {
    float8_ = on;
    return *this;
  }
  /// Called on every rank after each optimizer step with the number of steps completed (fault injection in
  /// tests). Default: none.
  Training& on_step(std::function<void(std::int64_t)> callback) {
    on_step_ = std::move(callback);
    return *this;
  }
  /// Adds a hook run at the end of a finished run, after the final evaluation, with the whole model (every
  /// strategy gathers it first): `lm::sample_at_end(...)`, or your own `(const hpctrain::FinishContext&)`; a hook
  /// made with FinishHook::unit_by_unit visits the model one unit at a time instead (`lm::hf_export()`). Hooks
  /// run on every rank, in the order added.
  Training& at_end(FinishHook hook) {
    finish_hooks_.push_back(std::move(hook));
    return *this;
  }
  /// What `--plan` prints: the memory each rank will hold and whether it fits (lm::causal_lm_training installs
  /// lm::plan_memory_of_run). Default: none (`--plan` says the program has no plan).
  Training& memory_plan(TrainingPlanner planner) {
    planner_ = std::move(planner);
    return *this;
  }
  /// Adds a hook called on every rank with the made model and the run's knobs, before LoRA, the move to the
  /// device and the strategy: a switch of the model that a knob sets. Hooks run in the order added.
  Training& on_model(ModelHook hook) {
    model_hooks_.push_back(std::move(hook));
    return *this;
  }
  /// Adds a check that `hpctrain::run` makes on the login node once the knobs are parsed, before anything is
  /// written or queued: throw SpecError naming the field and the value.
  Training& login_check(LoginCheck check) {
    login_checks_.push_back(std::move(check));
    return *this;
  }
  /// Where checkpoints and metrics go (default: $HPCTRAIN_RUN_DIR, else ./hpctrain-run).
  Training& run_dir(std::filesystem::path directory) {
    run_dir_ = std::move(directory);
    return *this;
  }
  /// Declares a knob of this program: `--warmup-steps N` on the command line, checked at the login node
  /// before anything is queued, listed by `--help`, read in the worker with `knobs().get<T>(name)`.
  /// `.knob<std::int64_t>("warmup_steps", 100, "steps of linear warm-up", ht::non_negative())`
  template <KnobType T>
  Training& knob(std::string name, T default_value, std::string help, KnobCheck<T> check = {}) {
    knobs_.declare<T>(std::move(name), std::move(default_value), std::move(help), std::move(check));
    return *this;
  }
  /// Lets knob `name` be given without a value, standing for `value`; `placeholder` names its values in `--help`:
  /// `.knob_bare_value("activation_checkpointing", "full", "[none|selective|full]")`.
  Training& knob_bare_value(std::string_view name, std::string value, std::string placeholder) {
    knobs_.allow_bare(name, std::move(value), std::move(placeholder));
    return *this;
  }
  /// This run's knob values (replaced by the worker with what the command line gave).
  Training& knob_values(Knobs values) {
    knobs_ = std::move(values);
    return *this;
  }

  /// Throws SpecError naming the first invalid field.
  void validate() const {
    detail::require(static_cast<bool>(model_), "training.model", "none",
                    "a model factory is required: .model([] { return Net(); })");
    detail::require(static_cast<bool>(optimizer_), "training.optimizer", "none", "an optimizer factory is required");
    detail::require(static_cast<bool>(train_data_), "training.train_data", "none", "training data is required");
    detail::require(static_cast<bool>(step_), "training.step", "none", "the step function must not be empty");
    detail::require(static_cast<bool>(eval_step_), "training.eval_step", "none",
                    "the evaluation step function must not be empty");
    detail::require(static_cast<bool>(strategy_), "training.strategy", "none",
                    "the strategy factory must not be empty");
    detail::require(batch_size_.value > 0, "training.batch_size", batch_size_.value,
                    "must be positive: .batch_size(hpctrain::per_rank(64))");
    detail::require(eval_batch_size_ > 0, "training.eval_batch_size", eval_batch_size_, "must be positive");
    detail::require(epochs_ || max_steps_, "training.epochs", "none", "set epochs, max_steps or both");
    if (epochs_) detail::require(*epochs_ > 0, "training.epochs", *epochs_, "must be positive");
    if (max_steps_) detail::require(*max_steps_ > 0, "training.max_steps", *max_steps_, "must be positive");
    if (lr_) detail::require(*lr_ > 0, "training.lr", *lr_, "must be positive");
    if (clip_grad_norm_)
      detail::require(*clip_grad_norm_ > 0, "training.clip_grad_norm", *clip_grad_norm_, "must be positive");
    detail::require(accumulation_ >= 1, "training.gradient_accumulation", accumulation_, "must be at least 1");
    detail::require(eval_every_ >= 0, "training.eval_every", eval_every_, "must not be negative");
    detail::require(max_eval_examples_ >= 0, "training.max_eval_examples", max_eval_examples_, "must not be negative");
    detail::require(log_every_ >= 1, "training.log_every", log_every_, "must be at least 1");
    detail::require(checkpoint_every_ >= 0, "training.checkpoint_every", checkpoint_every_, "must not be negative");
    detail::require(keep_checkpoints_ >= 1, "training.keep_checkpoints", keep_checkpoints_, "must be at least 1");
    detail::require(preemption_check_every_ >= 1, "training.preemption_check_every", preemption_check_every_,
                    "must be at least 1");
    if (flops_per_example_)
      detail::require(*flops_per_example_ > 0, "training.flops_per_example", *flops_per_example_, "must be positive");
    if (peak_flops_) detail::require(*peak_flops_ > 0, "training.peak_flops", *peak_flops_, "must be positive");
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

  // Readers, named as the setters (read by the Trainer, the worker and tests).
  /// The model, made for `run`.
  ModelInstance make_model(const RunContext& run) const { return model_(run); }
  /// The model, made for rank 0 of 1 with this description's knobs (tests; outside a worker).
  ModelInstance make_model() const {
    return model_(RunContext{knobs_, 0, 1, {}, std::nullopt, std::nullopt, std::nullopt});
  }
  /// Where the model factory's pretrained files are for `knobs`, when it says (lm::from_pretrained).
  std::optional<std::filesystem::path> pretrained_dir(const Knobs& knobs) const {
    if (!pretrained_dir_) return std::nullopt;
    return pretrained_dir_(knobs);
  }
  std::unique_ptr<torch::optim::Optimizer> make_optimizer(const NamedParameters& parameters) const {
    return optimizer_(parameters, knobs_);
  }
  /// The optimizer over unnamed tensors (named "0", "1", ... for the factory).
  std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<torch::Tensor>& parameters) const {
    NamedParameters named;
    for (std::size_t i = 0; i < parameters.size(); ++i) named.emplace_back(std::to_string(i), parameters[i]);
    return optimizer_(named, knobs_);
  }
  /// The optimizer factory bound to this run's knobs, as the strategies take it.
  OptimizerFactory optimizer_factory() const {
    return [factory = optimizer_, knobs = knobs_](const NamedParameters& named) { return factory(named, knobs); };
  }
  HPCTRAIN_RUNTIME_INLINE std::unique_ptr<DataParallelStrategy> make_strategy() const;
  /// The stage chosen with sharding(), or nothing (Replicated by default, or an own strategy()).
  std::optional<ZeroStage> sharding() const { return sharding_; }
  /// Ranks per shard group under hsdp (0: the ranks of a node).
  int hsdp_group_size() const { return hsdp_group_size_; }
  const LossFunction& loss() const { return loss_; }
  const StepFunction& step() const { return step_; }
  const EvalStepFunction& eval_step() const { return eval_step_; }
  const LossCountFunction& loss_count() const { return loss_count_; }
  /// The training data for `run` (not loaded yet).
  data::Source train_data(const RunContext& run) const { return train_data_(run); }
  /// Whether the description has evaluation data.
  bool has_eval_data() const { return static_cast<bool>(eval_data_); }
  /// The evaluation data for `run` (not loaded yet); has_eval_data() first.
  data::Source eval_data(const RunContext& run) const { return eval_data_(run); }
  BatchSize batch_size() const { return batch_size_; }
  std::int64_t eval_batch_size() const { return eval_batch_size_; }
  std::optional<std::int64_t> epochs() const { return epochs_; }
  std::optional<std::int64_t> max_steps() const { return max_steps_; }
  std::optional<double> lr() const { return lr_; }
  const LrSchedule& schedule() const { return schedule_; }
  /// The schedule's factory when it depends on knobs (with_knobs applies it).
  const std::function<LrSchedule(const Knobs&)>& schedule_from_knobs() const { return schedule_from_knobs_; }
  std::optional<double> clip_grad_norm() const { return clip_grad_norm_; }
  std::int64_t gradient_accumulation() const { return accumulation_; }
  Precision precision() const { return precision_; }
  ReduceDtype reduce_dtype() const { return reduce_dtype_; }
  std::int64_t seed() const { return seed_; }
  std::int64_t eval_every() const { return eval_every_; }
  std::int64_t max_eval_examples() const { return max_eval_examples_; }
  bool evaluate_at_start() const { return evaluate_at_start_; }
  std::int64_t log_every() const { return log_every_; }
  std::int64_t checkpoint_every() const { return checkpoint_every_; }
  int keep_checkpoints() const { return keep_checkpoints_; }
  bool checkpoint_async() const { return checkpoint_async_; }
  std::int64_t preemption_check_every() const { return preemption_check_every_; }
  /// The most steps a rank trains after the signal before every rank stops: the next vote carries it and is read
  /// at the vote after (dist::LaggedSum), at most two cadences.
  std::int64_t steps_until_stop() const { return 2 * preemption_check_every_; }
  const std::vector<metrics::Metric>& metrics() const { return metrics_; }
  bool reports(const metrics::Metric& metric) const {
    return std::find(metrics_.begin(), metrics_.end(), metric) != metrics_.end();
  }
  const std::vector<LoggerFactory>& loggers() const { return loggers_; }
  /// Where the run goes on W&B, when it is logged there.
  const std::optional<Wandb>& wandb() const { return wandb_; }
  std::optional<double> flops_per_example() const { return flops_per_example_; }
  std::optional<double> peak_flops() const { return peak_flops_; }
  bool report_digest() const { return report_digest_; }
  bool shard_at_one_rank() const { return shard_at_one_rank_; }
  int threads() const { return threads_; }
  bool keep_freed_memory() const { return keep_freed_memory_; }
  bool pin_memory() const { return pin_memory_; }
  bool cuda_graphs() const { return cuda_graphs_; }
  bool float8() const { return float8_; }
  const std::optional<std::filesystem::path>& run_dir() const { return run_dir_; }
  /// The program's knobs: declared with `knob`; in the worker, with this run's values (built-ins included).
  const Knobs& knobs() const { return knobs_; }
  const std::function<void(std::int64_t)>& on_step() const { return on_step_; }
  const std::vector<FinishHook>& finish_hooks() const { return finish_hooks_; }
  const std::vector<ModelHook>& model_hooks() const { return model_hooks_; }
  const TrainingPlanner& memory_planner() const { return planner_; }
  /// The LoRA configuration for `knobs`, when the run trains adapters.
  std::optional<models::LoraConfig> lora(const Knobs& knobs) const {
    if (!lora_from_knobs_) return std::nullopt;
    return lora_from_knobs_(knobs);
  }
  /// Whether a data factory has a part in the job's preparation step (prepare_data).
  bool prepares_data() const { return static_cast<bool>(train_preparation_) || static_cast<bool>(eval_preparation_); }
  /// The data factories' part of the job's preparation step, with this run's knobs, writing below `prepared_dir`.
  void prepare_data(const Knobs& knobs, const std::filesystem::path& prepared_dir) const {
    if (train_preparation_) train_preparation_(knobs, pretrained_dir(knobs), prepared_dir);
    if (eval_preparation_) eval_preparation_(knobs, pretrained_dir(knobs), prepared_dir);
  }
  /// Runs every login check (those of the model and data factories, then login_check's) with `knobs`; returns the
  /// training data's size when its factory read it there (check_training_at_login checks the batch against it).
  /// `waits_for_jobs`: the job starts after others (--after), so a pretrained directory that does not exist yet is
  /// theirs to write (sft's export feeding dpo): what reads it (the model's config, the LoRA targets, the data's
  /// tokenizer) is checked when the job starts, as stderr says; the rest is checked now.
  std::optional<DataSizeAtLogin> check_at_login(const Knobs& knobs, bool waits_for_jobs = false) const {
    auto pretrained = pretrained_dir(knobs);
    const bool pending = waits_for_jobs && pretrained && !std::filesystem::exists(*pretrained);
    if (pending) {
      fmt::print(stderr,
                 "hpctrain: the pretrained directory {} does not exist yet: the job waits for another, so its model, "
                 "LoRA targets and tokenizer are checked when it starts\n",
                 pretrained->string());
      pretrained.reset();
    } else {
      if (model_check_) model_check_(knobs);
      check_lora_targets_at_login(knobs);
    }
    std::optional<DataSizeAtLogin> train_size;
    if (train_check_) train_size = train_check_(knobs, pretrained);
    if (eval_check_) eval_check_(knobs, pretrained);
    for (const auto& check : login_checks_) check(knobs);
    check_reduce_dtype_at_login(knobs);
    check_float8_at_login(knobs);
    return train_size;
  }

 private:
  /// --float8 with a stated precision other than bf16, or with LoRA, fails here, not on the workers after the queue
  /// (whether the GPU has float8 products the workers tell: train/float8_setup.hpp). Under --precision auto the
  /// precision is the workers' device's too.
  void check_float8_at_login(const Knobs& knobs) const {
    const bool on = knobs.get_if_given<bool>("float8").value_or(float8_);
    auto precision = precision_;
    if (const auto given = knobs.get_if_given<std::string>("precision")) precision = *precision_from_name(*given);
    if (precision == Precision::automatic) precision = Precision::bf16;
    detail::refuse_float8_setting(on, precision, lora(knobs).has_value());
  }
  /// A bf16 reduction asked of a stage that all-reduces in fp32 (none, zero1) fails here, not on the workers after
  /// the queue; an own strategy() refuses it itself (require_fp32_reduce) when it cannot.
  void check_reduce_dtype_at_login(const Knobs& knobs) const {
    const auto dtype = knobs.get_if_given<std::string>("reduce_dtype");
    if (!dtype || reduce_dtype_from_name(*dtype) != ReduceDtype::bf16) return;
    auto stage = sharding_;
    if (const auto given = knobs.get_if_given<std::string>("sharding")) stage = zero_stage_from_name(*given);
    if (!stage && own_strategy_) return;
    const auto named = stage.value_or(ZeroStage::none);
    if (named == ZeroStage::none || named == ZeroStage::zero1)
      require_fp32_reduce(ReduceDtype::bf16, named == ZeroStage::none ? "replicated (--sharding none)" : "zero1");
  }
  /// LoRA targets against the layers of the pretrained model's family (from its config.json, no weights): a
  /// name that matches no layer would fail every rank after the queue.
  HPCTRAIN_RUNTIME_INLINE void check_lora_targets_at_login(const Knobs& knobs) const;

  template <class Factory>
  static void add_login_check_of(const Factory& factory, LoginCheck& slot) {
    slot = nullptr;
    if constexpr (requires(const Factory& f, const Knobs& k) { f.check_at_login(k); })
      slot = [factory](const Knobs& knobs) { factory.check_at_login(knobs); };
  }
  /// A data factory's login check, told the pretrained model's directory when it takes one (the tokenizer's); it
  /// may return the size it read (std::optional<DataSizeAtLogin>).
  using DataLoginCheck =
      std::function<std::optional<DataSizeAtLogin>(const Knobs&, const std::optional<std::filesystem::path>&)>;
  template <class Result>
  static std::optional<DataSizeAtLogin> size_read(Result&& result) {
    if constexpr (std::is_convertible_v<Result, std::optional<DataSizeAtLogin>>) return std::forward<Result>(result);
    else return std::nullopt;
  }
  template <class Factory>
  static void add_login_check_of(const Factory& factory, DataLoginCheck& slot) {
    slot = nullptr;
    if constexpr (requires(const Factory& f, const Knobs& k, const std::optional<std::filesystem::path>& d) {
                    f.check_at_login(k, d);
                  })
      slot = [factory](const Knobs& knobs, const std::optional<std::filesystem::path>& directory) {
        if constexpr (std::is_void_v<decltype(factory.check_at_login(knobs, directory))>) {
          factory.check_at_login(knobs, directory);
          return std::optional<DataSizeAtLogin>();
        } else {
          return size_read(factory.check_at_login(knobs, directory));
        }
      };
    else if constexpr (requires(const Factory& f, const Knobs& k) { f.check_at_login(k); })
      slot = [factory](const Knobs& knobs, const std::optional<std::filesystem::path>&) {
        if constexpr (std::is_void_v<decltype(factory.check_at_login(knobs))>) {
          factory.check_at_login(knobs);
          return std::optional<DataSizeAtLogin>();
        } else {
          return size_read(factory.check_at_login(knobs));
        }
      };
  }

  /// A data factory's part of the job's preparation step: knobs, the pretrained model's directory, the step's output.
  using DataPreparation =
      std::function<void(const Knobs&, const std::optional<std::filesystem::path>&, const std::filesystem::path&)>;
  template <class Factory>
  static void add_preparation_of(const Factory& factory, DataPreparation& slot) {
    slot = nullptr;
    if constexpr (requires(const Factory& f, const Knobs& k, const std::optional<std::filesystem::path>& d,
                           const std::filesystem::path& o) { f.prepare_in_job(k, d, o); })
      slot = [factory](const Knobs& knobs, const std::optional<std::filesystem::path>& pretrained,
                       const std::filesystem::path& out) { factory.prepare_in_job(knobs, pretrained, out); };
  }

  std::function<ModelInstance(const RunContext&)> model_;
  std::function<std::filesystem::path(const Knobs&)> pretrained_dir_;
  std::function<std::unique_ptr<torch::optim::Optimizer>(const NamedParameters&, const Knobs&)> optimizer_;
  StrategyFactory strategy_;  // Replicated (the constructor)
  std::optional<ZeroStage> sharding_;
  bool own_strategy_ = false;  ///< strategy() was given (sharding() also sets one: it says which stage)
  int hsdp_group_size_ = 0;
  LossFunction loss_;  // cross entropy (the constructor)
  StepFunction step_ = default_step;
  EvalStepFunction eval_step_ = default_eval_step;
  LossCountFunction loss_count_;
  std::function<data::Source(const RunContext&)> train_data_, eval_data_;
  LoginCheck model_check_;
  DataLoginCheck train_check_, eval_check_;
  DataPreparation train_preparation_, eval_preparation_;
  std::vector<LoginCheck> login_checks_;
  std::vector<FinishHook> finish_hooks_;
  std::vector<ModelHook> model_hooks_;
  TrainingPlanner planner_;
  std::function<std::optional<models::LoraConfig>(const Knobs&)> lora_from_knobs_;
  BatchSize batch_size_;
  std::int64_t eval_batch_size_ = 1000;
  std::optional<std::int64_t> epochs_, max_steps_;
  std::optional<double> lr_, clip_grad_norm_;
  LrSchedule schedule_;
  std::function<LrSchedule(const Knobs&)> schedule_from_knobs_;
  std::int64_t accumulation_ = 1;
  Precision precision_ = Precision::fp32;
  ReduceDtype reduce_dtype_ = ReduceDtype::fp32;
  std::int64_t seed_ = 0;
  std::int64_t eval_every_ = 0, log_every_ = 50, checkpoint_every_ = 0, preemption_check_every_ = 1;
  std::int64_t max_eval_examples_ = 0;
  int keep_checkpoints_ = 3;
  bool checkpoint_async_ = false;
  std::vector<metrics::Metric> metrics_;
  std::vector<LoggerFactory> loggers_;
  std::optional<Wandb> wandb_;
  std::optional<double> flops_per_example_, peak_flops_;
  bool report_digest_ = false;
  bool shard_at_one_rank_ = false;
  bool evaluate_at_start_ = false;
  int threads_ = 0;
  bool keep_freed_memory_ = true;
  bool pin_memory_ = false;
  bool cuda_graphs_ = false;
  bool float8_ = false;
  std::optional<std::filesystem::path> run_dir_;
  Knobs knobs_;
  std::function<void(std::int64_t)> on_step_;
};

#if HPCTRAIN_RUNTIME_DEFINITIONS
HPCTRAIN_RUNTIME_INLINE Training::Training()
    : strategy_([] { return std::unique_ptr<DataParallelStrategy>(std::make_unique<Replicated>()); }),
      loss_(detail::wrap_loss(torch::nn::functional::cross_entropy)) {}
HPCTRAIN_RUNTIME_INLINE Training::Training(const Training&) = default;
HPCTRAIN_RUNTIME_INLINE Training::Training(Training&&) noexcept = default;
HPCTRAIN_RUNTIME_INLINE Training& Training::operator=(const Training&) = default;
HPCTRAIN_RUNTIME_INLINE Training& Training::operator=(Training&&) noexcept = default;
HPCTRAIN_RUNTIME_INLINE Training::~Training() = default;

HPCTRAIN_RUNTIME_INLINE std::unique_ptr<DataParallelStrategy> Training::make_strategy() const { return strategy_(); }

HPCTRAIN_RUNTIME_INLINE Training& Training::sharding(ZeroStage stage) {
  strategy(sharded(stage, {}, hsdp_group_size_));
  sharding_ = stage;
  return *this;
}

HPCTRAIN_RUNTIME_INLINE void Training::check_lora_targets_at_login(const Knobs& knobs) const {
  const auto config = lora(knobs);
  const auto directory = pretrained_dir(knobs);
  if (!config || !directory) return;
  const auto layers = models::read_config_reading(*directory).linear_layers;
  if (layers.empty()) return;  // a family without a list: the worker checks
  for (const auto& target : config->targets) {
    // a dotted name is one layer's path (layers.0.self_attn.q_proj): the worker checks it on the module
    if (target == "all-linear" || target.find('.') != std::string::npos ||
        std::find(layers.begin(), layers.end(), target) != layers.end())
      continue;
    const auto targets = fmt::format("{}", fmt::join(config->targets, ","));
    const auto reason = fmt::format("'{}' names no layer of {}: its layers are {}, or all-linear", target,
                                    directory->string(), fmt::join(layers, ", "));
    if (knobs.find("lora_targets") != nullptr)
      throw SpecError(errors::spec_knob, "--lora-targets = " + targets, reason);
    throw SpecError("lora.targets", targets, reason);
  }
}

HPCTRAIN_RUNTIME_INLINE Training& Training::hsdp_group_size(int ranks) {
  detail::require(ranks >= 0, "sharding", fmt::format("hsdp with hsdp_group_size {}", ranks),
                  "the group size must be 0 (the ranks of a node) or positive");
  hsdp_group_size_ = ranks;
  if (sharding_) sharding(*sharding_);
  return *this;
}
#endif

}  // namespace hpctrain
