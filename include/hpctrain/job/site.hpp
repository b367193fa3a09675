#pragma once
// Settings that belong to a cluster, not to a program: how this site wants GPUs requested. Sites and
// Slurm versions differ (`--gres=gpu:N` in seeds 001 and 003, `--gpus-per-node=V100:4` in seed 004;
// submitit #1710, torchx #1092/#1100), so a train.cpp need not say: the site default comes from
// `HPCTRAIN_GPU_SYNTAX`, else from a file in the user's home, else `--gpus-per-node`.
//
// The file: `$HPCTRAIN_SITE_CONFIG`, else `$XDG_CONFIG_HOME/hpctrain/site.conf`, else
// `$HOME/.config/hpctrain/site.conf`; lines `key = value`, `#` starts a comment. Keys: `gpu_syntax`; the network
// between nodes, `fabric` (efa, infiniband, ethernet: job/fabric.hpp), `socket_ifname`, `ib_hca`,
// `expected_busbw_gbps`; `cores_per_node` (the default cpus_per_task of jobs on whole nodes or GPUs); and the
// workers' timeouts in seconds, `rendezvous_timeout_s`, `collective_timeout_s`, `checkpoint_timeout_s`; and
// `checkpoint_write_gbps`, the GB/s one node writes to the checkpoints' file system (--plan's time to write one), and
// `short_grace` (warn, refuse: what --submit does with a requeue_on_timeout grace shorter than a save needs).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/job/closest_name.hpp>
#include <hpctrain/job/fabric.hpp>
#include <hpctrain/job/trim.hpp>
#include <hpctrain/names.hpp>

