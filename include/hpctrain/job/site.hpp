#pragma once
// Settings that belong to a cluster, not to a program: how this site wants GPUs requested. Sites and
// Slurm versions differ (`--gres=gpu:N` in seeds 001 and 003, `--gpus-per-node=V100:4` in seed 004;
// submitit #1710, torchx #1092/#1100), so a train.cpp need not say: the site default comes from
// `HPCTRAIN_GPU_SYNTAX`, else from a file in the user's home, else `--gpus-per-node`.
//
// The file: `$HPCTRAIN_SITE_CONFIG`, else `$XDG_CONFIG_HOME/hpctrain/site.conf`, else
// `$HOME/.config/hpctrain/site.conf`; lines `key = value`, `#` starts a comment. Keys: `gpu_syntax`.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <hpctrain/error.hpp>

namespace hpctrain {

/// How `gpus_per_node` is written in the script.
enum class GpuSyntax {
  gpus_per_node,  ///< `#SBATCH --gpus-per-node=[type:]N` (Slurm >= 19.05 with select/cons_tres)
  gres,           ///< `#SBATCH --gres=gpu[:type]:N` (every Slurm; the older sites' only way)
};

/// The spelling used by `--gpu-syntax`, the environment and the site file.
inline std::string_view to_string(GpuSyntax syntax) {
  return syntax == GpuSyntax::gres ? "gres" : "gpus-per-node";
}

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
};

namespace detail {
inline std::string trim_blanks(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return "";
  const auto last = text.find_last_not_of(" \t\r");
  return std::string(text.substr(first, last - first + 1));
}

/// The site file's path by the rule in this header's comment; empty when no home is known.
inline std::filesystem::path site_config_path(const std::function<std::optional<std::string>(const std::string&)>& env) {
  if (auto path = env("HPCTRAIN_SITE_CONFIG"); path && !path->empty()) return *path;
  if (auto config = env("XDG_CONFIG_HOME"); config && !config->empty())
    return std::filesystem::path(*config) / "hpctrain" / "site.conf";
  if (auto home = env("HOME"); home && !home->empty())
    return std::filesystem::path(*home) / ".config" / "hpctrain" / "site.conf";
  return {};
}

inline void read_site_file(const std::filesystem::path& path, SiteSettings& settings) {
  std::ifstream file(path);
  if (!file) return;  // no file: no site defaults
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    const auto where = fmt::format("{}:{}", path.string(), number);
    const auto text = trim_blanks(std::string_view(line).substr(0, line.find('#')));
    if (text.empty()) continue;
    const auto equals = text.find('=');
    if (equals == std::string::npos)
      throw SpecError("site", text, fmt::format("expected key = value ({})", where));
    const auto key = trim_blanks(std::string_view(text).substr(0, equals));
    const auto value = trim_blanks(std::string_view(text).substr(equals + 1));
    if (key == "gpu_syntax") {
      settings.gpu_syntax = parse_gpu_syntax(value, where);
      settings.gpu_syntax_source = where;
    } else {
      throw SpecError("site", key, fmt::format("unknown setting; known: gpu_syntax ({})", where));
    }
  }
}
}  // namespace detail

/// The site's defaults: the file first, then `HPCTRAIN_GPU_SYNTAX` over it. `env` looks variables up.
inline SiteSettings load_site_settings(const std::function<std::optional<std::string>(const std::string&)>& env) {
  SiteSettings settings;
  if (const auto path = detail::site_config_path(env); !path.empty()) detail::read_site_file(path, settings);
  if (auto syntax = env("HPCTRAIN_GPU_SYNTAX"); syntax && !syntax->empty()) {
    settings.gpu_syntax = parse_gpu_syntax(*syntax, "HPCTRAIN_GPU_SYNTAX");
    settings.gpu_syntax_source = "HPCTRAIN_GPU_SYNTAX";
  }
  return settings;
}

}  // namespace hpctrain
