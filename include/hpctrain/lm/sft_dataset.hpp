#pragma once
// Tokenized fine-tuning examples as a dataset (lm/sft.hpp reads them from JSONL): one example per row,
// right-padded, or several per row when packed — with the fields "position_ids" (restarting at 0 for
// every example) and "document_ids" that keep attention within each example (models::TokenLayout).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include <hpctrain/lm/loss.hpp>
#include <hpctrain/text/sft_example.hpp>
#include <hpctrain/train/data/source.hpp>

namespace hpctrain::lm {

/// Tokenized examples as a dataset: one example per item, or (packed) one row of several examples per item.
class SftDataset : public data::Dataset {
 public:
  SftDataset(std::vector<text::SftExample> examples, std::vector<std::vector<std::size_t>> rows, std::int64_t pad_id)
      : examples_(std::move(examples)), rows_(std::move(rows)), pad_id_(pad_id) {}
  /// Every example alone in its row.
  static std::shared_ptr<SftDataset> unpacked(std::vector<text::SftExample> examples, std::int64_t pad_id) {
    std::vector<std::vector<std::size_t>> rows(examples.size());
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = {i};
    return std::make_shared<SftDataset>(std::move(examples), std::move(rows), pad_id);
  }
  std::int64_t size() const override { return static_cast<std::int64_t>(rows_.size()); }
  bool packed() const {
    return std::any_of(rows_.begin(), rows_.end(), [](const auto& row) { return row.size() > 1; });
  }
  const std::vector<std::vector<std::size_t>>& rows() const { return rows_; }
  /// The examples, moved out: the dataset is spent (lm/sft.hpp joins several sources' into one).
  std::vector<text::SftExample> release_examples() { return std::move(examples_); }
  std::int64_t pad_id() const { return pad_id_; }
  /// round_lengths's multiple and limit.
  std::pair<std::int64_t, std::int64_t> length_rounding() const { return {multiple_, limit_}; }
  /// Pads each batch to a multiple of `multiple` tokens (tensor cores and fused kernels prefer lengths of 8 or
  /// 64: transformers' collators' pad_to_multiple_of), but not past `limit` tokens unless its longest row is
  /// longer. 1: the longest row's length.
  void round_lengths(std::int64_t multiple, std::int64_t limit) {
    multiple_ = std::max<std::int64_t>(multiple, 1);
    limit_ = limit;
  }

  /// Right-padded to the longest row of the batch (rounded up as round_lengths says); padding takes no loss.
  /// Packed datasets add position_ids and document_ids (padding: position 0, document -1).
  data::Batch batch(const std::vector<std::int64_t>& indices) const override {
    const auto length = padded_length(indices);
    const auto n = static_cast<std::int64_t>(indices.size());
    auto inputs = torch::full({n, length}, pad_id_, torch::kInt64);
    auto targets = torch::full({n, length}, ignore_index, torch::kInt64);
    auto positions = torch::zeros({n, length}, torch::kInt64);
    auto documents = torch::full({n, length}, -1, torch::kInt32);
    auto in = inputs.accessor<std::int64_t, 2>(), out = targets.accessor<std::int64_t, 2>();
    auto pos = positions.accessor<std::int64_t, 2>();
    auto doc = documents.accessor<std::int32_t, 2>();
    for (std::int64_t r = 0; r < n; ++r) {
      std::int64_t t = 0;
      std::int32_t document = 0;
      for (const auto e : rows_[static_cast<std::size_t>(indices[static_cast<std::size_t>(r)])]) {
        const auto& example = examples_[e];
        for (std::size_t k = 0; k + 1 < example.ids.size(); ++k, ++t) {  // input k predicts id k + 1
          in[r][t] = example.ids[k];
          out[r][t] = example.trained[k + 1] ? example.ids[k + 1] : ignore_index;
          pos[r][t] = static_cast<std::int64_t>(k);
          doc[r][t] = document;
        }
        ++document;
      }
    }
    if (!packed()) return {inputs, targets};
    return {inputs, targets, {{"position_ids", positions}, {"document_ids", documents}}};
  }

  /// The input tokens batch(indices) holds and its slots (rows × the padded length), without making it.
  std::optional<data::BatchFill> fill(const std::vector<std::int64_t>& indices) const override {
    data::BatchFill fill;
    for (const auto i : indices) fill.tokens += row_tokens(rows_[static_cast<std::size_t>(i)]);
    fill.slots = static_cast<std::int64_t>(indices.size()) * padded_length(indices);
    return fill;
  }

 private:
  /// The batch's length: its longest row, rounded up to the multiple (not past the limit unless that row is longer).
  std::int64_t padded_length(const std::vector<std::int64_t>& indices) const {
    std::int64_t longest = 1;
    for (const auto i : indices) longest = std::max(longest, row_tokens(rows_[static_cast<std::size_t>(i)]));
    return std::max(longest, std::min((longest + multiple_ - 1) / multiple_ * multiple_, limit_));
  }

  std::int64_t row_tokens(const std::vector<std::size_t>& row) const {
    std::int64_t tokens = 0;
    for (const auto e : row) tokens += static_cast<std::int64_t>(examples_[e].ids.size()) - 1;
    return tokens;
  }

  std::vector<text::SftExample> examples_;
  std::vector<std::vector<std::size_t>> rows_;
  std::int64_t pad_id_;
  std::int64_t multiple_ = 1, limit_ = 0;
};

}  // namespace hpctrain::lm
