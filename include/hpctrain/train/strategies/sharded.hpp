#pragma once
// The strategy of a ZeRO stage: Replicated for `none`, ZeroStrategy for zero1/zero2, FullyShardedStrategy for
// zero3 (and, with shard groups of `hsdp_group_size` ranks replicated across, for hsdp). What
// `Training::sharding(stage)`, `--sharding NAME` and `training.strategy(hpctrain::sharded(stage))` make on every rank.
#include <memory>

#include <hpctrain/dist/gradient_sync.hpp>
#include <hpctrain/train/strategies/fully_sharded.hpp>
#include <hpctrain/train/strategies/replicated.hpp>
#include <hpctrain/train/strategies/sharding.hpp>
#include <hpctrain/train/strategies/strategy.hpp>
#include <hpctrain/train/strategies/zero.hpp>

namespace hpctrain {

/// The strategy of `stage`, with buckets (one collective each) of `buckets`' sizes; under hsdp, shard groups of
/// `hsdp_group_size` ranks (0: the ranks of a node).
inline std::unique_ptr<DataParallelStrategy> make_zero_strategy(ZeroStage stage, dist::GradientSyncOptions buckets = {},
                                                                int hsdp_group_size = 0) {
  switch (stage) {
    case ZeroStage::none: return std::make_unique<Replicated>(buckets);
    case ZeroStage::zero3: return std::make_unique<FullyShardedStrategy>(buckets);
    case ZeroStage::hsdp: {
      auto strategy = std::make_unique<FullyShardedStrategy>(buckets);
      strategy->hybrid(hsdp_group_size);
      return strategy;
    }
    default: {
      ZeroOptions options(stage);
      options.buckets = buckets;
      return std::make_unique<ZeroStrategy>(std::move(options));
    }
  }
}

/// The strategy factory for the Training: `training.strategy(hpctrain::sharded(hpctrain::zero2))`, or the
/// shortcut `training.sharding(hpctrain::zero2)`.
inline auto sharded(ZeroStage stage, dist::GradientSyncOptions buckets = {}, int hsdp_group_size = 0) {
  return [stage, buckets, hsdp_group_size] { return make_zero_strategy(stage, buckets, hsdp_group_size); };
}

}  // namespace hpctrain
