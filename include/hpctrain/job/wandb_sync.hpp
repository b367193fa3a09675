#pragma once
// `./train --wandb-sync [RUN_DIR]` on the login node: uploads the W&B offline runs that `--wandb` left under the
// last job's run directory (or RUN_DIR) with `wandb sync`, the login node being the one with internet. Where
// `wandb` is not on PATH it prints the exact command to run elsewhere. The command is run by fork/exec with an
// argv vector (job/process.hpp): no shell sees a path. Torch-free.
#include <algorithm>
#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join
#include <unistd.h>      // access: is it executable

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/job/process.hpp>
#include <hpctrain/job/shell.hpp>
#include <hpctrain/names.hpp>

namespace hpctrain {

/// The offline W&B runs under `directory`: every `wandb/offline-run-*` of the directory itself or of a run
/// directory below it (an array's tasks, `<job dir>/<array id>_<task>/`), at most three levels down, by path
/// (their names start with their start time).
inline std::vector<std::filesystem::path> find_offline_wandb_runs(const std::filesystem::path& directory) {
  namespace fs = std::filesystem;
  std::vector<fs::path> runs;
  std::error_code error;
  for (fs::recursive_directory_iterator it(directory, fs::directory_options::skip_permission_denied, error), end;
       !error && it != end; it.increment(error)) {
    if (!it->is_directory(error)) continue;
    const auto name = it->path().filename().string();
    if (name.starts_with(layout::wandb_offline_run_prefix) &&
        it->path().parent_path().filename().string() == layout::wandb) {
      runs.push_back(it->path());
      it.disable_recursion_pending();
    } else if (it.depth() >= 3 || name == layout::checkpoints) {
      it.disable_recursion_pending();
    }
  }
  std::sort(runs.begin(), runs.end());
  return runs;
}

/// The file `name` is found as on the PATH of `environment` (executable), if it is.
inline std::optional<std::filesystem::path> find_on_path(std::string_view name, const Environment& environment) {
  const auto path = environment.get("PATH");
  if (!path) return std::nullopt;
  std::string_view rest = *path;
  while (true) {
    const auto colon = rest.find(':');
    const std::string_view entry = rest.substr(0, colon);
    const auto candidate = std::filesystem::path(entry.empty() ? "." : std::string(entry)) / std::string(name);
    if (::access(candidate.c_str(), X_OK) == 0 && !std::filesystem::is_directory(candidate)) return candidate;
    if (colon == std::string_view::npos) return std::nullopt;
    rest.remove_prefix(colon + 1);
  }
}

/// `wandb sync <run>...`: the offline runs of a requeued job share a run id and are uploaded into one run, in
/// order of their start times; runs synced before are skipped (wandb marks them `.wandb.synced`).
inline std::vector<std::string> wandb_sync_command(const std::vector<std::filesystem::path>& runs) {
  std::vector<std::string> argv = {"wandb", "sync"};
  for (const auto& run : runs) argv.push_back(std::filesystem::absolute(run).lexically_normal().string());
  return argv;
}

/// `--wandb-sync`: uploads the offline runs under `run_directory` with `wandb sync` and returns its exit code, or
/// prints the command on `out` (and why on `err`) and returns exit_failure where `wandb` is not on the PATH of
/// `environment` (the login shell's, in which it runs). Throws RuntimeError `[hpctrain.runtime.wandb]` when there is
/// no offline run to upload.
inline int wandb_sync(const std::filesystem::path& run_directory, std::ostream& out, std::ostream& err,
                      const Environment& environment) {
  const auto runs = find_offline_wandb_runs(run_directory);
  if (runs.empty())
    throw RuntimeError(
        errors::runtime_wandb,
        fmt::format("no W&B offline run under {} (train with --wandb [PROJECT] to write one)", run_directory.string()));
  const auto argv = wandb_sync_command(runs);
  std::vector<std::string> quoted;
  for (const auto& arg : argv) quoted.push_back(shell_quote(arg));
  const auto command = fmt::format("{}", fmt::join(quoted, " "));
  const auto wandb = find_on_path("wandb", environment);
  if (!wandb) {
    err << "hpctrain: wandb is not on PATH here; where it is (pip install wandb, and `wandb login` once), run:\n";
    out << command << "\n";
    return exit_failure;
  }
  err << fmt::format("hpctrain: uploading {} offline run(s): {}\n", runs.size(), command) << std::flush;
  out << std::flush;
  auto found = argv;
  found.front() = wandb->string();  // found on the shell's PATH, which exec does not search
  return run_attached(found, environment);
}

}  // namespace hpctrain
