#pragma once
// The distributed sampler: each epoch a permutation seeded by (seed, epoch), the same on every rank,
// dealt round-robin to the ranks; every rank gets the same number of examples (the tail that does not
// divide evenly is dropped, so every rank runs the same number of steps and no collective waits forever).
#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <hpctrain/error.hpp>
#include <hpctrain/train/data/source.hpp>

namespace hpctrain::data {

/// Per-epoch shuffled, rank-sharded indices over a dataset of `dataset_size` examples.
class DistributedSampler {
 public:
  /// `rank` in [0, world_size); `shuffle` false keeps dataset order (evaluation).
  DistributedSampler(std::int64_t dataset_size, int world_size, int rank, std::uint64_t seed, bool shuffle = true)
      : dataset_size_(dataset_size), world_size_(world_size), rank_(rank), seed_(seed), shuffle_(shuffle) {
    hpctrain::detail::require(world_size > 0 && rank >= 0 && rank < world_size, "sampler.rank", rank,
                              fmt::format("must be in [0, {})", world_size));
  }

  /// Examples each rank sees per epoch.
  std::int64_t size_per_rank() const { return dataset_size_ / world_size_; }

  /// The same sampler as rank `rank` holds it.
  DistributedSampler for_rank(int rank) const {
    return DistributedSampler(dataset_size_, world_size_, rank, seed_, shuffle_);
  }

  /// This rank's indices for `epoch` (a pure function of seed, epoch, rank and world size).
  std::vector<std::int64_t> indices(std::int64_t epoch) const {
    torch::Tensor order;
    if (shuffle_) {
      // A private generator: the permutation must not depend on (or disturb) the global torch RNG.
      auto generator =
          at::detail::createCPUGenerator(seed_ + 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(epoch + 1));
      order = torch::randperm(dataset_size_, generator, torch::kInt64);
    } else {
      order = torch::arange(dataset_size_, torch::kInt64);
    }
    const std::int64_t per_rank = size_per_rank();
    std::vector<std::int64_t> mine(static_cast<std::size_t>(per_rank));
    const auto* all = order.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < per_rank; ++i) mine[static_cast<std::size_t>(i)] = all[i * world_size_ + rank_];
    return mine;
  }

 private:
  std::int64_t dataset_size_;
  int world_size_;
  int rank_;
  std::uint64_t seed_;
  bool shuffle_;
};

/// The tokens and slots of one epoch's training batches on every rank, as the Trainer forms them: each rank's
/// indices of `epoch` (the sampler's, for every rank) cut into `steps` batches of `per_step` examples (the
/// step's whole batch: its micro-batches are slices of it, padded alike). nullopt when `dataset` reports none.
inline std::optional<BatchFill> epoch_fill(const Dataset& dataset, const DistributedSampler& any_rank, int world_size,
                                           std::int64_t epoch, std::int64_t per_step, std::int64_t steps) {
  BatchFill total;
  for (int rank = 0; rank < world_size; ++rank) {
    const auto indices = any_rank.for_rank(rank).indices(epoch);
    for (std::int64_t step = 0; step < steps; ++step) {
      const auto begin = indices.begin() + static_cast<std::ptrdiff_t>(step * per_step);
      const auto fill = dataset.fill(std::vector<std::int64_t>(begin, begin + static_cast<std::ptrdiff_t>(per_step)));
      if (!fill) return std::nullopt;
      total += *fill;
    }
  }
  return total;
}

/// Evaluation split: rank r takes examples r, r + world, ... (all of them, uneven counts allowed).
inline std::vector<std::int64_t> strided_indices(std::int64_t dataset_size, int world_size, int rank) {
  std::vector<std::int64_t> mine;
  for (std::int64_t i = rank; i < dataset_size; i += world_size) mine.push_back(i);
  return mine;
}

}  // namespace hpctrain::data
