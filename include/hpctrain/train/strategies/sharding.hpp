#pragma once
// The ZeRO stage a run shards with, by name: what `Training::sharding(hpctrain::zero2)` and the built-in knob
// `--sharding none|zero1|zero2|zero3|hsdp` choose between (docs/distributed.md, "Sharded strategies"):
//
//   none   Replicated: every rank holds parameters, gradients and optimizer state (our DDP)
//   zero1  optimizer state sharded, gradients all-reduced
//   zero2  optimizer state and gradients sharded (reduce-scattered during backward)
//   zero3  parameters sharded too: each listed block is gathered just before it runs and freed after
//   hsdp   hybrid: zero3 within each group of --hsdp-group-size ranks (default: a node's), replicated across groups
#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <hpctrain/error.hpp>

namespace hpctrain {

/// Which ZeRO stage a run shards with; `none` is DeepSpeed's stage 0, replicated data parallelism.
enum class ZeroStage { none = 0, zero1 = 1, zero2 = 2, zero3 = 3, hsdp = 4 };
/// Replicated: nothing sharded.
inline constexpr ZeroStage no_sharding = ZeroStage::none;
/// Optimizer state sharded, gradients all-reduced.
inline constexpr ZeroStage zero1 = ZeroStage::zero1;
/// Optimizer state and gradients sharded: gradients reduce-scattered during backward.
inline constexpr ZeroStage zero2 = ZeroStage::zero2;
/// Parameters, gradients and optimizer state sharded: blocks gathered one at a time (fully sharded, FSDP-style).
inline constexpr ZeroStage zero3 = ZeroStage::zero3;
/// Hybrid sharding (FSDP's HYBRID_SHARD): ZeRO-3 within groups of ranks (a node's, by default), gradients then
/// averaged across the groups; Training::hsdp_group_size sets the group's size.
inline constexpr ZeroStage hsdp = ZeroStage::hsdp;

/// The stages' names, in stage order: what `--sharding` accepts.
inline constexpr std::array<std::string_view, 5> zero_stage_names{"none", "zero1", "zero2", "zero3", "hsdp"};

/// "none", "zero1", "zero2", "zero3" or "hsdp": the knob's spelling (a strategy's name() is "replicated" for none).
inline std::string to_string(ZeroStage stage) {
  return std::string(zero_stage_names.at(static_cast<std::size_t>(stage)));
}

/// The stage called `name`, or nothing.
inline std::optional<ZeroStage> zero_stage_from_name(std::string_view name) {
  for (std::size_t i = 0; i < zero_stage_names.size(); ++i)
    if (zero_stage_names[i] == name) return static_cast<ZeroStage>(i);
  return std::nullopt;
}

/// Whether a run of `stage` on `world_size` ranks trains as Replicated: a sharded stage at one rank shards nothing
/// and only adds work (ShardedAtOneRank, train/strategies/one_rank.hpp, keeps its checkpoint format), unless
/// `shard_at_one_rank` (Training::shard_at_one_rank, --shard-at-one-rank) asks for the stage's own strategy. What
/// the Trainer makes and `--plan` plans.
inline bool sharded_stage_runs_replicated(ZeroStage stage, int world_size, bool shard_at_one_rank) {
  return stage != ZeroStage::none && world_size == 1 && !shard_at_one_rank;
}

/// The size of an hsdp shard group: `requested`, or the ranks of a node when it is 0. Throws SpecError(sharding)
/// naming the divisors when the groups would not tile the world. The worker asks before the rendezvous, so
/// every rank refuses alike instead of some leaving while the others still connect.
inline int hsdp_shard_group_size(int requested, int world_size, int local_world_size) {
  const int size = requested > 0 ? requested : local_world_size;
  if (size >= 1 && world_size % size == 0) return size;
  std::vector<int> divisors;
  for (int d = 1; d <= world_size; ++d)
    if (world_size % d == 0) divisors.push_back(d);
  throw SpecError(
      "sharding", "hsdp",
      fmt::format("hsdp_group_size = {}{} does not divide the world of {} ranks: the shard groups tile "
                  "the world (--hsdp-group-size one of {})",
                  size, requested > 0 ? "" : " (the ranks per node)", world_size, fmt::join(divisors, ", ")));
}

}  // namespace hpctrain
