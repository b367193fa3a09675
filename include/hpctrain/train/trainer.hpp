#pragma once
// The Trainer: what every rank runs. Setup (rendezvous, model, strategy, optimizer, data, loggers, resume),
// then epochs of steps — gather batches in the background, run the step function per micro-batch under
// the chosen precision, let the strategy synchronise gradients, clip and step — and at step boundaries
// log, evaluate, checkpoint and, every few steps, ask the ranks about a preemption signal. Rank 0 alone
// writes the run's records.
//
// Exact resume: everything a step depends on is a function of (seed, rank, step) or saved in the
// checkpoint — shuffling (seed, epoch), the learning rate (step), the RNG (re-seeded every step from
// seed, rank and step), the batch position (step) — so a stopped and resumed run equals an unstopped one.
#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>  // every rank reports its parameters digest
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <hpctrain/dist/collectives.hpp>
#include <hpctrain/dist/lagged_sum.hpp>
#include <hpctrain/dist/process_group.hpp>
#include <hpctrain/dist/traffic.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/job/prepare.hpp>
#include <hpctrain/models/blocks.hpp>
#include <hpctrain/models/deferred_initialization.hpp>
#include <hpctrain/models/kernels/scoped_switch.hpp>
#include <hpctrain/models/lora/lora.hpp>
#include <hpctrain/slurm/world.hpp>
#include <hpctrain/train/batch_fit.hpp>
#include <hpctrain/train/checkpoint/async_checkpoint.hpp>
#include <hpctrain/train/checkpoint/checkpoint.hpp>
#include <hpctrain/train/checkpoint/checkpointing.hpp>
#include <hpctrain/train/checkpoint/digest.hpp>
#include <hpctrain/train/data/mix.hpp>
#include <hpctrain/train/data/prefetch.hpp>
#include <hpctrain/train/data/sampler.hpp>
#include <hpctrain/train/evaluation.hpp>
#include <hpctrain/train/float8_setup.hpp>
#include <hpctrain/train/host_memory.hpp>
#include <hpctrain/train/loggers/loggers.hpp>
#include <hpctrain/train/loggers/wandb.hpp>
#include <hpctrain/train/precision.hpp>
#include <hpctrain/train/preemption.hpp>
#include <hpctrain/train/run_context.hpp>
#include <hpctrain/train/run_directory.hpp>
#include <hpctrain/train/run_setup.hpp>
#include <hpctrain/train/step.hpp>
#include <hpctrain/train/step_graph.hpp>
#include <hpctrain/train/strategies/one_rank.hpp>
#include <hpctrain/train/strategies/replicated.hpp>  // modules_to_bf16
#include <hpctrain/train/strategies/strategy.hpp>
#include <hpctrain/train/throughput.hpp>
#include <hpctrain/train/training.hpp>

namespace hpctrain {

namespace detail {
/// The model as the hooks at the end see it through the run's strategy (FinishContext::model).
class StrategyModel : public FinishModel {
 public:
  StrategyModel(DataParallelStrategy& strategy, torch::nn::Module& module, dist::ProcessGroup& group)
      : strategy_(strategy), module_(module), group_(group), lead_(group.rank() == 0) {}
  std::vector<models::ParameterShape> unit_shapes() override { return strategy_.unit_shapes(module_); }
  void visit_units(const models::UnitVisitor& visit) override { strategy_.visit_units(module_, visit); }
  void gather_whole() override {
    if (whole_) return;
    // Said, since at 8B this is 32 GB on every GPU: a hook added as a plain callable reads `module` whole.
    if (lead_ && strategy_.forward_is_collective())
      fmt::print("hpctrain: a hook at the end reads the module whole: the whole model gathered on every rank\n");
    strategy_.gather_full_model();
    whole_ = true;
  }
  bool forward_is_collective() const override { return !whole_ && strategy_.forward_is_collective(); }
  void wait_for_writers() override {
    dist::CheckpointWaits waits(group_);
    dist::barrier(group_);
  }

 private:
  DataParallelStrategy& strategy_;
  torch::nn::Module& module_;
  dist::ProcessGroup& group_;
  bool lead_;
  bool whole_ = false;
};
}  // namespace detail

/// One rank's training run. `run()` once.
class Trainer {
 public:
  Trainer(const Training& training, const slurm::World& world, const dist::Options& options = {},
          RunPlacement placement = {})
      : training_(training), world_(world), options_(options), placement_(std::move(placement)) {}

  /// Trains to the end (exit_ok) or to an agreed preemption (exit_requeue, after a checkpoint).
  TrainResult run() {
    rendezvous();
    try {
      setup();
      while (step_ < total_steps_)
        if (!train_epoch()) return preempt();
      return finish();
    } catch (...) {
      group_->mark_failed();  // peers may be gone: the process group must not wait for them on the way out
      throw;
    }
  }