namespace hpctrain {

/// How `gpus_per_node` is written in the script.
enum class GpuSyntax {
  gpus_per_node,  ///< `#SBATCH --gpus-per-node=[type:]N` (Slurm >= 19.05 with select/cons_tres)
  gres,           ///< `#SBATCH --gres=gpu[:type]:N` (every Slurm; the older sites' only way)
};

/// The spelling used by `--gpu-syntax`, the environment and the site file.
inline std::string_view to_string(GpuSyntax syntax) { return syntax == GpuSyntax::gres ? "gres" : "gpus-per-node"; }

/// Parses `gpus-per-node` or `gres`; throws SpecError(`gpu_syntax`) naming `where` the value came from.
inline GpuSyntax parse_gpu_syntax(std::string_view text, std::string_view where = "") {
  if (text == "gpus-per-node") return GpuSyntax::gpus_per_node;
  if (text == "gres") return GpuSyntax::gres;
  throw SpecError("gpu_syntax", text.empty() ? std::string_view("\"\"") : text,
                  where.empty() ? std::string("expected gpus-per-node or gres")
                                : fmt::format("expected gpus-per-node or gres (from {})", where));
}

/// The site's defaults, and where each came from (for messages and the script's header).
struct SiteSettings {
  std::optional<GpuSyntax> gpu_syntax;
  std::string gpu_syntax_source;  ///< `HPCTRAIN_GPU_SYNTAX` or `<file>:<line>`
  /// The network between nodes and what the site knows of it (job/fabric.hpp).
  FabricSettings fabric;
  /// Cores of one compute node (hyperthreads counted as Slurm counts CPUs): the default cpus_per_task of a job
  /// on whole nodes or GPUs is this divided among the node's tasks.
  std::optional<int> cores_per_node;
  /// The workers' timeouts in whole seconds, exported by the script (the submitting shell's values win).
  std::optional<int> rendezvous_timeout_s, collective_timeout_s, checkpoint_timeout_s;
  /// GB/s one node writes to the checkpoints' file system: --plan's time to write a checkpoint.
  std::optional<double> checkpoint_write_gbps;
  /// `short_grace = refuse`: --submit refuses a job whose requeue grace is shorter than the plan's save needs
  /// (default `warn`: it warns and queues).
  bool refuse_short_grace = false;
};

namespace detail {
/// The site file's path by the rule in this header's comment; empty when no home is known.
inline std::filesystem::path site_config_path(
    const std::function<std::optional<std::string>(const std::string&)>& env) {
  if (auto path = env(hpctrain::env::site_config); path && !path->empty()) return *path;
  if (auto config = env("XDG_CONFIG_HOME"); config && !config->empty())
    return std::filesystem::path(*config) / "hpctrain" / "site.conf";
  if (auto home = env("HOME"); home && !home->empty())
    return std::filesystem::path(*home) / ".config" / "hpctrain" / "site.conf";
  return {};
}

inline constexpr std::string_view site_keys[] = {"gpu_syntax",           "fabric",
                                                 "socket_ifname",        "ib_hca",
                                                 "expected_busbw_gbps",  "cores_per_node",
                                                 "rendezvous_timeout_s", "collective_timeout_s",
                                                 "checkpoint_timeout_s", "checkpoint_write_gbps",
                                                 "short_grace"};

/// A positive number of GB/s for site key `key`; SpecError `[hpctrain.spec.site]` naming it and `where`.
inline double site_gbps(const std::string& key, const std::string& value, const std::string& where) {
  char* end = nullptr;
  const double gbps = std::strtod(value.c_str(), &end);
  if (value.empty() || end != value.c_str() + value.size() || !(gbps > 0) || gbps > 1e6)
    throw SpecError(errors::spec_site, fmt::format("{} = {}", key, value),
                    fmt::format("expected a positive number of GB/s ({})", where));
  return gbps;
}

/// A whole number in [1, `max`] for site key `key`; SpecError `[hpctrain.spec.site]` naming it and `where`.
inline int site_positive_integer(std::string_view key, const std::string& value, int max, std::string_view where) {
  std::size_t used = 0;
  long number = 0;
  try {
    number = std::stol(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || number < 1 || number > max)
    throw SpecError(errors::spec_site, fmt::format("{} = {}", key, value),
                    fmt::format("expected a whole number in [1, {}] ({})", max, where));
  return static_cast<int>(number);
}

inline void apply_site_setting(SiteSettings& settings, const std::string& key, const std::string& value,
                               const std::string& where) {
  const auto word = [&] {
    if (value.empty() || value.find_first_of(" \t'\"$`\\") != std::string::npos)
      throw SpecError(errors::spec_site, fmt::format("{} = {}", key, value.empty() ? "\"\"" : value),
                      fmt::format("expected one word ({})", where));
    return value;
  };
  if (key == "gpu_syntax") {
    settings.gpu_syntax = parse_gpu_syntax(value, where);
    settings.gpu_syntax_source = where;
  } else if (key == "fabric") {
    settings.fabric.fabric = parse_fabric(value, where);
    settings.fabric.source = where;
  } else if (key == "socket_ifname") {
    settings.fabric.socket_ifname = word();
  } else if (key == "ib_hca") {
    settings.fabric.ib_hca = word();
  } else if (key == "expected_busbw_gbps") {
    settings.fabric.expected_busbw_gbps = site_gbps(key, value, where);
  } else if (key == "checkpoint_write_gbps") {
    settings.checkpoint_write_gbps = site_gbps(key, value, where);
  } else if (key == "short_grace") {
    if (value != "warn" && value != "refuse")
      throw SpecError(errors::spec_site, fmt::format("{} = {}", key, value.empty() ? "\"\"" : value),
                      fmt::format("expected warn or refuse ({})", where));
    settings.refuse_short_grace = value == "refuse";
  } else if (key == "cores_per_node") {
    settings.cores_per_node = site_positive_integer(key, value, 1 << 16, where);
  } else if (key == "rendezvous_timeout_s") {
    settings.rendezvous_timeout_s = site_positive_integer(key, value, 86400, where);
  } else if (key == "collective_timeout_s") {
    settings.collective_timeout_s = site_positive_integer(key, value, 86400, where);
  } else if (key == "checkpoint_timeout_s") {
    settings.checkpoint_timeout_s = site_positive_integer(key, value, 86400, where);
  } else {
    const auto closest = closest_name(key, site_keys);
    throw SpecError(
        errors::spec_site, fmt::format("site = {}", key),
        fmt::format("unknown setting{}; known: {} ({})", closest ? fmt::format(" (did you mean {}?)", *closest) : "",
                    fmt::join(site_keys, ", "), where));
  }
}

inline void read_site_file(const std::filesystem::path& path, SiteSettings& settings) {
  std::ifstream file(path);
  if (!file) return;  // no file: no site defaults
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    const auto where = fmt::format("{}:{}", path.string(), number);
    const auto text = trim(std::string_view(line).substr(0, line.find('#')));
    if (text.empty()) continue;
    const auto equals = text.find('=');
    if (equals == std::string::npos) throw SpecError("site", text, fmt::format("expected key = value ({})", where));
    apply_site_setting(settings, trim(std::string_view(text).substr(0, equals)),
                       trim(std::string_view(text).substr(equals + 1)), where);
  }
}
}  // namespace detail

/// The site's defaults: the file first, then `HPCTRAIN_GPU_SYNTAX` over it. `env` looks variables up.
inline SiteSettings load_site_settings(const std::function<std::optional<std::string>(const std::string&)>& env) {
  SiteSettings settings;
  if (const auto path = detail::site_config_path(env); !path.empty()) detail::read_site_file(path, settings);
  if (auto syntax = env(hpctrain::env::gpu_syntax); syntax && !syntax->empty()) {
    settings.gpu_syntax = parse_gpu_syntax(*syntax, hpctrain::env::gpu_syntax);
    settings.gpu_syntax_source = hpctrain::env::gpu_syntax;
  }
  return settings;
}

}  // namespace hpctrain
