#pragma once
// Worker mode: what one rank runs under srun or `--local N`. Reads the training knobs forwarded from the
// command line (--epochs, --max-steps, --batch-size, --lr), finds its place in the world from the
// environment, trains, and maps errors to the exit codes of DESIGN.md.
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/slurm/world.hpp>
#include <hpctrain/train/trainer.hpp>
#include <hpctrain/train/training.hpp>

namespace hpctrain {

/// Training knobs given on the command line; each replaces the description's value.
struct TrainingKnobs {
  std::optional<std::int64_t> epochs, max_steps, batch_size;
  std::optional<double> lr;
};

/// Parses `--epochs N --max-steps N --batch-size N --lr X` (in either `--flag value` or `--flag=value` form);
/// throws UsageError on anything else. Ranges are checked by Training::validate, which names the field.
inline TrainingKnobs parse_training_knobs(const std::vector<std::string>& args) {
  TrainingKnobs knobs;
  CLI::App app("hpctrain worker");
  app.add_option("--epochs", knobs.epochs);
  app.add_option("--max-steps", knobs.max_steps);
  app.add_option("--batch-size", knobs.batch_size);
  app.add_option("--lr", knobs.lr);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 parses a reversed vector
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& error) {
    throw UsageError(fmt::format("worker arguments: {}", error.what()));
  }
  return knobs;
}

/// `training` with the knobs applied; a `--batch-size` keeps the declared scope (per rank or global).
inline Training with_knobs(Training training, const TrainingKnobs& knobs) {
  if (knobs.epochs) training.epochs(*knobs.epochs);
  if (knobs.max_steps) training.max_steps(*knobs.max_steps);
  if (knobs.batch_size) training.batch_size({*knobs.batch_size, training.batch_size().scope});
  if (knobs.lr) training.lr(*knobs.lr);
  return training;
}

/// One rank: applies the forwarded knobs, trains, returns exit_ok, exit_requeue, exit_usage or exit_failure.
inline int run_worker(const Training& training, const std::vector<std::string>& args) {
  int rank = 0;
  try {
    const auto world = slurm::world_from_environment();
    rank = world.rank;
    return train(with_knobs(training, parse_training_knobs(args)), world).exit_code;
  } catch (const SpecError& error) {
    fmt::print(stderr, "rank {}: {}\n", rank, error.what());
    return exit_usage;
  } catch (const UsageError& error) {
    fmt::print(stderr, "rank {}: {}\n", rank, error.what());
    return exit_usage;
  } catch (const std::exception& error) {  // RuntimeError, and c10::Error from LibTorch
    fmt::print(stderr, "rank {}: {}\n", rank, error.what());
    return exit_failure;
  }
}

}  // namespace hpctrain
