#pragma once
// What a worker knows when it builds the run, handed to the factories that ask for it (`.model`,
// `.train_data`, `.eval_data` taking `const RunContext&`) and to the hooks at the end (`Training::at_end`):
// the knobs, its place in the world, the run directory and where the job's preparation step left its
// results. docs/lm.md ("Interfaces") is the contract.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include <hpctrain/error.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/models/lora.hpp>

namespace hpctrain {

/// The run as a worker sees it before training starts.
struct RunContext {
  const Knobs& knobs;                                  ///< this run's knob values
  int rank = 0;                                        ///< this rank
  int world_size = 1;                                  ///< ranks in the run
  std::filesystem::path run_dir;                       ///< checkpoints, metrics, exports go below it
  std::optional<std::filesystem::path> prepared_dir;   ///< Job::prepare's output directory, when the job has one
  std::optional<std::filesystem::path> pretrained_dir; ///< where the model factory's files are (lm::from_pretrained)
  std::optional<models::LoraConfig> lora;             ///< the adapters the run trains (Training::lora), if any
  /// The strategy reads its own slices of each block (ZeRO-3 without LoRA): a model factory may return blocks
  /// built empty, with ListsBlocks::deferred_blocks (lm::from_pretrained does); the model hooks then see them empty.
  bool defer_blocks = false;

  /// The preparation's output directory; RuntimeError naming `what` needs it when the job has none.
  const std::filesystem::path& require_prepared_dir(std::string_view what) const {
    if (!prepared_dir)
      throw RuntimeError(errors::runtime_io, fmt::format("{} needs the job's preparation step (Job::prepare), and this run has none "
                                                         "(HPCTRAIN_RUN_DIR is not set: run it with --local N or --submit)", what));
    return *prepared_dir;
  }
};

/// How a call of `train` ended.
struct TrainResult {
  int exit_code = exit_ok;                   ///< exit_ok, or exit_requeue after a preemption checkpoint
  std::int64_t steps_completed = 0;          ///< optimizer steps done in total (including before a resume)
  std::int64_t total_steps = 0;              ///< steps the run is meant to take
  std::optional<std::int64_t> resumed_from;  ///< step of the checkpoint this call resumed from
  std::optional<double> eval_loss;           ///< final evaluation, when there is eval data
  std::optional<double> eval_loss_at_start;  ///< evaluation before the first step (Training::evaluate_at_start)
  std::optional<double> eval_accuracy;       ///< final accuracy, when requested
  std::map<std::string, double> eval_metrics;  ///< every requested metric of the final evaluation
};

/// What a hook at the end of a finished run sees: the whole model (gathered from its shards under ZeRO-3),
/// the run and its result. Hooks run on every rank; most act on rank 0 only (`run.rank == 0`).
struct FinishContext {
  torch::nn::Module& module;
  const RunContext& run;
  const TrainResult& result;
};

/// A hook at the end of a finished run (not after a preemption): exports, samples, reports.
using FinishHook = std::function<void(const FinishContext&)>;

/// A check on the login node once the knobs are parsed, before anything is written or queued (a data file
/// that is visible there is validated); throws SpecError naming the field and the value.
using LoginCheck = std::function<void(const Knobs&)>;
/// Called on every rank with the model its factory made and the run's knobs, before LoRA, the move to the
/// device and the strategy (lm::causal_lm_training's --activation-checkpointing is one).
using ModelHook = std::function<void(torch::nn::Module&, const Knobs&)>;

}  // namespace hpctrain
