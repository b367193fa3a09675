#pragma once
// What `--plan` recommends when the plan does not fit one GPU: the plans of the settings that lower the memory
// without changing what is trained (lm/memory_plan.hpp's plan_memory for each), cheapest first, and the first that
// fits. Cheapest in time, by what each adds to a step:
//
//   --loss-chunk-tokens   the head and the loss a chunk at a time: 27% more time for the head alone (docs/gpu.md, the
//                         H200 at Llama 3's vocabulary), a small part of a step
//   --sharding            zero1, then zero2 (the same bytes on the wire as Replicated's all-reduce: a reduce-scatter
//                         and an all-gather), then zero3 (each block gathered again in backward: half as much again);
//                         only at world > 1 (at one rank every stage trains as Replicated)
//   --activation-checkpointing   selective: every block's elementwise work and attention again in backward (its
//                         matrix products kept); then full: every block's forward again, a third more compute
//
// Each combination is tried, ordered by (recomputation, stage, chunked loss): a cheaper lever is pulled fully
// before a dearer one. A smaller batch, LoRA or more ranks change the training itself: named, never chosen.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <hpctrain/lm/memory_plan.hpp>

namespace hpctrain::lm {

/// The tokens a chunk holds where --plan tries --loss-chunk-tokens (the GPU suite's chunk on CUDA).
inline constexpr std::int64_t planned_loss_chunk_tokens = 2048;

/// Which of the levers the program offers (its knobs): --sharding is built in, the others are lm::causal_lm_training's.
struct PlanLevers {
  bool activation_checkpointing = false;  ///< the program has --activation-checkpointing
  bool loss_chunk_tokens = false;         ///< the program has --loss-chunk-tokens
};

/// A setting other than the run's, with its plan.
struct PlanAlternative {
  std::vector<std::string> flags;  ///< what to add to the command line: "--sharding zero3", ...
  PlanInput input;
  MemoryPlan plan;
};

/// The stages that shard more than `in`'s, cheapest first: none at one rank (every stage trains as Replicated there).
inline std::vector<std::string> stages_sharding_more(const PlanInput& in) {
  if (in.world <= 1) return {};
  if (in.strategy == "hsdp") return {"zero3"};  // hsdp shards within a group, zero3 over the whole world
  const std::vector<std::string> order{"none", "zero1", "zero2", "zero3"};
  const auto own = std::find(order.begin(), order.end(), in.strategy);
  return own == order.end() ? std::vector<std::string>{} : std::vector<std::string>(own + 1, order.end());
}

/// The settings `in` could change to within `levers` (itself excluded), cheapest first (the header's order).
inline std::vector<PlanAlternative> cheaper_settings(const PlanInput& in, const PlanLevers& levers) {
  std::vector<std::string> stages{in.strategy};
  for (auto& stage : stages_sharding_more(in)) stages.push_back(std::move(stage));
  const bool can_chunk =
      levers.loss_chunk_tokens && in.loss_chunk_tokens == 0 && in.micro_batch * in.sequence > planned_loss_chunk_tokens;
  std::vector<PlanAlternative> settings;
  // The run's own recomputation, then each that recomputes more (selective before full).
  for (const auto recompute : {models::Recompute::none, models::Recompute::selective, models::Recompute::full}) {
    const bool more = recompute > in.activation_checkpointing;
    if (recompute < in.activation_checkpointing || (more && !levers.activation_checkpointing)) continue;
    for (const auto& stage : stages)
      for (const bool chunk : {false, true}) {
        if (chunk && !can_chunk) continue;
        if (!more && !chunk && stage == in.strategy) continue;  // the run's own setting
        PlanAlternative setting{{}, in, {}};
        if (chunk) {
          setting.input.loss_chunk_tokens = planned_loss_chunk_tokens;
          setting.flags.push_back(fmt::format("--loss-chunk-tokens {}", planned_loss_chunk_tokens));
        }
        if (stage != in.strategy) {
          setting.input.strategy = stage;
          setting.flags.push_back("--sharding " + stage);
        }
        if (more) {
          setting.input.activation_checkpointing = recompute;
          setting.flags.push_back(fmt::format("--activation-checkpointing {}", models::recompute_name(recompute)));
        }
        setting.plan = plan_memory(setting.input);
        settings.push_back(std::move(setting));
      }
  }
  return settings;
}

/// The cheapest setting within `levers` whose plan fits the GPU, or nothing (none fits, or the GPU is unknown).
inline std::optional<PlanAlternative> cheapest_fitting_setting(const PlanInput& in, const PlanLevers& levers) {
  if (!in.gpu_bytes) return std::nullopt;
  for (auto& setting : cheaper_settings(in, levers))
    if (setting.plan.fits()) return std::move(setting);
  return std::nullopt;
}

/// `--plan`'s advice for a plan that does not fit: "fits with --activation-checkpointing: 31.20 GiB of 40.00 GiB",
/// or, when no setting fits, the lowest of them and what would lower it further.
inline std::string plan_advice(const PlanInput& in, const PlanLevers& levers) {
  if (const auto setting = cheapest_fitting_setting(in, levers))
    return fmt::format("hpctrain: fits with {}: {} of {} per GPU\n", fmt::join(setting->flags, " "),
                       plan_bytes(setting->plan.peak), plan_bytes(*setting->plan.gpu));
  const auto settings = cheaper_settings(in, levers);
  const PlanAlternative* lowest = nullptr;
  for (const auto& setting : settings)
    if (lowest == nullptr || setting.plan.peak < lowest->plan.peak) lowest = &setting;
  const auto further = "more ranks (ZeRO-3 shards by the world), a smaller batch or LoRA would lower it";
  if (lowest == nullptr) return fmt::format("hpctrain: no setting of this run fits; {}\n", further);
  return fmt::format("hpctrain: no setting of this run fits: the lowest is {} with {}; {}\n",
                     plan_bytes(lowest->plan.peak), fmt::join(lowest->flags, " "), further);
}

}  // namespace hpctrain::lm
