#pragma once
// Where a rank's run lives and what it starts from, decided on the login side and handed to the worker as values
// (no variable set to talk to oneself). `--resume [DIR]`'s forms live here, once: the run directory it names (or
// the newest run with checkpoints), and how it travels to the workers — first among their arguments,
// `--resume <absolute DIR>` — and is taken off there.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/names.hpp>

namespace hpctrain {

namespace detail {
/// The run directory `--resume DIR` names (DIR absolute), or the newest run under `root` with checkpoints.
/// Throws SpecError `[hpctrain.spec.resume]` when there is none to resume from.
inline std::filesystem::path resume_directory(const std::string& requested, const std::filesystem::path& root) {
  namespace fs = std::filesystem;
  if (!requested.empty()) {
    const fs::path directory = fs::absolute(requested).lexically_normal();
    if (!layout::has_checkpoints(directory))
      throw SpecError(errors::spec_resume, fmt::format("--resume {}", requested),
                      fmt::format("{} holds no checkpoint to resume from", (directory / layout::checkpoints).string()));
    return directory;
  }
  std::optional<fs::path> newest;
  fs::file_time_type newest_time{};
  std::error_code error;
  for (fs::directory_iterator entry(root, error), end; !error && entry != end; entry.increment(error)) {
    if (!entry->is_directory(error) || !layout::has_checkpoints(entry->path())) continue;
    const auto time = fs::last_write_time(entry->path() / layout::checkpoints, error);
    if (!newest || time > newest_time) newest = entry->path(), newest_time = time;
  }
  if (!newest)
    throw SpecError(
        errors::spec_resume, "--resume",
        fmt::format("no run of this program under {} has checkpoints; name one: --resume DIR", root.string()));
  return *newest;
}

/// The workers' arguments with `--resume from` put first (the script's and --local's).
inline std::vector<std::string> with_resume_first(std::vector<std::string> args, const std::filesystem::path& from) {
  args.insert(args.begin(), {std::string(resume_flag), from.string()});
  return args;
}

/// The workers' arguments without the `--resume DIR` with_resume_first put first: a chain's later stage's, which
/// starts from the earlier stages' results, never from the first stage's checkpoints.
inline std::vector<std::string> without_resume(std::vector<std::string> args) {
  if (args.size() >= 2 && args[0] == resume_flag) args.erase(args.begin(), args.begin() + 2);
  return args;
}
}  // namespace detail

/// What a rank was told about its run, besides its knobs: by the login side (where the run lives, what it starts
/// from) and by its launcher (the environment it began with). Empty fields: the rank decides as
/// train/run_directory.hpp says (HPCTRAIN_RUN_DIR from its launcher, else `./hpctrain-run`; a fresh start).
struct RunPlacement {
  /// The run directory, when the login command chose it in this very process (`--run` under the user's srun).
  std::optional<std::filesystem::path> run_dir;
  /// `--resume`'s run directory: the run starts from its newest checkpoint.
  std::optional<std::filesystem::path> resume_from;
  /// The environment the rank began with (its launcher's: the script's, `--local`'s, the user's srun), read once
  /// where worker mode begins (run_job) and passed down: the world, the timeouts, the process group's network, the
  /// preemption signal, the run and stage directories are read from it (train/worker.hpp). Empty for a Trainer a
  /// test builds itself.
  Environment environment;
};

/// Takes `--resume DIR` off the front of a worker's arguments (where the login command put it) into `placement`.
inline std::vector<std::string> take_resume(std::vector<std::string> args, RunPlacement& placement) {
  if (args.size() >= 2 && args[0] == resume_flag) {
    placement.resume_from = std::filesystem::path(args[1]);
    args.erase(args.begin(), args.begin() + 2);
  }
  return args;
}

}  // namespace hpctrain