 private:
  // ---- setup ---------------------------------------------------------------------------------------
  void rendezvous() {
    training_.validate();
    install_preemption_handler(preemption_settings(placement_.environment), world_.rank);
    torch::set_num_threads(detail::resolve_threads(training_, world_, placement_.environment));
    group_ = dist::init_process_group(world_, options_);
    device_ = group_->device();
    if (training_.cuda_graphs()) refuse_uncapturable_runs();
    const bool float8_emulated = float8_emulated_by_seam(placement_.environment);
    refuse_unsupported_float8(training_, resolve_precision(training_.precision(), device_), device_, float8_emulated);
    float8_projections_.emplace(models::set_float8_projections, models::float8_projections,
                                float8_mode(training_, float8_emulated));
    if (training_.keep_freed_memory() && device_.is_cpu()) detail::keep_freed_host_memory();
  }

  void setup() {
    describe_run();
    build_model_and_strategy();
    load_data();
    plan_steps();
    open_loggers();
    resume();
    announce();
    report_padding();
    if (eval_set_ && training_.evaluate_at_start() && !result_.resumed_from) {
      result_.eval_loss_at_start = evaluate_and_log().loss;
      say(fmt::format("eval_loss_at_start={:.8g}", *result_.eval_loss_at_start));
      model_.module->train();
      meter_->restart_clock();
    }
    traffic_at_start_ = dist::traffic_so_far();  // what the steps put on the fabric is counted from here
    step_at_start_ = step_;
  }

  /// What the factories and the hooks at the end are told: knobs, place in the world, directories.
  void describe_run() {
    const auto run =
        resolve_run_directory(training_.run_dir(), placement_);  // which directory; resume from where (--resume)
    run_dir_ = run.path;
    resume_from_ = run.checkpoints_to_resume();
    run_.emplace(RunContext{training_.knobs(), group_->rank(), group_->world_size(), run_dir_,
                            prepared_output_dir(placement_.environment), training_.pretrained_dir(training_.knobs()),
                            training_.lora(training_.knobs())});
    run_->seed = training_.seed();
  }

  /// Seeded model on the device; the strategy makes the replicas equal (one broadcast) and the optimizer. A
  /// model built with empty blocks (lm::from_pretrained under ZeRO-3) is never whole on a rank: the strategy
  /// reads each rank's slices; any other strategy gets it materialized.
  void build_model_and_strategy() {
    torch::manual_seed(static_cast<std::uint64_t>(training_.seed()));
    strategy_ = make_strategy_for_world(training_, group_->world_size());
    if (lead() && training_.sharding() &&
        sharded_stage_runs_replicated(*training_.sharding(), group_->world_size(), training_.shard_at_one_rank()))
      fmt::print(
          "hpctrain: {0} at one rank trains as replicated (sharding over one rank only adds copies and "
          "gathers); its checkpoints keep {0}'s format and resume at any world size (--shard-at-one-rank shards "
          "anyway)\n",
          strategy_->name());
    run_->defer_blocks = strategy_->reads_deferred_blocks();
    run_->trainer_reads_blocks = !run_->defer_blocks && run_->lora && training_.precision() == Precision::bf16;
    make_model();
    if (auto* lists = dynamic_cast<ListsBlocks*>(model_.module.get()); lists != nullptr && !run_->defer_blocks) {
      // LoRA in bf16 on a strategy that holds the model whole: the blocks and edges, all frozen once the adapters
      // are added, take the dtype they compute in before they are read, so the base is never whole in fp32 on the
      // rank (the strategy then holds them so: hold_frozen_in_compute_dtype; the adapters stay fp32: models/lora).
      if (run_->trainer_reads_blocks)
        detail::modules_to_bf16(lists->deferred_modules(/*edges=*/true), [](const torch::Tensor&) { return true; });
      materialize_blocks(*lists);
    }
    for (const auto& hook : training_.model_hooks()) hook(*model_.module, run_->knobs);
    if (run_->lora) add_lora_adapters();
    model_.module->to(device_);
    strategy_->setup(
        {group_, model_.module, training_.optimizer_factory(), training_.precision(), training_.reduce_dtype()});
    report_peak_memory("model ready");
    for (auto& group : strategy_->optimizer().param_groups())
      base_lrs_.push_back(training_.lr().value_or(group.options().get_lr()));
    if (training_.cuda_graphs()) make_step_graph();
  }

  /// `--cuda-graphs` where no step can be captured: refused before the run starts, naming why.
  void refuse_uncapturable_runs() const {
    const auto refuse = [](bool ok, const std::string& value, const char* reason) {
      detail::require(ok, errors::spec_training_cuda_graphs, value, reason);
    };
    refuse(detail::step_graphs_built, "on, in a program built without CUDA graphs",
           "this program was built against a LibTorch without CUDA");
    refuse(device_.is_cuda(), fmt::format("on, with the device {}", device_.str()),
           "a CUDA graph captures a GPU's step; this run trains on the CPU");
    refuse(group_->world_size() == 1, fmt::format("on, with {} ranks", group_->world_size()),
           "the step is captured at one rank only (its collectives are not captured)");
  }

