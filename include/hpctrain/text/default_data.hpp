#pragma once
// The data the examples train on when nothing else is named: Debian's fortunes as the corpus, and the tokenizers
// scripts/setup leaves in hpctrain's cache (~/.cache/hpctrain). An environment variable names another corpus or
// tokenizer (names.hpp); what is missing is a SpecError naming the file, the variable and how to make it, raised
// while main builds the job, so `--submit` refuses before anything is queued. `--data` names another corpus for a
// run (Corpus below): text files, or a Hugging Face dataset's text column. Torch-free.
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/job/prepare.hpp>
#include <hpctrain/job/setting.hpp>
#include <hpctrain/names.hpp>
#include <hpctrain/text/prepare.hpp>
#include <hpctrain/text/prepare_step.hpp>
#include <hpctrain/text/rows.hpp>

namespace hpctrain::text {

/// Debian's fortunes (package `fortunes`): plain-text files of `%`-separated entries, about 2.5 MB.
inline constexpr std::string_view fortunes_directory = "/usr/share/games/fortunes";

/// The text files of the directory $HPCTRAIN_CORPUS names, else of Debian's fortunes; `.dat` files (fortune's
/// indexes) and symbolic links left out. SpecError `[hpctrain.spec.prepare.inputs]` naming the directory.
/// The examples' defaults in this file read the environment of the process that asks (the program's main, its
/// preparation step), as a user's own code would: they are the program's, not the library's, inputs.
inline std::vector<std::filesystem::path> default_corpus() {
  const auto named = Environment::of_this_process().get(env::corpus);
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

/// The corpus a pretraining run prepares, from the program or from knobs (`corpus_knobs()`): `data` a directory of
/// text files, a text file, or a Hugging Face dataset on disk (a `.parquet`/`.arrow` file, a directory of Parquet
/// shards, a `save_to_disk` folder: read through hpctrain::datasets); empty: default_corpus(). `text_column`: the
/// dataset's column of documents (text files ignore it).
struct Corpus {
  Setting<std::string> data = std::string();
  Setting<std::string> text_column = std::string("text");
};

/// `--data` and `--text-column`, declared for a program that pretrains on a corpus of the user's choice.
inline Corpus corpus_knobs() {
  return {knob("data", "",
               "corpus: a directory of text files, a Parquet file, a directory of Parquet shards or a save_to_disk "
               "folder (default: Debian's fortunes, or $HPCTRAIN_CORPUS)"),
          knob("text_column", "text", "the column of documents when --data is a dataset")};
}

/// What a Corpus reads for this run: its inputs, and the column of documents ("" for text files).
struct CorpusInputs {
  std::vector<std::filesystem::path> inputs;
  std::string text_column;
};

namespace detail {
/// Whether `path` is a dataset rather than text: a `.parquet`/`.arrow` file, or a directory with a Parquet or Arrow
/// file or a `state.json` (save_to_disk) below it.
inline bool holds_dataset(const std::filesystem::path& path) {
  const auto dataset_file = [](const std::filesystem::path& file) {
    return file.extension() == ".parquet" || file.extension() == ".arrow" || file.filename() == "state.json";
  };
  if (!std::filesystem::is_directory(path)) return dataset_file(path);
  for (const auto& file : files_on_disk(path))
    if (dataset_file(file)) return true;
  return false;
}
}  // namespace detail

/// The inputs of `corpus` with this run's knob values. SpecError `[hpctrain.spec.prepare.inputs]` naming what is
/// missing.
inline CorpusInputs corpus_inputs(const Corpus& corpus, const Knobs& knobs) {
  const std::filesystem::path data = corpus.data.get(knobs);
  if (data.empty()) return {default_corpus(), ""};
  if (!std::filesystem::exists(data))
    throw SpecError(errors::spec_prepare_inputs, data.string(), "no such file or directory");
  if (detail::holds_dataset(data)) return {{std::filesystem::absolute(data)}, corpus.text_column.get(knobs)};
  if (std::filesystem::is_directory(data)) {
    auto files = corpus_files(data, {".dat"});
    if (files.empty()) throw SpecError(errors::spec_prepare_inputs, data.string(), "holds no text files");
    for (auto& file : files) file = std::filesystem::absolute(file);
    return {files, ""};
  }
  return {{std::filesystem::absolute(data)}, ""};
}

namespace detail {
/// The login node's look at a dataset corpus: its first document reads (the files open, the column is there and
/// holds text). SpecError `[hpctrain.spec.prepare.inputs]` naming the file and the reason.
inline void check_corpus_dataset(const CorpusInputs& corpus) {
  for (const auto& input : corpus.inputs) {
    try {
      const auto rows = open_rows(input, {corpus.text_column});
      nlohmann::ordered_json row;
      if (!rows->next(row)) throw SpecError(errors::spec_prepare_inputs, input.string(), "holds no rows");
      row_document(row, *rows, corpus.text_column);
    } catch (const RuntimeError& error) {
      throw SpecError(errors::spec_prepare_inputs, input.string(), error.what());
    }
  }
}
}  // namespace detail

/// A Job::prepare step that tokenizes `corpus` (its knobs' values for the run) with the tokenizer in
/// `tokenizer_file`, as the step above does with files. The login node resolves the corpus and reads a dataset's
/// first row before anything is queued: a missing corpus, column or a file that does not read exits 2.
inline PrepareStep prepare_tokens_step(Corpus corpus, std::filesystem::path tokenizer_file,
                                       PrepareOptions options = {}) {
  hpctrain::detail::require(std::filesystem::is_regular_file(tokenizer_file), "prepare.tokenizer",
                            tokenizer_file.string(), "no such file");
  tokenizer_file = std::filesystem::absolute(tokenizer_file);
  auto check = [corpus](const Knobs& knobs) {
    const auto inputs = corpus_inputs(corpus, knobs);
    if (!inputs.text_column.empty()) detail::check_corpus_dataset(inputs);
  };
  auto run = [corpus, tokenizer_file, options](const PrepareContext& context) {
    auto inputs = corpus_inputs(corpus, context.knobs);
    auto read = options;
    if (!inputs.text_column.empty()) read.text_column(inputs.text_column);
    prepare_tokens_step(std::move(inputs.inputs), tokenizer_file, read)(context);
  };
  return {run, check};
}

/// The tokenizer file `variable` names, else `name` in hpctrain's cache, `$HOME/.cache/hpctrain/<name>`.
/// SpecError `[hpctrain.spec.prepare.tokenizer]` naming the file (or the unset HOME), the variable and scripts/setup.
inline std::filesystem::path cached_tokenizer(std::string_view name, const char* variable) {
  const auto environment = Environment::of_this_process();
  if (const auto named = environment.get(variable)) {
    if (!std::filesystem::is_regular_file(*named))
      throw SpecError(errors::spec_prepare_tokenizer, *named, fmt::format("no such file (from {})", variable));
    return *named;
  }
  const auto home = environment.get("HOME");
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
