#pragma once
// The data the examples train on when nothing else is named: Debian's fortunes as the corpus, and the tokenizers
// scripts/setup leaves in hpctrain's cache (~/.cache/hpctrain). An environment variable names another corpus or
// tokenizer (names.hpp); what is missing is a SpecError naming the file, the variable and how to make it, raised
// while main builds the job, so `--submit` refuses before anything is queued. Torch-free.
#include <filesystem>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/names.hpp>
#include <hpctrain/text/prepare_step.hpp>

namespace hpctrain::text {

/// Debian's fortunes (package `fortunes`): plain-text files of `%`-separated entries, about 2.5 MB.
inline constexpr std::string_view fortunes_directory = "/usr/share/games/fortunes";

/// The text files of the directory $HPCTRAIN_CORPUS names, else of Debian's fortunes; `.dat` files (fortune's
/// indexes) and symbolic links left out. SpecError `[hpctrain.spec.prepare.inputs]` naming the directory.
inline std::vector<std::filesystem::path> default_corpus() {
  const auto named = hpctrain::getenv(env::corpus);
  const std::filesystem::path directory =
      named ? std::filesystem::path(*named) : std::filesystem::path(fortunes_directory);
  if (!std::filesystem::is_directory(directory))
    throw SpecError(
        errors::spec_prepare_inputs, directory.string(),
        named ? fmt::format("no such directory (from {})", env::corpus)
              : fmt::format("no such directory: install Debian's fortunes, or set {} to a directory of text files",
                            env::corpus));
  return corpus_files(directory, {".dat"});
}

/// The tokenizer file `variable` names, else `name` in hpctrain's cache, `$HOME/.cache/hpctrain/<name>`.
/// SpecError `[hpctrain.spec.prepare.tokenizer]` naming the file (or the unset HOME), the variable and scripts/setup.
inline std::filesystem::path cached_tokenizer(std::string_view name, const char* variable) {
  if (const auto named = hpctrain::getenv(variable)) {
    if (!std::filesystem::is_regular_file(*named))
      throw SpecError(errors::spec_prepare_tokenizer, *named, fmt::format("no such file (from {})", variable));
    return *named;
  }
  const auto home = hpctrain::getenv("HOME");
  if (!home)
    throw SpecError(errors::spec_prepare_tokenizer, fmt::format("~/.cache/hpctrain/{}", name),
                    fmt::format("HOME is not set; set {} to the tokenizer file", variable));
  const auto file = std::filesystem::path(*home) / ".cache/hpctrain" / name;
  if (!std::filesystem::is_regular_file(file))
    throw SpecError(errors::spec_prepare_tokenizer, file.string(),
                    fmt::format("no such file: scripts/setup makes it, or set {} to another tokenizer file", variable));
  return file;
}

/// GPT-2's byte-level BPE ranks (`gpt2.tiktoken`, from openai-whisper's sdist), or $HPCTRAIN_GPT_TOKENIZER.
inline std::filesystem::path gpt2_tokenizer() { return cached_tokenizer("gpt2.tiktoken", env::gpt2_tokenizer); }

/// A RoBERTa tokenizer trained on the fortunes (`roberta-fortunes/tokenizer.json`, with <s> </s> <pad> <mask>), or
/// $HPCTRAIN_ROBERTA_TOKENIZER (roberta-base's tokenizer.json, say).
inline std::filesystem::path roberta_tokenizer() {
  return cached_tokenizer("roberta-fortunes/tokenizer.json", env::roberta_tokenizer);
}

}  // namespace hpctrain::text
