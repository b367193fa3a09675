#pragma once
// Several sources mixed by weight, with exact resume. An epoch of the mix has as many slots as the sources have rows
// together; each source owns a share of them proportional to its weight (largest remainders, so the counts are
// exact), and the Trainer's sampler shuffles the slots as it shuffles any dataset's rows. A source's k-th draw of
// the run is row perm_c(k mod n) of its n rows, where c = k div n counts its passes and perm_c is a permutation keyed
// by (the run's seed, the source, c): a source used less than its size per epoch moves on through its rows, and one
// used more repeats them, each pass in a new order. Which row a slot of an epoch holds is so a pure function of
// (seed, epoch, slot): a run resumed at a step reads what the uninterrupted run read, and the checkpoint notes each
// source's position (its draws so far) to say so. The sources are one dataset's consecutive row ranges (lm/sft.hpp
// concatenates them): batches need no merging across datasets.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/train/data/source.hpp>

namespace hpctrain::data {

/// One source of a mix: a name for messages, its rows in the concatenated dataset (after the previous sources'),
/// and its weight.
struct MixPart {
  std::string name;
  std::int64_t rows = 0;
  double weight = 1;
};

namespace detail {
/// splitmix64's finaliser: a well-mixed 64-bit hash.
inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// A permutation of [0, n) keyed by `key`, one index at a time: a 4-round Feistel network over the smallest
/// 4^h >= n, walked until it lands below n (fewer than 4 steps on average). No table: O(1) memory for any n.
inline std::int64_t permuted(std::int64_t index, std::int64_t n, std::uint64_t key) {
  int half = 1;
  while ((std::int64_t{1} << (2 * half)) < n) ++half;
  const std::uint64_t mask = (std::uint64_t{1} << half) - 1;
  auto x = static_cast<std::uint64_t>(index);
  do {
    std::uint64_t left = x >> half, right = x & mask;
    for (std::uint64_t round = 0; round < 4; ++round) {
      const auto next = left ^ (mix64(key + round * 0x9E3779B97F4A7C15ull + right) & mask);
      left = right;
      right = next;
    }
    x = (left << half) | right;
  } while (x >= static_cast<std::uint64_t>(n));
  return static_cast<std::int64_t>(x);
}
}  // namespace detail

/// The arithmetic of a mix: which source and row each slot of an epoch holds, and the rows each source gave.
class MixPlan {
 public:
  /// `parts` in the order their rows follow each other; SpecError `[hpctrain.spec.data.mix]` naming a source
  /// without rows or without a positive weight.
  MixPlan(std::vector<MixPart> parts, std::uint64_t seed) : parts_(std::move(parts)), seed_(seed) {
    double total_weight = 0;
    for (const auto& part : parts_) {
      if (part.rows <= 0) throw SpecError(errors::spec_data_mix, part.name, "keeps no example to mix");
      if (!(part.weight > 0))
        throw SpecError(errors::spec_data_mix, part.name, fmt::format("weight {} must be positive", part.weight));
      total_weight += part.weight;
      first_row_.push_back(rows_);
      rows_ += part.rows;
    }
    // Largest remainders: every source's slots within one of weight × slots, and the counts add up.
    std::vector<double> remainder;
    std::int64_t given = 0;
    for (const auto& part : parts_) {
      const double exact = static_cast<double>(rows_) * part.weight / total_weight;
      per_epoch_.push_back(static_cast<std::int64_t>(exact));
      remainder.push_back(exact - static_cast<double>(per_epoch_.back()));
      given += per_epoch_.back();
    }
    std::vector<std::size_t> order(parts_.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return remainder[a] > remainder[b]; });
    for (std::size_t i = 0; given < rows_; ++i, ++given) ++per_epoch_[order[i % order.size()]];
    for (std::int64_t count : per_epoch_) first_slot_.push_back(slots_), slots_ += count;
  }

  /// Slots per epoch: the sources' rows together.
  std::int64_t slots() const { return slots_; }
  const std::vector<MixPart>& parts() const { return parts_; }
  /// Slots of each source in every epoch.
  const std::vector<std::int64_t>& per_epoch() const { return per_epoch_; }

  /// The source of `slot` (slots are laid out source after source; the sampler shuffles them).
  std::size_t part_of(std::int64_t slot) const {
    return static_cast<std::size_t>(std::upper_bound(first_slot_.begin(), first_slot_.end(), slot) -
                                    first_slot_.begin() - 1);
  }
  /// The row of the concatenated dataset that `slot` of `epoch` holds.
  std::int64_t row(std::int64_t epoch, std::int64_t slot) const {
    const auto part = part_of(slot);
    const auto n = parts_[part].rows;
    const auto draw = epoch * per_epoch_[part] + (slot - first_slot_[part]);  // the source's draw number
    const auto key = detail::mix64(seed_ ^ detail::mix64(part + 1) ^ detail::mix64(0x5EED0000ull + draw / n));
    return first_row_[part] + detail::permuted(draw % n, n, key);
  }

  /// Each source's position in its draws once `consumed` slots of `epoch` are read (every rank's): the whole
  /// epochs before it count whole (the few slots an epoch's batches leave out included).
  std::vector<std::int64_t> positions(std::int64_t epoch, const std::vector<std::int64_t>& consumed) const {
    std::vector<std::int64_t> out;
    for (const auto count : per_epoch_) out.push_back(epoch * count);
    for (const auto slot : consumed) ++out[part_of(slot)];
    return out;
  }

 private:
  std::vector<MixPart> parts_;
  std::uint64_t seed_;
  std::vector<std::int64_t> first_row_, per_epoch_, first_slot_;
  std::int64_t rows_ = 0, slots_ = 0;
};

/// A dataset whose rows are the slots of a MixPlan over `concatenated` (the sources' rows one after another).
class MixedDataset final : public Dataset {
 public:
  MixedDataset(std::shared_ptr<const Dataset> concatenated, std::vector<MixPart> parts, std::uint64_t seed)
      : base_(std::move(concatenated)), plan_(std::move(parts), seed) {}
  const MixPlan& plan() const { return plan_; }
  std::int64_t size() const override { return plan_.slots(); }
  Batch batch(const std::vector<std::int64_t>& indices) const override { return batch_in_epoch(indices, 0); }
  Batch batch_in_epoch(const std::vector<std::int64_t>& indices, std::int64_t epoch) const override {
    return base_->batch_in_epoch(rows(indices, epoch), epoch);
  }
  /// As epoch 0 holds them (the Trainer reports the padding of the first epoch).
  std::optional<BatchFill> fill(const std::vector<std::int64_t>& indices) const override {
    return base_->fill(rows(indices, 0));
  }
  const MixedDataset* mixture() const override { return this; }

 private:
  std::vector<std::int64_t> rows(const std::vector<std::int64_t>& slots, std::int64_t epoch) const {
    std::vector<std::int64_t> out;
    out.reserve(slots.size());
    for (const auto slot : slots) out.push_back(plan_.row(epoch, slot));
    return out;
  }

  std::shared_ptr<const Dataset> base_;
  MixPlan plan_;
};

}  // namespace hpctrain::data
