#pragma once
// Pretraining data from the job's preparation step (text::prepare_tokens_step): windows of the prepared
// `train.tokens` / `val.tokens`, the vocabulary the model needs, and the tokenizer kept beside them. The
// worker knows where they are (RunContext::prepared_dir); the program names only the split.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include <hpctrain/error.hpp>
#include <hpctrain/lm/setting.hpp>
#include <hpctrain/text/prepare_step.hpp>
#include <hpctrain/text/token_file.hpp>
#include <hpctrain/train/data/tokens.hpp>
#include <hpctrain/train/run_context.hpp>

namespace hpctrain::lm {

/// The directory the preparation step wrote its token files (and its tokenizer) to.
inline std::filesystem::path prepared_tokens_dir(const RunContext& run) {
  return run.require_prepared_dir("prepared tokens") / text::prepared_tokens_subdir;
}

/// The header of the prepared `train.tokens`: the vocabulary and the tokenizer's fingerprint.
inline text::TokenFileHeader prepared_tokens_header(const RunContext& run) {
  return text::read_token_file_header(prepared_tokens_dir(run) / "train.tokens");
}

/// The vocabulary size of the prepared tokens: what the model's embedding must hold.
inline std::int64_t prepared_vocab_size(const RunContext& run) {
  return static_cast<std::int64_t>(prepared_tokens_header(run).vocab_size);
}

/// `vocabulary` rounded up to a multiple of `multiple`, for a model trained from scratch (Megatron's
/// make_vocab_size_divisible_by, nanoGPT's 50304 for GPT-2's 50257): the head's rows and the logits' row
/// length then align to what the matrix kernels want (on an H100 the unpadded 50257 cost a third of GPT-2
/// 124M's speed, docs/gpu.md). The extra ids are never targets, so training pushes their logits down;
/// generation leaves them out (GenerationOptions::vocabulary), and the export is a model of the padded size,
/// which transformers loads as it is.
inline std::int64_t padded_vocab_size(std::int64_t vocabulary, std::int64_t multiple) {
  return multiple <= 1 ? vocabulary : (vocabulary + multiple - 1) / multiple * multiple;
}

/// The data factory of `prepared_tokens`.
class PreparedTokens {
 public:
  PreparedTokens(std::string split, Setting<std::int64_t> context)
      : split_(std::move(split)), context_(std::move(context)) {}
  data::Source operator()(const RunContext& run) const {
    const auto header = prepared_tokens_header(run);  // every split must come from the tokenizer of train.tokens
    return data::tokens(prepared_tokens_dir(run) / (split_ + ".tokens"), context_.get(run.knobs),
                        data::TokenFileOptions().fingerprint(header.fingerprint));
  }

 private:
  std::string split_;
  Setting<std::int64_t> context_;
};

/// Windows of `context` tokens (a number, or `lm::knob("seq_len")`) of the prepared split `split` ("train" or
/// "val"), each target the next token.
inline PreparedTokens prepared_tokens(std::string split, Setting<std::int64_t> context) {
  return PreparedTokens(std::move(split), std::move(context));
}

}  // namespace hpctrain::lm
