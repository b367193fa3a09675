#pragma once
// `--plan` for a language-model Training (lm::causal_lm_training installs it): the model's shape from the
// config.json of its `from_pretrained` directory (no weights read), the strategy, precision, LoRA, batch and
// sequence the run declares with this command line's knobs, at the job's geometry; the accounting is
// lm/memory_plan.hpp's, and on GPUs of a known type the step's time (lm/step_time.hpp) with the fastest sharded
// settings that fit. The verdict says whether the peak fits one GPU's memory (--gpu-memory, or the GPU type's).
#include <cstdint>
#include <ostream>
#include <string>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/job/plan_request.hpp>
#include <hpctrain/lm/checkpoint_plan.hpp>
#include <hpctrain/lm/loss.hpp>
#include <hpctrain/lm/memory_plan.hpp>
#include <hpctrain/lm/plan_advice.hpp>
#include <hpctrain/lm/step_time.hpp>
#include <hpctrain/models/hf/config_json.hpp>
#include <hpctrain/models/llama_config.hpp>
#include <hpctrain/train/builtin_knobs.hpp>
#include <hpctrain/train/strategies/sharding.hpp>
#include <hpctrain/train/training.hpp>

namespace hpctrain::lm {

namespace detail {
/// The tokens per example the run declares: the knob --max-length (SFT) or --seq-len (pretraining) when the
/// program has one, else the model's positions.
inline std::pair<std::int64_t, std::string> planned_sequence(const Knobs& knobs, std::int64_t positions) {
  for (const char* name : {"max_length", "seq_len"})
    if (const auto* spec = knobs.find(name)) return {knobs.get<std::int64_t>(name), spec->flag()};
  return {positions, "the model's positions"};
}

/// The speeds the step time is planned at: the GPU type's and the fabric's; on a CPU job, the ones a test states (the
/// TFLOP/s HPCTRAIN_PLAN_CPU_TFLOPS says this CPU reaches, every link the simulated one of
/// HPCTRAIN_SIMULATED_LINK_GBPS: dist/simulated_link.hpp), else none.
inline std::optional<std::pair<GpuSpeed, FabricSpeed>> step_speeds(const PlanRequest& request) {
  if (request.gpus_per_node > 0) {
    const auto gpu = gpu_speed_of_type(request.gpu_type);
    if (!gpu) return std::nullopt;
    return std::pair{*gpu, fabric_speed(request.fabric, request.expected_busbw_gbps)};
  }
  if (!request.simulated_link_gbps || !request.cpu_tflops) return std::nullopt;
  const double link = *request.simulated_link_gbps * 1e9;
  return std::pair{GpuSpeed{*request.cpu_tflops * 1e12, 1.0, link, "this CPU"},
                   FabricSpeed{link, "the simulated link of HPCTRAIN_SIMULATED_LINK_GBPS"}};
}

/// The plan's checkpoint lines: the checkpoint's size and write time, and the grace warning when
/// requeue_on_timeout's is too short for the steps until every rank stops after the signal (`step_seconds` each, when
/// planned) and the write (grace_too_short says so: the site may refuse such a job).
struct CheckpointLines {
  std::string text;
  bool grace_too_short = false;
};
inline CheckpointLines checkpoint_lines(const PlanInput& in, const PlanRequest& request,
                                        std::optional<double> step_seconds, std::int64_t steps_until_stop) {
  const auto gbps = request.checkpoint_write_gbps.value_or(default_checkpoint_write_gbps);
  const auto checkpoint = plan_checkpoint(in, gbps);
  CheckpointLines lines{format_checkpoint_plan(in, checkpoint,
                                               request.checkpoint_write_gbps
                                                   ? "the site file's checkpoint_write_gbps"
                                                   : "the default; the site file's checkpoint_write_gbps states the "
                                                     "site's")};
  if (request.requeue_grace_s) {
    GraceNeed need{*request.requeue_grace_s, step_seconds.value_or(0.0) * static_cast<double>(steps_until_stop),
                   checkpoint.seconds, step_seconds.has_value()};
    const auto warning = grace_warning(need, steps_until_stop);
    lines.text += warning;
    lines.grace_too_short = !warning.empty();
  }
  return lines;
}
}  // namespace detail

/// Prints the memory plan of `described` with `knobs` for `request` to `out` and says whether it fits.
inline PlanVerdict plan_memory_of_run(const Training& described, const Knobs& knobs, const PlanRequest& request,
                                      std::ostream& out) {
  const auto training = with_knobs(described, knobs);
  const auto directory = training.pretrained_dir(knobs);
  if (!directory) {
    out << "hpctrain: --plan reads the model's size from its config.json: this program builds its model in code, not "
           "with "
           "lm::from_pretrained, so there is nothing to read before it is built\n";
    return PlanVerdict::cannot_plan;
  }
  const auto file = *directory / "config.json";
  const auto type = models::detail::read_json_file(file).value("model_type", std::string());
  PlanInput in;
  std::int64_t positions = 0;
  if (type == "gpt2") {
    const auto config = models::detail::read_config_file<models::GPT2Config>(file);
    in.model = model_shape(config);
    positions = config.n_positions;
  } else if (models::is_llama_family(type)) {
    const auto config = models::detail::read_config_file<models::LlamaConfig>(file);
    in.model = model_shape(config);
    positions = config.max_position_embeddings;
  } else {
    out << fmt::format("hpctrain: --plan knows causal language models (\"gpt2\", {}); {} is {:?}\n",
                       models::quoted_llama_family_types(), file.string(), type);
    return PlanVerdict::cannot_plan;
  }
  in.strategy = training.sharding() ? to_string(*training.sharding()) : "none";
  if (training.sharding() &&
      sharded_stage_runs_replicated(*training.sharding(), request.world, training.shard_at_one_rank())) {
    out << fmt::format("hpctrain: {} at one rank trains as replicated: planned as such\n", in.strategy);
    in.strategy = "none";
  }
  in.bf16 = training.precision() == Precision::bf16 ||
            (training.precision() == Precision::automatic && request.gpus_per_node > 0);
  if (const auto lora = training.lora(knobs)) {
    in.lora_rank = lora->r;
    in.lora_targets = lora->targets;
  }
  if (knobs.find("activation_checkpointing") != nullptr)
    in.activation_checkpointing =
        models::parse_recompute(knobs.get<std::string>("activation_checkpointing")).value_or(models::Recompute::none);
  if (knobs.find(loss_chunk_knob) != nullptr) in.loss_chunk_tokens = knobs.get<std::int64_t>(loss_chunk_knob);
  const auto [sequence, from] = detail::planned_sequence(knobs, positions);
  in.sequence = sequence;
  in.micro_batch = training.micro_batch_per_rank(request.world);
  in.world = request.world;
  in.ranks_per_node = request.ranks_per_node;
  in.cpu = request.gpus_per_node == 0;
  if (in.strategy == "hsdp")
    in.shard_group = training.hsdp_group_size() > 0 ? training.hsdp_group_size() : request.ranks_per_node;
  // The CUDA context and LibTorch's kernels on a GPU; LibTorch's libraries in a CPU process (measured: 0.36 GB).
  in.runtime_bytes = request.gpus_per_node > 0 ? std::int64_t{1} << 30 : std::int64_t{360} << 20;
  in.gpu_bytes = request.gpus_per_node > 0 ? request.gpu_bytes : std::nullopt;
  const auto plan = plan_memory(in);
  out << format_plan(in, plan) << fmt::format("(sequence: {} from {})\n", sequence, from);
  std::optional<double> step_seconds;  // one optimizer step's
  if (const auto speeds = detail::step_speeds(request)) {
    const auto& [gpu, fabric] = *speeds;
    const auto time = plan_step_time(in, gpu, fabric, training.reduce_dtype() == ReduceDtype::bf16);
    step_seconds = time.step * static_cast<double>(training.gradient_accumulation());
    out << format_step_time(in, time, gpu, fabric);
    if (in.gpu_bytes) out << format_step_advice(fastest_fitting_settings(in, gpu, fabric, *in.gpu_bytes));
  } else if (request.gpus_per_node > 0) {
    out << "step time: the GPU type names none hpctrain knows the speed of (h100, h200, a100, l40, a10)\n";
  }
  const auto checkpoint = detail::checkpoint_lines(in, request, step_seconds, training.steps_until_stop());
  out << checkpoint.text;
  const bool refuse_grace = request.refuse_short_grace && checkpoint.grace_too_short;
  if (!in.gpu_bytes) {
    if (request.gpus_per_node > 0)
      out << "the GPU's memory is unknown (its type names none hpctrain knows): --gpu-memory SIZE (80GB, 74.5GiB) says "
             "it\n";
    return refuse_grace ? PlanVerdict::short_grace : PlanVerdict::unknown;
  }
  if (plan.fits()) return refuse_grace ? PlanVerdict::short_grace : PlanVerdict::fits;
  out << fmt::format("hpctrain: the plan does not fit: {} per GPU against {}\n", plan_bytes(plan.peak),
                     plan_bytes(*plan.gpu));
  out << plan_advice(in, {knobs.find("activation_checkpointing") != nullptr, knobs.find(loss_chunk_knob) != nullptr});
  return PlanVerdict::does_not_fit;
}

}  // namespace hpctrain::lm
