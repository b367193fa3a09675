#pragma once
// The flat shard layout of the sharded strategies (ZeRO-1/2). Parameters are grouped into buckets exactly
// as GradientSync groups them (reverse registration order, one dtype and device per bucket); a bucket is a
// flat buffer of its parameters, back to back, padded with zeros to a multiple of the world size and split
// evenly: rank r owns elements [r·s, (r+1)·s) of every bucket, s = padded / world_size. A parameter can
// straddle two (or more) ranks' shards; the part of it inside one rank's shard is a ShardPiece.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <hpctrain/dist/gradient_sync.hpp>

namespace hpctrain::dist {

/// The part of one parameter that lies inside one rank's shard of its bucket.
struct ShardPiece {
  std::size_t parameter = 0;      ///< index into the layout's parameters (registration order)
  std::int64_t begin = 0;         ///< first element of the parameter (flattened) in this piece
  std::int64_t length = 0;        ///< elements in this piece
  std::int64_t shard_offset = 0;  ///< where the piece starts inside the rank's shard of the bucket
};

/// One bucket: its parameters, their offsets in the flat buffer, its padded size and the shard size.
struct FlatBucket {
  std::vector<std::size_t> parameters;  ///< indices into the layout's parameters, in buffer order
  std::vector<std::int64_t> offsets;    ///< element offset of each parameter in the flat buffer
  std::int64_t numel = 0;               ///< elements of all its parameters
  std::int64_t padded_numel = 0;        ///< numel rounded up to a multiple of the world size
  std::int64_t shard_numel = 0;         ///< padded_numel / world_size: every rank's share
};

/// Buckets and per-rank pieces of a model's trainable parameters at one world size.
class FlatShardLayout {
 public:
  FlatShardLayout() = default;
  /// `numels[i]` and `shapes[i]` describe parameter i (registration order); buckets as GradientSync plans them.
  FlatShardLayout(const std::vector<detail::ParameterShape>& shapes, const std::vector<std::int64_t>& numels,
                  int world_size, const GradientSyncOptions& options = {})
      : FlatShardLayout(numels, world_size, detail::plan_buckets(shapes, options)) {}

  /// Buckets given explicitly: `groups[b]` lists bucket b's parameters (indices into `numels`) in buffer order
  /// (the fully sharded strategy: one bucket per block).
  FlatShardLayout(const std::vector<std::int64_t>& numels, int world_size,
                  const std::vector<std::vector<std::size_t>>& groups)
      : world_size_(world_size), numels_(numels) {
    for (const auto& planned : groups) {
      FlatBucket bucket;
      for (auto parameter : planned) {
        bucket.parameters.push_back(parameter);
        bucket.offsets.push_back(bucket.numel);
        bucket.numel += numels[parameter];
      }
      bucket.padded_numel = (bucket.numel + world_size - 1) / world_size * world_size;
      bucket.shard_numel = bucket.padded_numel / world_size;
      buckets_.push_back(std::move(bucket));
    }
  }

  /// Ranks the layout splits buckets over.
  int world_size() const { return world_size_; }
  /// The buckets, in the order their gradients become ready in backward (and collectives are issued).
  const std::vector<FlatBucket>& buckets() const { return buckets_; }
  /// Elements of parameter `i`.
  std::int64_t numel(std::size_t parameter) const { return numels_[parameter]; }

  /// The pieces of bucket `b` that rank `rank` owns, in shard order (padding owns no piece).
  std::vector<ShardPiece> pieces(std::size_t b, int rank) const {
    const auto& bucket = buckets_[b];
    const std::int64_t shard_begin = rank * bucket.shard_numel;
    const std::int64_t shard_end = shard_begin + bucket.shard_numel;
    std::vector<ShardPiece> result;
    for (std::size_t k = 0; k < bucket.parameters.size(); ++k) {
      const std::int64_t begin = std::max(shard_begin, bucket.offsets[k]);
      const std::int64_t end = std::min(shard_end, bucket.offsets[k] + numels_[bucket.parameters[k]]);
      if (begin >= end) continue;
      result.push_back({bucket.parameters[k], begin - bucket.offsets[k], end - begin, begin - shard_begin});
    }
    return result;
  }

  /// Trainable elements of the whole model, padding excluded.
  std::int64_t total_numel() const {
    std::int64_t total = 0;
    for (const auto& bucket : buckets_) total += bucket.numel;
    return total;
  }
  /// Elements of one rank's shards over all buckets (padding included): about total_numel() / world_size.
  std::int64_t shard_numel() const {
    std::int64_t total = 0;
    for (const auto& bucket : buckets_) total += bucket.shard_numel;
    return total;
  }

 private:
  int world_size_ = 1;
  std::vector<std::int64_t> numels_;
  std::vector<FlatBucket> buckets_;
};

}  // namespace hpctrain::dist
