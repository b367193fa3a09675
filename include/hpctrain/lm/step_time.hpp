#pragma once
// `--plan`'s step time: beside the memory (lm/memory_plan.hpp), how long one micro-batch's forward and backward take
// on the job's GPUs and fabric, and how much of the sharded strategies' communication the compute hides. Torch-free
// arithmetic on the plan's input; what it assumes is stated, never measured here:
//
//   compute      torchtitan's count of a step's FLOPs a token (6 · trained-or-frozen parameters' products
//                + 12 · layers · hidden · sequence for attention; LoRA's frozen weights need no weight gradient: 4
//                instead of 6), plus what recomputation runs again, at the GPU type's dense bf16 peak times a stated
//                MFU (GpuSpeed: 0.40, what torchtitan reports for Llama 3.1 8B on H100s, 33-39%, rounded up for a step
//                without its Python)
//   collectives  nccl-tests' bus bandwidth: an all-gather or reduce-scatter of a buffer of B bytes over n ranks
//                takes B (n-1)/n / busbw, an all-reduce 2 B (n-1)/n / busbw; a group within a node runs at the
//                node's NVLink figure, a group across nodes at the fabric's (LinkSpeeds: the site's
//                expected_busbw_gbps where it states one, else the preset's)
//   overlap      ZeRO-3 and HSDP as FSDP2 runs them: each block's all-gather (forward, and again in backward but for
//                an untied embedding, which backward does not need) overlaps the previous block's compute, its
//                reduce-scatter (and HSDP's all-reduce across replicas, on the link between nodes) the next block's
//                backward; the first gather and the last reduction are exposed.
//                Replicated and ZeRO-1/2 reduce in buckets during backward: all of it overlaps but the last bucket's
//                share (1/layers), and ZeRO-1/2's all-gather of the parameters after the step is exposed
//
// The result: seconds a micro-batch, tokens/s per GPU, and the exposed communication, for the run's settings and, as
// advice, for the sharding/reduce-dtype/recomputation settings that also fit the GPU's memory.
#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/job/fabric.hpp>
#include <hpctrain/lm/memory_plan.hpp>

