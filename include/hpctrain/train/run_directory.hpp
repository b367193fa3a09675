#pragma once
// Which directory a run writes into, and whether it starts from a checkpoint (issue 8, item 7: runs that do
// what the user means). The launchers decide the directory: the sbatch script sets HPCTRAIN_RUN_DIR to the
// job's directory (`hpctrain-jobs/<name>/<job id>`, the same again when Slurm requeues the job) and
// `--local` to a new `hpctrain-jobs/<name>/local-<time>` per run. A run resumes
//   - from its own directory when that already holds checkpoints: a requeued job, or a directory the user
//     named again (Training::run_dir, HPCTRAIN_RUN_DIR) — it is the same run;
//   - else from the directory `--resume [DIR]` chose (RunPlacement::resume_from, job/run_placement.hpp), writing
//     into its own new one, so that DIR stays as it was;
//   - else not at all.
// Torch-free: the trainer calls `resolve_run_directory` once at setup.
#include <filesystem>
#include <optional>
#include <string>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/job/run_placement.hpp>
#include <hpctrain/names.hpp>

namespace hpctrain {

/// Where a run writes, and the run directory whose newest checkpoint it starts from.
struct RunDirectory {
  std::filesystem::path path;                        ///< checkpoints/, metrics.jsonl, tensorboard/
  std::optional<std::filesystem::path> resume_from;  ///< a run directory with checkpoints, or none: start fresh

  /// The checkpoint directory to load from: `<resume_from>/checkpoints`, or this run's own (empty) one.
  std::filesystem::path checkpoints_to_resume() const {
    return (resume_from ? *resume_from : path) / layout::checkpoints;
  }
  /// One line for the log: where the run writes and what it starts from.
  std::string describe() const {
    if (!resume_from) return fmt::format("run directory {} (a new run)", path.string());
    if (*resume_from == path) return fmt::format("run directory {} (continues its own checkpoints)", path.string());
    return fmt::format("run directory {} (starts from the newest checkpoint of {})", path.string(),
                       resume_from->string());
  }
};

/// The run directory for a description's `configured` one (Training::run_dir, when set), else the one the login
/// side placed the rank in, else HPCTRAIN_RUN_DIR of the environment it began with (its launcher's, in the
/// placement), else `<cwd>/hpctrain-run`; resuming as the
/// header comment says. Throws RuntimeError `[hpctrain.runtime.run_directory]` when `--resume` names a directory
/// without checkpoints.
inline RunDirectory resolve_run_directory(const std::optional<std::filesystem::path>& configured,
                                          const RunPlacement& placement = {}) {
  RunDirectory run;
  if (configured) run.path = *configured;
  else if (placement.run_dir) run.path = *placement.run_dir;
  else if (auto from_launcher = placement.environment.get(env::run_dir)) run.path = *from_launcher;
  else run.path = std::filesystem::current_path() / layout::default_run;
  if (layout::has_checkpoints(run.path)) {
    run.resume_from = run.path;
  } else if (const auto& requested = placement.resume_from) {
    if (!layout::has_checkpoints(*requested))
      throw RuntimeError(errors::runtime_run_directory,
                         fmt::format("--resume {}: {} holds no checkpoint", requested->string(),
                                     (*requested / layout::checkpoints).string()));
    run.resume_from = *requested;
  }
  return run;
}

}  // namespace hpctrain