  /// The step graph over the run's optimizer, which must be FusedAdamW: it keeps its counts on the device.
  void make_step_graph() {
    auto* fused = dynamic_cast<FusedAdamW*>(&strategy_->optimizer());
    detail::require(fused != nullptr, errors::spec_training_cuda_graphs, "on, with an optimizer other than FusedAdamW",
                    "a captured step needs hpctrain::FusedAdamW (ht::adamw's default), which keeps its step counts "
                    "and learning rates on the device");
    step_graph_.emplace(device_, *fused);
  }

  /// The user's model. Where the strategy reads blocks slice by slice (ZeRO-3), a family of models/ built from
  /// scratch has its blocks built empty and their initialisation recorded (models::DeferredInitialization):
  /// each rank later rebuilds only the parameters its shards overlap, to the values the whole model would have.
  void make_model() {
    if (!run_->defer_blocks) {
      model_ = training_.make_model(*run_);
      return;
    }
    models::DeferredInitialization deferred;
    model_ = training_.make_model(*run_);
    auto* lists = dynamic_cast<ListsBlocks*>(model_.module.get());
    auto blocks = deferred.blocks();
    if (blocks == nullptr || lists == nullptr || lists->deferred_blocks())
      return;  // not a family, or loaded (from_pretrained)
    if (lead())
      fmt::print(
          "hpctrain: the model's {} blocks were built one at a time; each rank initialises only its shards of them\n",
          blocks->shapes.size());
    lists->set_deferred_blocks(std::move(blocks));
  }

  /// Rank 0 prints the highest peak resident host memory of any rank so far, `when`: once the model is ready
  /// (what loading took, the figure that decides whether a node's ranks fit its memory) and once the steps are
  /// done (what training took, before the last checkpoint and the hooks at the end; --plan's figure to compare).
  void report_peak_memory(std::string_view when) {
    const auto host = peak_host_memory_of_ranks();
    const auto most = host.argmax().item<std::int64_t>();
    if (lead() && host[most].item<double>() > 0)
      fmt::print("hpctrain: {}: peak host memory {:.3f} GiB per rank at most (rank {})\n", when,
                 host[most].item<double>() / (1 << 30), most);
  }

  /// Rank 0 prints the run's peak resident host memory, then the finish hooks' own (the export: VmHWM started again
  /// before them, from what each rank held then), on rank 0 — which writes the export — and the other ranks.
  void report_run_memory(const torch::Tensor& before_hooks, const torch::Tensor& resident_at_hooks,
                         bool hooks_measured) {
    const auto hooks = peak_host_memory_of_ranks();
    const auto run = torch::maximum(before_hooks, hooks);
    if (!lead() || run[0].item<double>() <= 0) return;
    fmt::print("hpctrain: run ended: peak host memory {}\n", memory_by_rank(run));
    if (hooks_measured && !training_.finish_hooks().empty())
      fmt::print("hpctrain: finish hooks: peak host memory {}; resident at their start {}\n", memory_by_rank(hooks),
                 memory_by_rank(resident_at_hooks));
  }

  /// Rank 0 prints the payload of its collectives per step (dist/traffic.hpp) since the first step of this process:
  /// what the strategy moves, beside FSDP2's per-parameter figures (evaluations and checkpoints between steps are
  /// included; --eval-every 0 --checkpoint-every 0 leave the steps alone).
  void report_traffic() {
    const auto steps = step_ - step_at_start_;
    if (!lead() || steps <= 0 || group_->world_size() == 1) return;
    const auto since = dist::traffic_so_far() - traffic_at_start_;
    std::string kinds;
    for (std::size_t k = 0; k < since.calls.size(); ++k)
      if (since.calls[k] > 0)
        kinds += fmt::format(" {}={} bytes ({:.1f} calls)", dist::collective_names[k], since.bytes[k] / steps,
                             static_cast<double>(since.calls[k]) / static_cast<double>(steps));
    fmt::print("hpctrain: collectives per step on rank 0 over {} steps:{}\n", steps, kinds);
  }

  /// "X GiB on rank 0, the other ranks Y GiB at most (rank r)".
  static std::string memory_by_rank(const torch::Tensor& bytes) {
    auto text = fmt::format("{:.3f} GiB on rank 0", bytes[0].item<double>() / (1 << 30));
    if (bytes.numel() == 1) return text;
    const auto rest = bytes.narrow(0, 1, bytes.numel() - 1);
    const auto most = rest.argmax().item<std::int64_t>();
    return text + fmt::format(", the other ranks {:.3f} GiB at most (rank {})", rest[most].item<double>() / (1 << 30),
                              most + 1);
  }

  /// Every rank's `bytes`, on every rank (collective).
  torch::Tensor bytes_of_ranks(std::int64_t bytes) {
    auto all = torch::zeros({group_->world_size()}, torch::TensorOptions(torch::kFloat64).device(device_));
    all[group_->rank()] = static_cast<double>(bytes);
    return dist::all_reduce_sum(*group_, all).cpu();
  }

