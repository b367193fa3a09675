#pragma once
// Where a language-model run finds its tokenizer: the pretrained model's directory (`lm::from_pretrained`), else
// the one the preparation step kept beside its tokens (`text::prepare_tokens_step`). The export ships its files,
// the sample at the end decodes with it, SFT tokenizes with it; one place says where it is.
#include <algorithm>
#include <filesystem>
#include <optional>
#include <string_view>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/text/prepare_step.hpp>
#include <hpctrain/text/tiktoken.hpp>
#include <hpctrain/train/run_context.hpp>

namespace hpctrain::lm {

/// Where this run's tokenizer files are: the pretrained model's directory, else the preparation's tokens
/// directory (text::prepare_tokens_step keeps its tokenizer there); nothing when neither exists.
inline std::optional<std::filesystem::path> tokenizer_directory(const RunContext& run) {
  if (run.pretrained_dir) return run.pretrained_dir;
  if (run.prepared_dir && std::filesystem::is_directory(*run.prepared_dir / text::prepared_tokens_subdir))
    return *run.prepared_dir / text::prepared_tokens_subdir;
  return std::nullopt;
}

/// The tokenizer file of `directory`: tokenizer.json, else the first *.tiktoken file (in name order).
inline std::optional<std::filesystem::path> tokenizer_file_in(const std::filesystem::path& directory) {
  if (std::filesystem::is_regular_file(directory / "tokenizer.json")) return directory / "tokenizer.json";
  std::vector<std::filesystem::path> candidates;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error))
    if (entry.path().extension() == ".tiktoken") candidates.push_back(entry.path());
  std::sort(candidates.begin(), candidates.end());
  if (candidates.empty()) return std::nullopt;
  return candidates.front();
}

/// The files of a tokenizer directory that an export carries along (tokenizer, its config, chat template).
inline std::vector<std::filesystem::path> tokenizer_files_in(const std::filesystem::path& directory) {
  std::vector<std::filesystem::path> files;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                           "generation_config.json"})
    if (std::filesystem::is_regular_file(directory / name)) files.push_back(directory / name);
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error))
    if (entry.path().extension() == ".tiktoken") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

/// This run's tokenizer, loaded; RuntimeError naming `who` (the hook or source that needs it) when the run has none.
inline text::Tokenizer run_tokenizer(const RunContext& run, std::string_view who) {
  const auto directory = tokenizer_directory(run);
  const auto file = directory ? tokenizer_file_in(*directory) : std::nullopt;
  if (!file)
    throw RuntimeError(errors::runtime_io,
                       fmt::format("{}: this run has no tokenizer (neither a pretrained directory nor prepared "
                                   "tokens{})",
                                   who, directory ? ": " + directory->string() + " holds none" : ""));
  return text::load_tokenizer(*file);
}

}  // namespace hpctrain::lm
