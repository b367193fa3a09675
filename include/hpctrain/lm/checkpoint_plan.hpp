#pragma once
// `--plan`'s checkpoint: the bytes a run's checkpoint puts on disk per rank, per node and in all, from the model's
// config.json (lm/memory_plan.hpp's PlanInput), the seconds its busiest node takes to write them at the site's write
// bandwidth, and whether requeue_on_timeout's grace leaves time for the steps until every rank stops after the signal
// and for that write. What a checkpoint holds (train/strategies/): Replicated, rank 0 alone, what trains in fp32 and
// AdamW's two moments (LoRA's frozen base left out, read again from its source: detail::save_trained); ZeRO-1/2/3,
// each rank its shard of what trains, every element once (the fp32 master and two moments: 12 bytes a trained
// parameter); HSDP, the ranks of the first shard group the shards (the other replicas an index), so the nodes of
// that group write it all. Torch-free.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include <fmt/format.h>

#include <hpctrain/lm/memory_plan.hpp>

namespace hpctrain::lm {

/// The write bandwidth of one node to the checkpoint's file system, in GB/s, when the site file states none
/// (`checkpoint_write_gbps`): a parallel file system's client node writes one to a few GB/s.
inline constexpr double default_checkpoint_write_gbps = 2.0;

/// One checkpoint of the run, in bytes, and the time its busiest node takes to write it.
struct CheckpointPlan {
  double per_rank = 0;  ///< the largest file one rank writes
  double per_node = 0;  ///< what the busiest node writes
  double total = 0;
  double write_gbps = default_checkpoint_write_gbps;  ///< one node's, as planned at
  double seconds = 0;                                 ///< the busiest node's write
};

inline CheckpointPlan plan_checkpoint(const PlanInput& in, double node_write_gbps) {
  const double trained = static_cast<double>(trainable_parameters(in));
  CheckpointPlan plan;
  plan.write_gbps = node_write_gbps;
  // What trains, once: in fp32 (Replicated's parameters, the sharded stages' masters) and AdamW's two moments.
  plan.total = 12.0 * trained;
  const int writers = in.strategy == "none"                         ? 1  // rank 0
                      : in.strategy == "hsdp" && in.shard_group > 0 ? std::min(in.shard_group, in.world)
                                                                    : in.world;
  plan.per_rank = plan.total / writers;
  plan.per_node = plan.per_rank * std::min(std::max(in.ranks_per_node, 1), writers);
  plan.seconds = plan.per_node / (node_write_gbps * 1e9);
  return plan;
}

/// "13.2 GB": a size as file systems and sites state bandwidth (decimal units).
inline std::string decimal_bytes(double bytes) {
  if (bytes >= 1e12) return fmt::format("{:.2f} TB", bytes / 1e12);
  if (bytes >= 1e9) return fmt::format("{:.1f} GB", bytes / 1e9);
  return fmt::format("{:.1f} MB", bytes / 1e6);
}

/// The checkpoint's line of the plan.
inline std::string format_checkpoint_plan(const PlanInput& in, const CheckpointPlan& plan, const std::string& source) {
  const std::string holds =
      in.strategy == "none"
          ? "rank 0 writes what trains in fp32 and AdamW's two moments, 12 bytes a parameter"
          : "each element of what trains once: fp32 master and AdamW's two moments, 12 bytes a parameter";
  return fmt::format(
      "checkpoint: {} a rank, {} a node, {} in all ({}); the busiest node writes it in {:.0f} s at {:g} GB/s ({})\n",
      decimal_bytes(plan.per_rank), decimal_bytes(plan.per_node), decimal_bytes(plan.total), holds, plan.seconds,
      plan.write_gbps, source);
}

/// What the time between Slurm's signal and its SIGKILL must hold: the steps until every rank has seen the signal
/// (Training::steps_until_stop) and the checkpoint's write.
struct GraceNeed {
  double grace = 0, steps = 0, write = 0;
  bool step_known = false;
  double needed() const { return steps + write; }
};

/// The plan's warning when `need.grace` is shorter than what it must hold; empty when it is long enough.
inline std::string grace_warning(const GraceNeed& need, std::int64_t steps_until_stop) {
  if (need.grace >= need.needed()) return {};
  const auto steps = need.step_known ? fmt::format(
                                           "{} step(s) until every rank stops after the signal ({:.0f} s, "
                                           "preemption_check_every) plus ",
                                           steps_until_stop, need.steps)
                                     : std::string();
  return fmt::format(
      "hpctrain: warning: requeue_on_timeout's grace of {:.0f} s is shorter than {}writing the checkpoint ({:.0f} s): "
      "Slurm's SIGKILL would land mid-save and the run would resume from the checkpoint before; give it at least "
      "{:.0f} s\n",
      need.grace, steps, need.write, std::ceil(need.needed() * 1.2));
}

}  // namespace hpctrain::lm