  /// Every rank's peak resident host memory so far (VmHWM), in bytes, on every rank (collective).
  torch::Tensor peak_host_memory_of_ranks() { return bytes_of_ranks(detail::peak_resident_bytes()); }

  /// LoRA: adapters on the targeted layers, everything else frozen (before the strategy sees the parameters).
  void add_lora_adapters() {
    const auto adapters = models::apply_lora(*model_.module, *run_->lora);
    const auto total = parameter_count(*model_.module);
    if (group_->rank() == 0)
      fmt::print("hpctrain: LoRA r={} alpha={} on [{}]: {} of {} parameters train ({:.3f}%)\n", run_->lora->r,
                 run_->lora->alpha, fmt::join(run_->lora->targets, ", "), adapters, total,
                 100.0 * static_cast<double>(adapters) / static_cast<double>(total));
  }

  void load_data() {
    const auto train_source = training_.train_data(*run_);
    train_description_ = train_source.description();
    train_set_ = train_source.load();
    if (training_.has_eval_data()) eval_set_ = training_.eval_data(*run_).load();
    micro_batch_ = training_.micro_batch_per_rank(group_->world_size());
    sampler_.emplace(train_set_->size(), group_->world_size(), group_->rank(),
                     static_cast<std::uint64_t>(training_.seed()));
  }

  void plan_steps() {
    const std::int64_t examples_per_step = micro_batch_ * training_.gradient_accumulation();
    steps_per_epoch_ = sampler_->size_per_rank() / examples_per_step;
    if (steps_per_epoch_ == 0)
      require_batch_within_epoch(training_.batch_size(), examples_per_step, sampler_->size_per_rank(),
                                 group_->world_size(), train_description_, "only");
    total_steps_ = std::numeric_limits<std::int64_t>::max();
    if (training_.epochs()) total_steps_ = *training_.epochs() * steps_per_epoch_;
    if (training_.max_steps()) total_steps_ = std::min(total_steps_, *training_.max_steps());
    result_.total_steps = total_steps_;
    meter_.emplace(group_->world_size(), examples_per_step, training_.flops_per_example(), training_.peak_flops());
  }

  /// Rank 0 says how much of the token slots the training batches of an epoch really carry as padding (rows of
  /// variable length padded to their batch's longest: SFT), over every rank's batches of the first epoch.
  void report_padding() {
    if (!lead()) return;
    const std::int64_t per_step = micro_batch_ * training_.gradient_accumulation();
    const auto fill = data::epoch_fill(*train_set_, *sampler_, group_->world_size(), 0, per_step, steps_per_epoch_);
    if (!fill) return;
    say(fmt::format(
        "hpctrain: padding: {:.1f}% of the token slots of an epoch's batches ({} tokens in {} slots; {} batches of {} "
        "rows "
        "on each of {} rank(s))",
        100.0 * fill->padding(), fill->tokens, fill->slots, steps_per_epoch_, per_step, group_->world_size()));
  }

  /// Rank 0's loggers: progress lines, metrics.jsonl, TensorBoard, W&B when asked, then the Training's own.
  void open_loggers() {
    store_.emplace(run_dir_ / layout::checkpoints, training_.keep_checkpoints());
    resume_store_.emplace(resume_from_, training_.keep_checkpoints());
    if (!lead()) return;
    loggers_.push_back(std::make_unique<ProgressLogger>(!world_.under_slurm));
    loggers_.push_back(std::make_unique<JsonlLogger>());
    loggers_.push_back(std::make_unique<TensorBoardLogger>());
    if (training_.wandb())  // W&B's connection (WANDB_MODE, WANDB_BASE_URL, the key) from the rank's environment
      loggers_.push_back(
          std::make_unique<WandbLogger>(*training_.wandb(), wandb_config(training_.knobs()),
                                        WandbConnection::from_environment([this](const std::string& name) {
                                          return placement_.environment.get(name);
                                        })));
    for (const auto& make : training_.loggers()) loggers_.push_back(make());
  }

  void resume() {
    // Every rank's warnings: each verifies its own share of a checkpoint (resume_latest says who warns of what).
    const auto state = detail::resume_latest(*group_, *resume_store_, *strategy_,
                                             [](const std::string& warning) { fmt::print(stderr, "{}\n", warning); });
    if (state) {
      step_ = state->step;
      last_checkpoint_step_ = step_;
      result_.resumed_from = step_;
      if (lead()) check_data_positions(state->data_sources);
    }
  }

