#pragma once
// The Slurm release the cluster runs, from `sbatch --version`, and the flags that changed between releases.
// Read once per process (one submission; a chain's stages share it). Rendering without a version (a dry run
// on a laptop, the golden tests) keeps the flags that every release since 22.05 accepts.
#include <charconv>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <hpctrain/job/process.hpp>

namespace hpctrain {

/// A Slurm release: 22.05, 23.11, 24.11...
struct SlurmVersion {
  int major = 0, minor = 0, patch = 0;
  constexpr auto operator<=>(const SlurmVersion&) const = default;
  std::string str() const { return fmt::format("{}.{:02}.{}", major, minor, patch); }
};

/// Parses what `sbatch --version` prints: `slurm 23.11.4`, `slurm-wlm 22.05.8` (Debian), `slurm 24.11.0-0rc1`.
/// Empty when the text holds no version.
inline std::optional<SlurmVersion> parse_slurm_version(std::string_view text) {
  const auto space = text.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  text.remove_prefix(space + 1);
  SlurmVersion version;
  int* parts[] = {&version.major, &version.minor, &version.patch};
  for (int i = 0; i < 3; ++i) {
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *parts[i]);
    if (error != std::errc()) return i >= 2 ? std::optional(version) : std::nullopt;
    text.remove_prefix(static_cast<std::size_t>(end - text.data()));
    if (i < 2) {
      if (text.empty() || text.front() != '.') return i >= 1 ? std::optional(version) : std::nullopt;
      text.remove_prefix(1);
    }
  }
  return version;
}

/// The cluster's release, asked once per process (`sbatch --version`); empty where sbatch is missing or
/// says something else.
inline std::optional<SlurmVersion> cluster_slurm_version() {
  static const std::optional<SlurmVersion> version = []() -> std::optional<SlurmVersion> {
    try {
      const auto result = run_process({"sbatch", "--version"});
      if (result.exit_code != 0) return std::nullopt;
      return parse_slurm_version(result.out);
    } catch (const Error&) {
      return std::nullopt;  // no sbatch here
    }
  }();
  return version;
}

/// The flags that depend on the release.
struct SlurmFlags {
  /// 23.11 refuses `--gpus-per-task` (or `--tres-per-task`) without `--gpus` or a task count: "--gpus-per-task
  /// or --tres-per-task used without either --gpus or -n/--ntasks is not allowed" (torchx #1100); 22.05
  /// derived the count from `--nodes x --ntasks-per-node`. Rendered: `#SBATCH --ntasks=<nodes x tasks per node>`.
  bool gpus_per_task_needs_ntasks = false;
};

/// The flags for `version`; without one, those of the oldest release supported (22.05).
inline SlurmFlags slurm_flags(const std::optional<SlurmVersion>& version) {
  SlurmFlags flags;
  if (!version) return flags;
  flags.gpus_per_task_needs_ntasks = *version >= SlurmVersion{23, 11, 0};
  return flags;
}

}  // namespace hpctrain
