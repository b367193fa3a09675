#pragma once
// Masked-LM pretraining data from the job's preparation (seed 002's `preprocess.sh`, then fairseq's masked_lm
// task): the prepared token stream (documents separated by `</s>`, as text::prepare_tokens writes them) grouped
// into blocks as transformers' run_mlm.py `group_texts` does — `<s>`, block_length - 2 tokens, `</s>` — the
// tail that fills no block dropped, so no row needs padding. Each block is masked per epoch
// (lm::mask_tokens: a pure function of seed, epoch and block), in the prefetch thread on the CPU; evaluation
// sees the masks of epoch 0, the same at every evaluation, so val_loss is comparable across a run.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <hpctrain/error.hpp>
#include <hpctrain/lm/at_end.hpp>
#include <hpctrain/lm/masked_lm.hpp>
#include <hpctrain/lm/setting.hpp>
#include <hpctrain/lm/tokens.hpp>
#include <hpctrain/text/tokenizer.hpp>
#include <hpctrain/train/data/tokens.hpp>
#include <hpctrain/train/metrics.hpp>
#include <hpctrain/train/run_context.hpp>

namespace hpctrain::lm {

/// The special tokens a masked-LM run needs, found in its tokenizer by RoBERTa's names.
struct MaskedLmTokens {
  std::int64_t bos = -1, eos = -1, pad = -1, mask = -1;
  std::int64_t vocab_size = 0;
  std::set<std::int64_t> special;  ///< every special added token: never masked, never drawn

  /// RuntimeError naming the tokenizer and the missing token (`<s>`, `</s>`, `<pad>`, `<mask>`).
  static MaskedLmTokens of(const text::Tokenizer& tokenizer) {
    MaskedLmTokens tokens;
    auto id = [&](const char* name) -> std::int64_t {
      if (const auto found = tokenizer.token_id(name)) return static_cast<std::int64_t>(*found);
      throw RuntimeError(errors::runtime_masked_lm,
                         fmt::format("{}: has no {} token; a masked-LM tokenizer needs <s>, </s>, <pad> and <mask> "
                                     "(RoBERTa's added tokens)",
                                     tokenizer.source(), name));
    };
    tokens.bos = id("<s>"), tokens.eos = id("</s>"), tokens.pad = id("<pad>"), tokens.mask = id("<mask>");
    tokens.vocab_size = static_cast<std::int64_t>(tokenizer.vocab_size());
    for (const auto& added : tokenizer.added_tokens())
      if (added.special) tokens.special.insert(static_cast<std::int64_t>(added.id));
    return tokens;
  }
};

/// Blocks of a token file, masked per epoch: inputs are the masked ids [n, block_length], targets the labels
/// (the original id at chosen positions, lm::ignore_index elsewhere).
class MaskedBlocks : public data::Dataset {
 public:
  /// `windows` holds the stream cut into block_length - 2 tokens (data::tokens with that context).
  MaskedBlocks(std::shared_ptr<const data::TokenDataset> windows, std::int64_t bos, std::int64_t eos,
               MaskingOptions masking)
      : windows_(std::move(windows)), bos_(bos), eos_(eos), masking_(std::move(masking)) {
    masking_.validate();
  }
  std::int64_t size() const override { return windows_->size(); }
  data::Batch batch(const std::vector<std::int64_t>& indices) const override { return batch_in_epoch(indices, 0); }
  data::Batch batch_in_epoch(const std::vector<std::int64_t>& indices, std::int64_t epoch) const override {
    const auto body = windows_->batch(indices).inputs;  // [n, block_length - 2]
    const auto n = body.size(0);
    const auto blocks =
        torch::cat({torch::full({n, 1}, bos_, torch::kInt64), body, torch::full({n, 1}, eos_, torch::kInt64)}, 1);
    std::vector<torch::Tensor> inputs, labels;
    for (std::int64_t row = 0; row < n; ++row) {
      auto [masked, label] = mask_tokens(blocks[row], masking_, epoch, indices[static_cast<std::size_t>(row)]);
      inputs.push_back(std::move(masked));
      labels.push_back(std::move(label));
    }
    return {torch::stack(inputs), torch::stack(labels)};
  }

 private:
  std::shared_ptr<const data::TokenDataset> windows_;
  std::int64_t bos_, eos_;
  MaskingOptions masking_;
};

/// The tokenizer the preparation step kept beside its tokens.
inline text::Tokenizer prepared_tokenizer(const RunContext& run) {
  const auto file = tokenizer_file_in(prepared_tokens_dir(run));
  if (!file)
    throw RuntimeError(errors::runtime_masked_lm,
                       fmt::format("{}: holds no tokenizer file (tokenizer.json)", prepared_tokens_dir(run).string()));
  return text::load_tokenizer(*file);
}

/// The data factory of `prepared_masked_blocks`.
class PreparedMaskedBlocks {
 public:
  PreparedMaskedBlocks(std::string split, Setting<std::int64_t> block_length, MaskingOptions masking)
      : split_(std::move(split)), block_length_(std::move(block_length)), masking_(std::move(masking)) {}
  data::Source operator()(const RunContext& run) const {
    const auto length = block_length_.get(run.knobs);
    hpctrain::detail::require(length >= 3, "masking.block_length", length, "must hold <s>, a token and </s>");
    const auto header = prepared_tokens_header(run);
    const auto tokens = MaskedLmTokens::of(prepared_tokenizer(run));
    auto masking = masking_;
    masking.mask_id = tokens.mask, masking.vocab_size = tokens.vocab_size, masking.special_ids = tokens.special;
    const auto path = prepared_tokens_dir(run) / (split_ + ".tokens");
    return data::Source(
        [=] {
          auto windows = std::make_shared<data::TokenDataset>(path, length - 2,
                                                              data::TokenFileOptions().fingerprint(header.fingerprint));
          return std::make_shared<MaskedBlocks>(std::move(windows), tokens.bos, tokens.eos, masking);
        },
        fmt::format("masked blocks of {} ({} tokens)", path.string(), length));
  }

 private:
  std::string split_;
  Setting<std::int64_t> block_length_;
  MaskingOptions masking_;
};

/// Blocks of `block_length` tokens (a number, or `lm::knob("max_length")`) of the prepared split `split`
/// ("train" or "val"), masked per epoch as `masking` says (RoBERTa's 15% / 80-10-10 by default; the <mask> id,
/// the vocabulary and the special tokens come from the prepared tokenizer).
inline PreparedMaskedBlocks prepared_masked_blocks(std::string split, Setting<std::int64_t> block_length,
                                                   MaskingOptions masking = {}) {
  return PreparedMaskedBlocks(std::move(split), std::move(block_length), std::move(masking));
}

/// Accuracy on the masked positions (the counted targets): how often the arg-max is the original token.
inline const metrics::Metric masked_accuracy{
    "masked_accuracy", [](const metrics::Input& in) {
      const auto targets = in.batch.targets.reshape({-1});
      const auto counted = targets.ne(ignore_index);
      const auto hits = in.output.reshape({-1, in.output.size(-1)}).argmax(-1).eq(targets).logical_and(counted);
      return metrics::Sums{hits.sum().to(torch::kFloat64), counted.sum().to(torch::kFloat64)};
    }};

}  // namespace hpctrain::lm