  /// A mixed training set's sources and each one's position after `step` steps (train/data/mix.hpp).
  std::vector<SourcePosition> data_positions(std::int64_t step) const {
    const auto* mix = train_set_->mixture();
    if (!mix) return {};
    const std::int64_t per_step = micro_batch_ * training_.gradient_accumulation();
    const auto epoch = step / steps_per_epoch_;
    std::vector<std::int64_t> consumed;  // every rank's batches of this epoch so far
    for (int rank = 0; rank < group_->world_size(); ++rank) {
      const auto indices = sampler_->for_rank(rank).indices(epoch);
      consumed.insert(consumed.end(), indices.begin(),
                      indices.begin() + static_cast<std::ptrdiff_t>((step % steps_per_epoch_) * per_step));
    }
    const auto positions = mix->plan().positions(epoch, consumed);
    std::vector<SourcePosition> out;
    for (std::size_t i = 0; i < positions.size(); ++i) {
      const auto& part = mix->plan().parts()[i];
      out.push_back({part.name, part.rows, part.weight, positions[i]});
    }
    return out;
  }

  /// Rank 0 at a resume: the checkpoint's sources at the positions this data gives at its step, else a warning
  /// (the mix changed: the run goes on, no longer the sequence the checkpointed run would have read).
  void check_data_positions(const std::vector<SourcePosition>& saved) {
    const auto now = data_positions(step_);
    if (saved.empty() || saved == now) return;
    const auto list = [](const std::vector<SourcePosition>& sources) {
      std::string out;
      for (const auto& s : sources)
        out += fmt::format("{}{} ({} rows, weight {}, position {})", out.empty() ? "" : ", ", s.name, s.rows, s.weight,
                           s.position);
      return out.empty() ? std::string("one source") : out;
    };
    fmt::print(stderr,
               "hpctrain: warning: the training data's mix differs from the checkpoint's: it read {}; the data now "
               "gives {} at step {}. The run goes on with the new mix, not the sequence of examples the checkpointed "
               "run would have read.\n",
               list(saved), list(now), step_);
  }

  /// Rank 0 names a mix's sources: its rows and weight, its slots an epoch and the passes over it the run takes.
  void announce_mix() {
    const auto* mix = train_set_->mixture();
    if (!mix || !lead()) return;
    const auto at_end = data_positions(total_steps_);
    for (std::size_t i = 0; i < at_end.size(); ++i) {
      const auto& source = at_end[i];
      say(
          fmt::format("hpctrain: data mix: {}: {} rows, weight {:.4g}: {} of an epoch's {} examples; the run's {} "
                      "steps read {:.2f} passes over it",
                      source.name, source.rows, source.weight, mix->plan().per_epoch()[i], mix->plan().slots(),
                      total_steps_, static_cast<double>(source.position) / static_cast<double>(source.rows)));
    }
  }

  void announce() {
    const RunInfo info{run_dir_,     group_->world_size(), device_.str(),
                       total_steps_, steps_per_epoch_,     result_.resumed_from};
    for (auto& logger : loggers_) logger->start(info);
    if (result_.resumed_from)
      say(fmt::format("resumed from {} at step {} (epoch {})", resume_store_->directory().string(), step_,
                      step_ / steps_per_epoch_));
    say(fmt::format(
        "hpctrain: {} rank(s) on {} ({}), {} threads each, {} examples/step/rank, {} steps/epoch, {} steps, {}, {}",
        group_->world_size(), device_.str(), group_->backend_name(), torch::get_num_threads(),
        micro_batch_ * training_.gradient_accumulation(), steps_per_epoch_, total_steps_,
        to_string(training_.precision()), strategy_->name()));
    announce_mix();
    meter_->restart_clock();
    model_.module->train();
  }

  // ---- the loop ------------------------------------------------------------------------------------
  /// The rest of the current epoch; false when the ranks agreed to stop for a preemption.
  bool train_epoch() {
    const std::int64_t epoch = step_ / steps_per_epoch_;
    const std::int64_t epoch_end = std::min(total_steps_, (epoch + 1) * steps_per_epoch_);
    auto indices = std::make_shared<const std::vector<std::int64_t>>(sampler_->indices(epoch));
    const std::int64_t per_step = micro_batch_ * training_.gradient_accumulation();
    data::Prefetcher batches(
        [this, indices, per_step, epoch](std::int64_t batch_index) {
          const auto begin = indices->begin() + static_cast<std::ptrdiff_t>(batch_index * per_step);
          auto batch = train_set_->batch_in_epoch(
              std::vector<std::int64_t>(begin, begin + static_cast<std::ptrdiff_t>(per_step)), epoch);
          return pinned_batches() ? batch.pinned() : batch;  // pinned on this thread, off the step's path
        },
        step_ - epoch * steps_per_epoch_, epoch_end - epoch * steps_per_epoch_);
    while (step_ < epoch_end) {
      train_step(batches.next());
      after_step();
      note_training_progress();
      if (agreed_to_stop()) return false;
    }
    return true;
  }

  /// Training::pin_memory on a CUDA device: batches come pinned from the prefetcher and move without a wait.
  bool pinned_batches() const { return training_.pin_memory() && device_.is_cuda(); }

