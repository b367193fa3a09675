#pragma once
// The training loop, run by every rank: rendezvous, build the model and optimizer, resume from the newest
// valid checkpoint, then step — gather batches in the background, forward under the chosen precision,
// backward with bucketed gradient all-reduce (dist::GradientSync), clip, step — and at step boundaries
// log, evaluate, checkpoint and honour a preemption signal. Rank 0 alone writes files and prints.
//
// Exact resume: everything a step depends on is a function of (seed, rank, step) or saved in the
// checkpoint — shuffling (seed, epoch), the learning rate (step), the RNG (re-seeded every step from
// seed, rank and step), the batch position (step) — so a stopped and resumed run equals an unstopped one.
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>  // every rank reports its parameters digest
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <hpctrain/dist/collectives.hpp>
#include <hpctrain/dist/gradient_sync.hpp>
#include <hpctrain/dist/process_group.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/slurm/world.hpp>
#include <hpctrain/train/checkpoint.hpp>
#include <hpctrain/train/crc32c.hpp>
#include <hpctrain/train/data/prefetch.hpp>
#include <hpctrain/train/data/sampler.hpp>
#include <hpctrain/train/metrics.hpp>
#include <hpctrain/train/precision.hpp>
#include <hpctrain/train/preemption.hpp>
#include <hpctrain/train/progress.hpp>
#include <hpctrain/train/run_directory.hpp>
#include <hpctrain/train/tensorboard.hpp>
#include <hpctrain/train/training.hpp>

namespace hpctrain {

/// How a call of `train` ended.
struct TrainResult {
  int exit_code = exit_ok;                 ///< exit_ok, or exit_requeue after a preemption checkpoint
  std::int64_t steps_completed = 0;        ///< optimizer steps done in total (including before a resume)
  std::int64_t total_steps = 0;            ///< steps the run is meant to take
  std::optional<std::int64_t> resumed_from;  ///< step of the checkpoint this call resumed from
  std::optional<double> eval_loss;         ///< final evaluation, when there is eval data
  std::optional<double> eval_accuracy;     ///< final accuracy, when requested
};

namespace detail {
/// Intra-op threads: explicit, else the CPUs Slurm gave the task, else the cores shared among local ranks.
inline int resolve_threads(const Training& training, const slurm::World& world) {
  if (training.thread_count() > 0) return training.thread_count();
  if (const char* cpus = std::getenv("SLURM_CPUS_PER_TASK"); cpus != nullptr && std::atoi(cpus) > 0) return std::atoi(cpus);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, world.local_world_size));
}

/// A distinct, reproducible RNG seed per (seed, rank, step) (splitmix64 finaliser).
inline std::uint64_t step_seed(std::int64_t seed, int rank, std::int64_t step) {
  std::uint64_t z = static_cast<std::uint64_t>(seed) * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(rank) * 0xBF58476D1CE4E5B9ull +
                    static_cast<std::uint64_t>(step) * 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFFull;
}

/// CRC-32C over every parameter's and buffer's bytes: equal digests mean bit-identical models
/// (how the requeue test compares a preempted run with an uninterrupted one).
inline std::uint32_t parameters_digest(const torch::nn::Module& module) {
  std::uint32_t crc = 0;
  auto add = [&](const torch::Tensor& tensor) {
    const auto bytes = tensor.detach().cpu().contiguous();
    crc = crc32c(bytes.data_ptr(), static_cast<std::size_t>(bytes.nbytes()), crc);
  };
  for (const auto& parameter : module.parameters()) add(parameter);
  for (const auto& buffer : module.buffers()) add(buffer);
  return crc;
}

struct Evaluation {
  double loss = 0;
  double accuracy = 0;
  std::int64_t examples = 0;
};