namespace hpctrain::lm {

/// One GPU's compute speed: its dense bf16 peak and the fraction of it a step achieves (model FLOPs utilisation).
struct GpuSpeed {
  double peak_flops = 0;    ///< dense bf16 tensor-core FLOP/s (the vendor's figure, without sparsity)
  double mfu = 0.40;        ///< stated: torchtitan's Llama 3.1 8B on H100s reaches 33-39%
  double nvlink_busbw = 0;  ///< bytes/s of bus bandwidth between the GPUs of one node (nccl-tests' all_reduce_perf)
  std::string name;
};

/// The speed of a Slurm GPU type when its name says it: h100/h200 989 TFLOP/s (NVIDIA's SXM datasheet), NVLink 4 at
/// 360 GB/s of bus bandwidth; a100 312 TFLOP/s, NVLink 3 at 230 GB/s; l40 362 TFLOP/s and a10 125, over PCIe (20 GB/s).
inline std::optional<GpuSpeed> gpu_speed_of_type(std::string type) {
  for (auto& c : type) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const auto has = [&](const char* part) { return type.find(part) != std::string::npos; };
  if (has("h200")) return GpuSpeed{989e12, 0.40, 360e9, "H200"};
  if (has("h100")) return GpuSpeed{989e12, 0.40, 360e9, "H100"};
  if (has("a100")) return GpuSpeed{312e12, 0.40, 230e9, "A100"};
  if (has("l40")) return GpuSpeed{362e12, 0.40, 20e9, "L40S"};
  if (has("a10")) return GpuSpeed{125e12, 0.40, 20e9, "A10"};
  return std::nullopt;
}

/// Bus bandwidth per GPU between nodes, in bytes/s, and where the figure comes from.
struct FabricSpeed {
  double busbw = 0;
  std::string source;
};

/// The fabric's speed between nodes (job/fabric.hpp's fabric_bandwidth: the site's figure, else the preset's).
inline FabricSpeed fabric_speed(const std::optional<std::string>& fabric, std::optional<double> expected_busbw_gbps) {
  const auto bandwidth =
      fabric_bandwidth(fabric ? std::optional(parse_fabric(*fabric)) : std::nullopt, expected_busbw_gbps);
  return {bandwidth.gbps * 1e9, bandwidth.source};
}

/// One micro-batch's step as the plan predicts it, in seconds.
struct StepTime {
  double compute = 0;        ///< forward and backward (and recomputation) at the stated MFU
  double communication = 0;  ///< every collective of the micro-batch back to back
  double exposed = 0;        ///< the communication the compute does not hide
  double step = 0;           ///< compute + exposed
  double tokens_per_gpu_per_second = 0;
};

/// The FLOPs of one token's forward and backward, torchtitan's count (train.py's num_flop_per_token): 6 a parameter
/// of the products (LoRA: 4, no weight gradient of the frozen base; 2 more for the adapters' weight gradients, small)
/// plus 12 · layers · hidden · sequence for attention's two products, forward and backward; recomputation adds the
/// forward again (full) or attention's forward only (selective: the matrix products are kept).
inline double training_flops_per_token(const PlanInput& in) {
  const auto& m = in.model;
  const double products =
      static_cast<double>(m.parameters - (m.tied ? 0 : m.head_parameters));  // the embedding: a lookup
  const double per_parameter = in.lora_rank > 0 ? 4.0 : 6.0;
  double flops = per_parameter * products + 12.0 * static_cast<double>(m.layers * m.hidden * in.sequence);
  const double attention_forward = 4.0 * static_cast<double>(m.layers * m.hidden * in.sequence);
  if (in.activation_checkpointing == models::Recompute::full)
    flops += 2.0 * products + attention_forward;                                                // forward again
  if (in.activation_checkpointing == models::Recompute::selective) flops += attention_forward;  // products kept
  return flops;
}

/// The micro-batch's step on `gpu` with `fabric` between nodes: compute, each collective at its group's link, and
/// what overlaps (the header's model).
inline StepTime plan_step_time(const PlanInput& in, const GpuSpeed& gpu, const FabricSpeed& fabric,
                               bool reduce_in_bf16 = false) {
  const auto& m = in.model;
  StepTime time;
  const double tokens = static_cast<double>(in.micro_batch * in.sequence);
  time.compute = training_flops_per_token(in) * tokens / (gpu.peak_flops * gpu.mfu);
  const double forward = time.compute / 3.0, backward = time.compute - forward;
  const double layers = static_cast<double>(std::max<std::int64_t>(1, m.layers));
  const double trained = static_cast<double>(trainable_parameters(in));
  const double world = static_cast<double>(std::max(1, in.world));
  const bool spans_nodes = in.world > in.ranks_per_node;
  // A collective's seconds: `bytes` of buffer over a group of n ranks, whose ring crosses nodes or not.
  const auto ring = [&](double bytes, double n, bool across_nodes, double factor) {
    if (n <= 1) return 0.0;
    return factor * bytes * (n - 1.0) / n / (across_nodes ? fabric.busbw : gpu.nvlink_busbw);
  };
  const double reduce_bytes = reduce_in_bf16 ? 2.0 : 4.0;
  if (in.strategy == "zero3" || in.strategy == "hsdp") {
    const double group = in.strategy == "hsdp" && in.shard_group > 0 ? in.shard_group : world;
    const bool group_spans = group > in.ranks_per_node;
    const double replicas = world / group;
    // What a block's gather moves: its parameters (LoRA: its frozen base and adapters) in the compute dtype.
    const double gathered =
        (in.bf16 ? 2.0 : 4.0) * static_cast<double>(m.parameters) + 4.0 * (in.lora_rank > 0 ? trained : 0.0);
    const double gather = ring(gathered, group, group_spans, 1.0);  // forward's
    // Backward gathers them again but an untied embedding, whose gradient needs the ids alone (fully_sharded.hpp's
    // look_up_embedding); a tied one is the head's weight, which backward needs.
    const double embedding = m.tied ? 0.0 : (in.bf16 ? 2.0 : 4.0) * static_cast<double>(m.head_parameters);
    const double regather = ring(gathered - embedding, group, group_spans, 1.0);
    const double scatter = ring(reduce_bytes * trained, group, group_spans, 1.0);
    const double across = ring(reduce_bytes * trained / group, replicas, true, 2.0);
    time.communication = gather + regather + scatter + across;
    // Per block: forward hides the next gather behind this block's compute; backward hides the previous block's
    // gather and this one's reduce-scatter (one link when the group is the fabric's), and HSDP's all-reduce on the
    // link between nodes when the shard group stays within a node.
    const double forward_blocks = layers * std::max(forward / layers, gather / layers) + gather / layers;
    const double on_group_link = (regather + scatter + (group_spans ? across : 0.0)) / layers;
    const double on_fabric = group_spans ? 0.0 : across / layers;
    const double backward_blocks =
        layers * std::max({backward / layers, on_group_link, on_fabric}) + (scatter + across) / layers;
    time.step = forward_blocks + backward_blocks;
  } else {
    // Replicated and ZeRO-1/2: the gradients' all-reduce (or reduce-scatter) in buckets during backward, ZeRO-1/2's
    // all-gather of the updated parameters after the step.
    const bool sharded = in.strategy == "zero1" || in.strategy == "zero2";
    const double reduce = sharded ? ring(reduce_bytes * trained, world, spans_nodes, 1.0)
                                  : ring(reduce_bytes * trained, world, spans_nodes, 2.0);
    const double gather = sharded ? ring(4.0 * trained, world, spans_nodes, 1.0) : 0.0;
    time.communication = reduce + gather;
    time.step = forward + std::max(backward, reduce) + reduce / layers + gather;
  }
  time.exposed = std::max(0.0, time.step - time.compute);
  time.tokens_per_gpu_per_second = tokens / time.step;
  return time;
}

/// The plan's lines about the step: "step: 1.23 s a micro-batch of 2 x 8192 tokens ...".
inline std::string format_step_time(const PlanInput& in, const StepTime& time, const GpuSpeed& gpu,
                                    const FabricSpeed& fabric) {
  const auto speeds =
      fmt::format("{} at {:.4g} TFLOP/s x {:.0f}% MFU, NVLink {:.4g} GB/s, between nodes {:.4g} GB/s from {}", gpu.name,
                  gpu.peak_flops / 1e12, gpu.mfu * 100.0, gpu.nvlink_busbw / 1e9, fabric.busbw / 1e9, fabric.source);
  return fmt::format(
      "step time (stated speeds: {}):\n  {:.4g} s a micro-batch of {} x {} tokens: compute {:.4g} s, communication "
      "{:.4g} s of which {:.4g} s exposed; {:.0f} tokens/s per GPU\n",
      speeds, time.step, in.micro_batch, in.sequence, time.compute, time.communication, time.exposed,
      time.tokens_per_gpu_per_second);
}

/// A setting's flags, plan and step, for the advice.
struct StepAlternative {
  std::string flags;
  double step = 0, tokens_per_gpu_per_second = 0, exposed = 0, peak = 0;
};

/// The sharded settings that fit `gpu_bytes`, fastest first: zero3 and hsdp (shard groups of a node) over the job's
/// ranks, each reducing in fp32 or bf16, with each recomputation; at most `count`. None at one rank.
inline std::vector<StepAlternative> fastest_fitting_settings(const PlanInput& in, const GpuSpeed& gpu,
                                                             const FabricSpeed& fabric, double gpu_bytes,
                                                             std::size_t count = 3) {
  std::vector<StepAlternative> found;
  if (in.world <= 1) return found;
  std::vector<std::pair<std::string, int>> stages{{"zero3", 0}};
  if (in.world > in.ranks_per_node && in.world % in.ranks_per_node == 0) stages.push_back({"hsdp", in.ranks_per_node});
  for (const auto& [stage, group] : stages)
    for (const bool bf16_reduce : {false, true})
      for (const auto recompute : {models::Recompute::none, models::Recompute::selective, models::Recompute::full}) {
        PlanInput with = in;
        with.strategy = stage;
        with.shard_group = group;
        with.activation_checkpointing = recompute;
        const auto memory = plan_memory(with);
        if (memory.peak > gpu_bytes) continue;
        const auto time = plan_step_time(with, gpu, fabric, bf16_reduce);
        found.push_back({fmt::format("--sharding {} --reduce-dtype {} --activation-checkpointing {}", stage,
                                     bf16_reduce ? "bf16" : "fp32", models::recompute_name(recompute)),
                         time.step, time.tokens_per_gpu_per_second, time.exposed, memory.peak});
      }
  std::stable_sort(found.begin(), found.end(),
                   [](const StepAlternative& a, const StepAlternative& b) { return a.step < b.step; });
  if (found.size() > count) found.resize(count);
  return found;
}

/// The advice's lines: "fastest settings that fit: ...".
inline std::string format_step_advice(const std::vector<StepAlternative>& fastest) {
  if (fastest.empty()) return "";
  std::string out = "fastest sharded settings that fit (step time, tokens/s per GPU, exposed communication, peak):\n";
  for (const auto& setting : fastest)
    out += fmt::format("  {:<72} {:.3f} s  {:>7.0f}  {:.3f} s  {}\n", setting.flags, setting.step,
                       setting.tokens_per_gpu_per_second, setting.exposed, plan_bytes(setting.peak));
  return out;
}

}  // namespace hpctrain::lm