  /// One optimizer step: the batch's step on the device (captured in the step graph, under --cuda-graphs).
  void train_step(const data::Batch& batch) {
    set_learning_rates();
    torch::manual_seed(detail::step_seed(training_.seed(), group_->rank(), step_));
    const auto outputs = step_graph_ ? step_graph_->run(batch, pinned_batches(),
                                                        [this](const data::Batch& b) { return step_on_device(b); })
                                     : step_on_device(batch.to(device_, /*non_blocking=*/pinned_batches()));
    if (outputs.grad_norm.defined()) grad_norm_ = outputs.grad_norm;
    ++step_;
    meter_->add_step(outputs.loss, detail::tokens_in(batch));
  }

  /// The step on a batch on the device: the step function per micro-batch, gradients through the strategy,
  /// clip, the optimizer's update. Reads nothing on the host: a CUDA graph may capture it.
  detail::StepOutputs step_on_device(const data::Batch& batch) {
    strategy_->zero_grad();
    const std::int64_t accumulation = training_.gradient_accumulation();
    std::vector<data::Batch> parts;
    for (std::int64_t micro = 0; micro < accumulation; ++micro)
      parts.push_back(batch.narrow(micro * micro_batch_, micro_batch_));
    const auto weights = loss_weights(parts);
    detail::StepOutputs outputs;
    for (std::int64_t micro = 0; micro < accumulation; ++micro) {
      strategy_->set_sync(micro == accumulation - 1);  // communicate only once per optimizer step
      auto context = step_context(micro);
      torch::Tensor loss;
      {
        AutocastScope autocast(training_.precision(), device_);
        loss = training_.step()(context, parts[static_cast<std::size_t>(micro)]);
      }
      // Without a loss count each micro-batch's mean weighs 1 / accumulation (and the strategy averages the ranks).
      const auto weighted =
          weights.empty() ? loss / static_cast<double>(accumulation) : loss * weights[static_cast<std::size_t>(micro)];
      weighted.backward();
      const auto contribution = weights.empty() ? loss.detach().to(torch::kFloat32) / static_cast<double>(accumulation)
                                                : weighted.detach().to(torch::kFloat32);
      outputs.loss = outputs.loss.defined() ? outputs.loss + contribution : contribution;
    }
    strategy_->finish_gradients();
    if (training_.clip_grad_norm()) outputs.grad_norm = strategy_->clip_grad_norm(*training_.clip_grad_norm());
    strategy_->step();
    return outputs;
  }

  StepContext step_context(std::int64_t micro) {
    return StepContext{*model_.module,
                       model_.forward,
                       device_,
                       training_.precision(),
                       group_->rank(),
                       group_->world_size(),
                       step_,
                       micro,
                       training_.gradient_accumulation(),
                       training_.loss(),
                       training_.knobs(),
                       &meter_->step_values()};
  }

  /// Each micro-batch's weight in the step's loss when the Training counts what a loss is a mean over
  /// (Training::loss_count): its count times the world size over the global batch's count, so that with the
  /// strategy's mean over ranks the step's loss and gradients are the sum over every counted item of the global
  /// batch divided by their number, whatever the split into ranks x micro-batches x accumulation steps (transformers'
  /// num_items_in_batch with average_tokens_across_devices). The count is all-reduced once a step, on the device,
  /// before the first forward: no host synchronisation. Empty without a count (the micro-batches weigh alike).
  std::vector<torch::Tensor> loss_weights(const std::vector<data::Batch>& parts) {
    if (!training_.loss_count()) return {};
    std::vector<torch::Tensor> counts;
    for (std::size_t micro = 0; micro < parts.size(); ++micro) {
      auto context = step_context(static_cast<std::int64_t>(micro));
      auto count = training_.loss_count()(context, parts[micro]);
      if (!count.defined()) return {};
      counts.push_back(count.to(device_, torch::kFloat32).reshape({}));
    }
    auto total = torch::stack(counts).sum().reshape({1});
    dist::all_reduce_sum(*group_, total);  // in place, one element
    const auto per_item = static_cast<double>(group_->world_size()) / total.clamp_min(1).reshape({});
    std::vector<torch::Tensor> weights;
    for (const auto& count : counts) weights.push_back(count * per_item);
    return weights;
  }