/// Loss and accuracy over the whole eval set: each rank takes a strided share, sums are all-reduced.
inline Evaluation evaluate(const Training& training, ModelInstance& model, const data::Dataset& dataset, dist::ProcessGroup& group) {
  // Buffers such as batch norm's running statistics are updated from each rank's own batches; evaluate
  // (and checkpoint) with rank 0's everywhere, as PyTorch's DDP does with broadcast_buffers.
  dist::broadcast_module(group, *model.module);
  model.module->eval();
  torch::NoGradGuard no_grad;
  const auto mine = data::strided_indices(dataset.size(), group.world_size(), group.rank());
  double loss_sum = 0, correct = 0, rows = 0, predictions = 0;
  for (std::size_t begin = 0; begin < mine.size(); begin += static_cast<std::size_t>(training.eval_batch())) {
    const std::size_t end = std::min(mine.size(), begin + static_cast<std::size_t>(training.eval_batch()));
    auto batch = dataset.batch(std::vector<std::int64_t>(mine.begin() + static_cast<std::ptrdiff_t>(begin), mine.begin() + static_cast<std::ptrdiff_t>(end)));
    auto inputs = batch.inputs.to(group.device());
    auto targets = batch.targets.to(group.device());
    torch::Tensor output;
    {
      AutocastScope autocast(training.forward_precision(), group.device());
      output = model.forward(inputs);
    }
    output = output.to(torch::kFloat32);
    const auto n = static_cast<double>(end - begin);
    loss_sum += training.loss_function()(output, targets).item<double>() * n;  // mean loss × rows = sum
    correct += output.argmax(-1).eq(targets).sum().item<double>();
    predictions += static_cast<double>(targets.numel());
    rows += n;
  }
  auto sums = torch::tensor({loss_sum, correct, rows, predictions}, torch::kFloat64).to(group.device());
  dist::all_reduce_sum(group, sums);
  sums = sums.cpu();
  const auto* s = sums.data_ptr<double>();
  model.module->train();
  return {s[0] / std::max(1.0, s[2]), s[1] / std::max(1.0, s[3]), static_cast<std::int64_t>(s[2])};
}
}  // namespace detail

