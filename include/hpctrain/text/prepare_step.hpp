#pragma once
// Token preparation as the job's preparation step (job/prepare.hpp): `Job::prepare(prepare_tokens_step(...))`
// runs prepare_tokens once per job, on one task with all of its CPUs, before any training rank starts, and
// leaves `train.tokens`/`val.tokens` in `$HPCTRAIN_RUN_DIR/prepare/tokens/` for every rank to read. A requeued
// job skips the step (the script's prepare.done marker); run again by hand, it skips the work when the files
// are already those it would write (tokens_prepared). A tokenizer or input that cannot be read fails the
// step, and with it the job, before training.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/files.hpp>
#include <hpctrain/job/prepare.hpp>
#include <hpctrain/text/prepare.hpp>
#include <hpctrain/text/tiktoken.hpp>

namespace hpctrain::text {

/// The directory below `$HPCTRAIN_RUN_DIR/prepare` where prepare_tokens_step writes.
inline constexpr std::string_view prepared_tokens_subdir = "tokens";

/// Copies the tokenizer file next to the tokens it made (atomically), with the configuration files transformers
/// saves beside a tokenizer.json (tokenizer_config.json, special_tokens_map.json: which token is <mask>, <pad>),
/// so that the workers know it without being told: the export at the end ships it with the model, the sample
/// at the end decodes with it.
inline void keep_tokenizer_beside(const std::filesystem::path& tokenizer_file, const std::filesystem::path& out) {
  auto copy = [&out](const std::filesystem::path& file) {
    hpctrain::detail::write_file_atomically(out / file.filename(), hpctrain::detail::read_file(file));
  };
  copy(tokenizer_file);
  if (tokenizer_file.filename() != "tokenizer.json") return;
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"})
    if (std::filesystem::is_regular_file(tokenizer_file.parent_path() / name))
      copy(tokenizer_file.parent_path() / name);
}

/// The regular files of `directory` in name order — symbolic links and files with an extension in
/// `skip_extensions` left out (fortune's ".dat" indexes and ".u8" links, say): a corpus directory as
/// prepare_tokens_step takes it. SpecError `[hpctrain.spec.prepare.inputs]` when it is no directory.
inline std::vector<std::filesystem::path> corpus_files(const std::filesystem::path& directory,
                                                       const std::vector<std::string>& skip_extensions = {}) {
  hpctrain::detail::require(std::filesystem::is_directory(directory), "prepare.inputs", directory.string(),
                            "no such directory");
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    const auto extension = entry.path().extension().string();
    if (entry.is_regular_file() && !entry.is_symlink() &&
        std::find(skip_extensions.begin(), skip_extensions.end(), extension) == skip_extensions.end())
      files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

/// A Job::prepare function that tokenizes `inputs` with the tokenizer in `tokenizer_file` (tokenizer.json or
/// *.tiktoken): text files, or datasets with PrepareOptions::text_column. Missing files are a SpecError at once
/// (`[hpctrain.spec.prepare.tokenizer]`, `[hpctrain.spec.prepare.inputs]`): `--submit` refuses the job before
/// anything is queued.
inline PrepareFunction prepare_tokens_step(std::vector<std::filesystem::path> inputs,
                                           std::filesystem::path tokenizer_file, PrepareOptions options = {}) {
  hpctrain::detail::require(std::filesystem::is_regular_file(tokenizer_file), "prepare.tokenizer",
                            tokenizer_file.string(), "no such file");
  hpctrain::detail::require(!inputs.empty(), "prepare.inputs", "[]", "needs at least one text file");
  for (auto& input : inputs) {
    hpctrain::detail::require(detail::input_present(input, options), "prepare.inputs", input.string(), "no such file");
    input = std::filesystem::absolute(input);
  }
  tokenizer_file = std::filesystem::absolute(tokenizer_file);
  return
      [inputs = std::move(inputs), tokenizer_file = std::move(tokenizer_file), options](const PrepareContext& context) {
        const auto tokenizer = load_tokenizer(tokenizer_file);
        const auto out = context.output_dir / prepared_tokens_subdir;
        if (tokens_prepared(inputs, tokenizer, out, options)) {
          keep_tokenizer_beside(tokenizer_file, out);
          std::printf("hpctrain: %s already holds these tokens; not preparing again\n", out.c_str());
          return;
        }
        const auto result = prepare_tokens(inputs, tokenizer, out, options);
        keep_tokenizer_beside(tokenizer_file, out);
        std::printf("hpctrain: prepared %llu training and %llu validation tokens in %s (%.1f MB/s on %d threads)\n",
                    static_cast<unsigned long long>(result.train_tokens),
                    static_cast<unsigned long long>(result.validation_tokens), out.c_str(),
                    result.megabytes_per_second(), result.threads);
        std::fflush(stdout);
      };
}

/// In a worker of a job whose preparation was prepare_tokens_step: the directory holding train.tokens and
/// val.tokens (`$HPCTRAIN_RUN_DIR/prepare/tokens`; under `--local`, `$HPCTRAIN_PREPARE_DIR/tokens`, since each
/// local run has its own run directory while the preparation ran once in `hpctrain-jobs/<name>/local`), as
/// `environment` (the worker's) says.
inline std::filesystem::path prepared_tokens_dir(const Environment& environment) {
  const auto output = prepared_output_dir(environment);
  if (!output)
    throw RuntimeError(errors::runtime_text_prepare,
                       "HPCTRAIN_RUN_DIR is not set: prepared tokens exist only inside a job");
  return *output / prepared_tokens_subdir;
}

}  // namespace hpctrain::text