  void set_learning_rates() {
    const double factor = training_.schedule().factor(step_, total_steps_);
    auto& groups = strategy_->optimizer().param_groups();
    for (std::size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(base_lrs_.at(i) * factor);
  }

  /// At a step boundary: the user's callback, then log, evaluate and checkpoint when due.
  void after_step() {
    if (training_.on_step()) training_.on_step()(step_);
    if (step_ % training_.log_every() == 0 || step_ == total_steps_) log_train();
    if (eval_set_ && training_.eval_every() > 0 && step_ % training_.eval_every() == 0 && step_ != total_steps_) {
      evaluate_and_log();
      meter_->restart_clock();  // samples/s measures training steps only
    }
    if (training_.checkpoint_every() > 0 && step_ % training_.checkpoint_every() == 0) {
      save_checkpoint();
      meter_->restart_clock();
    }
  }

  /// Every preemption_check_every steps (default: every step) the ranks vote without waiting (dist::LaggedSum)
  /// whether any got the signal and whether each has written its part of the asynchronous save in flight, and act
  /// on the vote before, whose sums are the same on every rank: all stop at the same step, at most
  /// Training::steps_until_stop() steps after the signal, and a save is committed (its own all-reduce of sizes and
  /// CRCs) once every writer is done, never asked about while one is still writing.
  bool agreed_to_stop() {
    if (step_ % training_.preemption_check_every() != 0) return false;
    const auto sums =
        vote_.exchange(*group_, {preemption_requested() ? 1.0 : 0.0, async_save_.finished_here() ? 0.0 : 1.0});
    if (!sums) return false;
    const double stop_votes = (*sums)[0], ranks_writing = (*sums)[1];
    if (ranks_writing == 0 && async_save_.in_flight()) async_save_.poll(*group_);
    return stop_votes > 0;
  }

  // ---- phases at step boundaries -------------------------------------------------------------------
  void log_train() {
    const double lr = base_lrs_.front() * training_.schedule().factor(step_ - 1, total_steps_);
    const auto record = meter_->record(*group_, step_, step_ / steps_per_epoch_, lr, grad_norm_);
    for (auto& logger : loggers_) logger->log(record);
  }

  Evaluation evaluate_and_log() {
    sync_buffers();
    const auto evaluation =
        detail::evaluate(training_, model_, *eval_set_, *group_, step_, strategy_->forward_is_collective());
    LogRecord record{
        step_, "eval", {{"loss", evaluation.loss}, {"examples", static_cast<double>(evaluation.examples)}}};
    for (const auto& metric : evaluation.metrics) record.values.push_back(metric);
    for (auto& logger : loggers_) logger->log(record);
    return evaluation;
  }

  void save_checkpoint() {
    if (step_ == last_checkpoint_step_) return;
    sync_buffers();  // rank 0's buffers on every rank, as after a resume
    const auto state = checkpoint_state();
    if (training_.checkpoint_async()) async_save_.start(*group_, *store_, *strategy_, state);
    else detail::save_checkpoint(*group_, *store_, *strategy_, state);
    last_checkpoint_step_ = step_;
  }

  /// The last checkpoint committed: waits for an asynchronous save in flight; a final save that failed there (its
  /// ranks warned) is retried once, synchronously, and a failure of that one fails the run.
  void complete_checkpoint() {
    save_checkpoint();
    if (async_save_.wait(*group_)) return;
    say(fmt::format("retrying the checkpoint of step {} synchronously", step_));
    detail::save_checkpoint(*group_, *store_, *strategy_, checkpoint_state());
  }

  CheckpointState checkpoint_state() const {
    return {step_, step_ / steps_per_epoch_, step_ % steps_per_epoch_, training_.seed(),
            lead() ? data_positions(step_) : std::vector<SourcePosition>{}};
  }

  /// Buffers such as batch norm's running statistics are updated from each rank's own batches; evaluate and
  /// checkpoint with rank 0's everywhere, as PyTorch's DDP does with broadcast_buffers.
  void sync_buffers() {
    if (group_->world_size() > 1) dist::detail::broadcast_from_rank0(*group_, model_.module->buffers());
  }

  TrainResult preempt() {
    vote_.settle(*group_);
    // From here every rank exits 75. srun --kill-on-bad-exit=1 SIGTERMs the others as soon as the first
    // one has exited, and a rank killed on its way out (rank 0 waits in ~ProcessGroup for the others to
    // check out) turns the step's status into 143 and the batch script would not requeue. So the rest
    // of this process's life ignores SIGTERM; SIGKILL after Slurm's KillWait still applies.
    std::signal(SIGTERM, SIG_IGN);
    note_preemption_agreed();
    complete_checkpoint();
    // The batch script also requeues when this marker exists, whatever status srun reports.
    if (const auto marker = placement_.environment.get(env::requeue_marker); marker && world_.rank == 0)
      std::ofstream(*marker) << step_ << "\n";
    say(fmt::format("preempted: checkpointed step {} of {}, exiting with {} for requeue", step_, total_steps_,
                    exit_requeue));
    result_.exit_code = exit_requeue;
    result_.steps_completed = step_;
    return result_;
  }

  TrainResult finish() {
    vote_.settle(*group_);
    report_peak_memory("steps done");
    report_traffic();
    if (step_graph_)
      say(fmt::format("cuda graphs: {} steps replayed, {} uncaptured for a batch of other shapes",
                      step_graph_->replays(), step_graph_->other_layouts()));
    complete_checkpoint();
    result_.steps_completed = step_;
    if (training_.report_digest()) report_digest();
    if (eval_set_) {
      const auto evaluation = evaluate_and_log();
      result_.eval_loss = evaluation.loss;
      for (const auto& [name, value] : evaluation.metrics) {
        result_.eval_metrics[name] = value;
        say(fmt::format("test_{}={:.4f}", name, value));
      }
      result_.eval_accuracy = evaluation.metric(metrics::accuracy.name());
    }
    const auto before_hooks = peak_host_memory_of_ranks();
    const auto resident_at_hooks = bytes_of_ranks(detail::resident_bytes());
    // VmHWM from here on: the finish hooks' own peak. On request only: it also resets the ru_maxrss that `time`
    // and getrusage report for the process (bench/export_memory.sh asks).
    const bool hooks_measured =
        placement_.environment.get(env::test_seam::measure_finish_hooks).has_value() && detail::reset_peak_resident();
    run_finish_hooks();
    report_run_memory(before_hooks, resident_at_hooks, hooks_measured);
    for (auto& logger : loggers_) logger->finish();
    return result_;
  }

  /// The Training's hooks at the end (exports, samples). The whole model is gathered only before the first hook
  /// that reads it in `module` (and kept for the hooks after it); an export made unit by unit (lm::hf_export)
  /// visits it through the strategy, never whole on any rank.
  void run_finish_hooks() {
    if (training_.finish_hooks().empty()) return;
    model_.module->eval();
    // In the run's precision, as evaluation computes: a block that trains in bf16 under ZeRO-3 is gathered in bf16.
    AutocastScope autocast(training_.precision(), device_);
    detail::StrategyModel model(*strategy_, *model_.module, *group_);
    const FinishContext context{*model_.module, *run_, result_, &model};
    for (const auto& hook : training_.finish_hooks()) {
      if (hook.needs_whole_model()) model.gather_whole();
      hook(context);
    }
    std::fflush(stdout);
  }

  /// Every rank states its own digest: replicas that drifted apart show here (tests compare them). Computed unit by
  /// unit (ZeRO-3: one block gathered at a time), never whole on a rank.
  void report_digest() {
    const auto digest = detail::parameters_digest(
        *model_.module, [&](const models::UnitVisitor& visit) { strategy_->visit_units(*model_.module, visit); });
    std::cout << fmt::format("rank {} parameters_crc32c={:08x}\n", world_.rank, digest) << std::flush;
    say(fmt::format("parameters_crc32c={:08x}", digest));
  }

  bool lead() const { return group_->rank() == 0; }
  void say(const std::string& text) {
    for (auto& logger : loggers_) logger->note(text);
  }

  const Training& training_;
  slurm::World world_;
  dist::Options options_;
  RunPlacement placement_;
  dist::TrafficCount traffic_at_start_;  ///< the collectives before the first step (loading, evaluation at start)
  std::int64_t step_at_start_ = 0;       ///< --resume's directory; the run directory when the login side chose it
  std::shared_ptr<dist::ProcessGroup> group_;
  torch::Device device_{torch::kCPU};
  /// The blocks' projections in float8 or not for the run's life (Training::float8), put back as they were after.
  std::optional<models::ScopedSwitch<models::Float8Projections>> float8_projections_;
  ModelInstance model_;
  std::unique_ptr<DataParallelStrategy> strategy_;
  std::vector<double> base_lrs_;
  std::shared_ptr<const data::Dataset> train_set_, eval_set_;
  std::optional<data::DistributedSampler> sampler_;
  std::int64_t micro_batch_ = 0, steps_per_epoch_ = 0, total_steps_ = 0, step_ = 0, last_checkpoint_step_ = -1;
  std::optional<detail::TrainMeter> meter_;
  torch::Tensor grad_norm_;
  std::optional<detail::StepGraph> step_graph_;  ///< under --cuda-graphs
  std::filesystem::path run_dir_, resume_from_;
  std::optional<RunContext> run_;
  std::string train_description_;
  std::optional<CheckpointStore> store_;         ///< where this run saves
  std::optional<CheckpointStore> resume_store_;  ///< where it resumes from: its own, or --resume's run
  /// At step boundaries: the ranks with the preemption signal, the ranks not done with a save in flight (all when none
  /// is).
  dist::LaggedSum vote_{2};
  /// The save in flight under checkpoint_async (after store_: joined first); every rank prints its own warnings.
  detail::AsyncCheckpoint async_save_{[](const std::string& warning) { fmt::print(stderr, "{}\n", warning); }};
  std::vector<std::unique_ptr<Logger>> loggers_;
  TrainResult result_;
};

/// Trains `training` as rank `world.rank` of `world.world_size`; returns exit_requeue (after a checkpoint) if a
/// preemption signal arrived, else exit_ok after the last step, a final checkpoint and evaluation. Rank 0
/// prints `test_<metric>=<value>` last for every requested metric.
/// `placement`: where the login side put the run (`--resume`'s directory), as the worker was told.
inline TrainResult train(const Training& training, const slurm::World& world, const dist::Options& options = {},
                         const RunPlacement& placement = {}) {
  if (training.precision() == Precision::automatic) {  // resolved for the device this rank will train on
    Training resolved = training;
    resolved.precision(resolve_precision(
        Precision::automatic, torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU)));
    return Trainer(resolved, world, options, placement).run();
  }
  return Trainer(training, world, options, placement).run();
}

}  // namespace hpctrain