/// Trains `training` as rank `world.rank` of `world.world_size`; returns exit_requeue (after a checkpoint) if a
/// preemption signal arrived, else exit_ok after the last step, a final checkpoint and evaluation. Rank 0
/// prints `test_accuracy=<value>` last when accuracy is requested.
inline TrainResult train(const Training& training, const slurm::World& world, const dist::Options& options = {}) {
  training.validate();
  install_preemption_handler();
  torch::set_num_threads(detail::resolve_threads(training, world));
  auto group = dist::init_process_group(world, options);
  try {
    const bool lead = group->rank() == 0;
    const auto device = group->device();
    const auto run = resolve_run_directory(training.run_directory());  // which directory; resume from where
    const auto run_dir = run.path;
    Progress progress(stdout, !world.under_slurm);
    auto say = [&](const std::string& text) {
      if (lead) progress.line(text);
    };

    torch::manual_seed(static_cast<std::uint64_t>(training.run_seed()));
    auto model = training.make_model();
    model.module->to(device);
    dist::broadcast_module(*group, *model.module);
    auto optimizer = training.make_optimizer(model.module->parameters());
    const double base_lr = training.base_lr().value_or(optimizer->param_groups().at(0).options().get_lr());
    dist::GradientSync gradient_sync(group, *model.module);

    const auto train_set = training.train_source().load();
    const auto eval_set = training.eval_source() ? training.eval_source().load() : nullptr;
    const std::int64_t micro_batch = training.micro_batch_per_rank(group->world_size());
    const std::int64_t accumulation = training.accumulation_steps();
    const std::int64_t examples_per_step = micro_batch * accumulation;
    const data::DistributedSampler sampler(train_set->size(), group->world_size(), group->rank(),
                                           static_cast<std::uint64_t>(training.run_seed()));
    const std::int64_t steps_per_epoch = sampler.size_per_rank() / examples_per_step;
    detail::require(steps_per_epoch > 0, "training.batch_size", examples_per_step,
                    fmt::format("each rank gets only {} examples per epoch of {}", sampler.size_per_rank(), training.train_source().description()));
    std::int64_t total_steps = std::numeric_limits<std::int64_t>::max();
    if (training.epoch_count()) total_steps = *training.epoch_count() * steps_per_epoch;
    if (training.step_limit()) total_steps = std::min(total_steps, *training.step_limit());

    TrainResult result;
    result.total_steps = total_steps;
    const CheckpointStore checkpoints(run_dir / "checkpoints", training.checkpoints_kept());
    std::int64_t step = 0;
    const CheckpointStore resumable(run.checkpoints_to_resume(), training.checkpoints_kept());
    if (auto state = resumable.load_latest(*model.module, *optimizer, [&](const std::string& warning) {
          if (lead) fmt::print(stderr, "{}\n", warning);
        })) {
      step = state->step;
      result.resumed_from = step;
      say(fmt::format("resumed from {} at step {} (epoch {})", resumable.directory().string(), step, state->epoch));
    }
    std::int64_t last_checkpoint_step = result.resumed_from.value_or(-1);
    auto save_checkpoint = [&] {
      if (step == last_checkpoint_step) return;
      dist::broadcast_module(*group, *model.module);  // rank 0's buffers on every rank, as after a resume
      if (lead) checkpoints.save(*model.module, *optimizer, {step, step / steps_per_epoch, step % steps_per_epoch, training.run_seed()});
      dist::barrier(*group);  // no rank moves on (or exits) before the checkpoint is durable
      last_checkpoint_step = step;
    };

    std::optional<JsonlWriter> jsonl;
    std::optional<TensorBoardWriter> tensorboard;
    if (lead) {
      jsonl.emplace(run_dir / "metrics.jsonl");
      tensorboard.emplace(run_dir / "tensorboard");
      say(fmt::format("hpctrain: {} rank(s) on {} ({}), {} threads each, {} examples/step/rank, {} steps/epoch, {} steps, {}",
                      group->world_size(), device.str(), group->backend_name(), torch::get_num_threads(), examples_per_step,
                      steps_per_epoch, total_steps, to_string(training.forward_precision())));
    }
    auto report_evaluation = [&](const data::Dataset& dataset) {
      const auto evaluation = detail::evaluate(training, model, dataset, *group);
      if (lead) {
        nlohmann::json record{{"step", step}, {"eval_loss", evaluation.loss}, {"eval_examples", evaluation.examples}};
        std::string text = fmt::format("eval step {}: loss {:.4f}", step, evaluation.loss);
        tensorboard->add_scalar("eval/loss", evaluation.loss, step);
        if (training.reports(metrics::accuracy)) {
          record["eval_accuracy"] = evaluation.accuracy;
          text += fmt::format(" accuracy {:.4f} ({} examples)", evaluation.accuracy, evaluation.examples);
          tensorboard->add_scalar("eval/accuracy", evaluation.accuracy, step);
        }
        jsonl->write(record);
        say(text);
      }
      return evaluation;
    };

    using clock = std::chrono::steady_clock;
    auto interval_start = clock::now();
    std::int64_t interval_steps = 0;
    double interval_loss = 0;
    std::vector<torch::Tensor> parameters = model.module->parameters();
    model.module->train();
    while (step < total_steps) {
      const std::int64_t epoch = step / steps_per_epoch;
      const std::int64_t epoch_end = std::min(total_steps, (epoch + 1) * steps_per_epoch);
      const auto indices = sampler.indices(epoch);
      data::Prefetcher prefetcher([&](std::int64_t batch_index) {
        const auto begin = indices.begin() + static_cast<std::ptrdiff_t>(batch_index * examples_per_step);
        return train_set->batch(std::vector<std::int64_t>(begin, begin + static_cast<std::ptrdiff_t>(examples_per_step)));
      }, step - epoch * steps_per_epoch, epoch_end - epoch * steps_per_epoch);

      for (; step < epoch_end;) {
        data::Batch batch = prefetcher.next();
        const double lr = base_lr * training.lr_schedule().factor(step, total_steps);
        for (auto& group_of_parameters : optimizer->param_groups()) group_of_parameters.options().set_lr(lr);
        torch::manual_seed(detail::step_seed(training.run_seed(), group->rank(), step));
        optimizer->zero_grad();
        double step_loss = 0;
        for (std::int64_t micro = 0; micro < accumulation; ++micro) {
          auto inputs = batch.inputs.narrow(0, micro * micro_batch, micro_batch).to(device);
          auto targets = batch.targets.narrow(0, micro * micro_batch, micro_batch).to(device);
          gradient_sync.set_sync(micro == accumulation - 1);  // all-reduce only once per optimizer step
          torch::Tensor loss;
          {
            AutocastScope autocast(training.forward_precision(), device);
            loss = training.loss_function()(model.forward(inputs), targets);
          }
          (loss / static_cast<double>(accumulation)).backward();
          step_loss += loss.item<double>() / static_cast<double>(accumulation);
        }
        gradient_sync.finish();
        if (training.max_grad_norm()) torch::nn::utils::clip_grad_norm_(parameters, *training.max_grad_norm());
        optimizer->step();
        ++step;
        ++interval_steps;
        interval_loss += step_loss;
        if (training.step_callback()) training.step_callback()(step);

        if (step % training.log_interval() == 0 || step == total_steps) {
          const double mean_loss = dist::all_reduce_sum(*group, interval_loss / static_cast<double>(interval_steps)) / group->world_size();
          if (lead) {
            const double seconds = std::chrono::duration<double>(clock::now() - interval_start).count();
            const double samples_per_second = static_cast<double>(interval_steps * examples_per_step * group->world_size()) / seconds;
            const double eta = seconds / static_cast<double>(interval_steps) * static_cast<double>(total_steps - step);
            progress.report({step, total_steps, step / steps_per_epoch, mean_loss, lr, samples_per_second, eta});
            jsonl->write({{"step", step}, {"epoch", step / steps_per_epoch}, {"loss", mean_loss}, {"lr", lr},
                          {"samples_per_s", samples_per_second}});
            tensorboard->add_scalar("train/loss", mean_loss, step);
            tensorboard->add_scalar("train/lr", lr, step);
            tensorboard->add_scalar("train/samples_per_s", samples_per_second, step);
          }
          interval_start = clock::now();
          interval_steps = 0;
          interval_loss = 0;
        }
        if (eval_set && training.eval_interval() > 0 && step % training.eval_interval() == 0 && step != total_steps) {
          report_evaluation(*eval_set);
          interval_start = clock::now();  // samples/s measures training steps only
        }
        if (training.checkpoint_interval() > 0 && step % training.checkpoint_interval() == 0) {
          save_checkpoint();
          interval_start = clock::now();
        }
        // Every rank asks every step, so all of them stop at the same step boundary.
        if (dist::any_rank(*group, preemption_requested())) {
          // From here every rank exits 75. srun --kill-on-bad-exit=1 SIGTERMs the others as soon as the first
          // one has exited, and a rank killed on its way out (rank 0 waits in ~ProcessGroup for the others to
          // check out) turns the step's status into 143 and the batch script would not requeue. So the rest
          // of this process's life ignores SIGTERM; SIGKILL after Slurm's KillWait still applies.
          std::signal(SIGTERM, SIG_IGN);
          save_checkpoint();
          // The batch script also requeues when this marker exists, whatever status srun reports.
          if (const char* marker = std::getenv("HPCTRAIN_REQUEUE_MARKER"); marker != nullptr && world.rank == 0)
            std::ofstream(marker) << step << "\n";
          say(fmt::format("preempted: checkpointed step {} of {}, exiting with {} for requeue", step, total_steps, exit_requeue));
          result.exit_code = exit_requeue;
          result.steps_completed = step;
          return result;
        }
      }
    }
    save_checkpoint();
    result.steps_completed = step;
    const auto digest = detail::parameters_digest(*model.module);
    // Every rank states its own digest: replicas that drifted apart show here (tests compare them).
    std::cout << fmt::format("rank {} parameters_crc32c={:08x}\n", world.rank, digest) << std::flush;
    say(fmt::format("parameters_crc32c={:08x}", digest));
    if (eval_set) {
      const auto evaluation = report_evaluation(*eval_set);
      result.eval_loss = evaluation.loss;
      if (training.reports(metrics::accuracy)) {
        result.eval_accuracy = evaluation.accuracy;
        say(fmt::format("test_accuracy={:.4f}", evaluation.accuracy));
      }
    }
    return result;
  } catch (...) {
    group->mark_failed();  // peers may be gone: the process group must not wait for them on the way out
    throw;
  }
}

}  // namespace hpctrain
