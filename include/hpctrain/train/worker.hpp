#pragma once
// Worker mode: what one rank runs under srun or `--local N`. The knob table of a Training — the built-ins
// (--epochs, --max-steps, --batch-size, --lr, --sharding) and the program's own (`Training::knob`) — is the same one
// the login command checked; the worker reads its forwarded arguments with it, applies them, finds its place in the
// world from the environment, trains, and maps errors to the exit codes of DESIGN.md.
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/dist/fabric_check.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/job/setting.hpp>  // the knobs declared inline
#include <hpctrain/models/hf/export_format.hpp>
#include <hpctrain/names.hpp>
#include <hpctrain/slurm/world.hpp>
#include <hpctrain/train/run_directory.hpp>
#include <hpctrain/train/trainer.hpp>
#include <hpctrain/train/training.hpp>

namespace hpctrain {

/// The knob table of `training`: the built-ins (--epochs --max-steps --batch-size --lr --sharding --hsdp-group-size
/// --precision --log-every --eval-every --max-eval-examples --eval-batch-size --checkpoint-every --checkpoint-async
/// --export-dtype --export-shard-size --wandb), whose defaults are the description's values, then the program's own
/// knobs (Training::knob's, then those hpctrain::knob declared inline). Throws SpecError when a program knob reuses a
/// built-in's name. `program` (the job's name) is the W&B project a bare `--wandb` stands for when the Training names
/// none.
inline Knobs training_knobs(const Training& training, std::string_view program = "hpctrain") {
  Knobs table;
  const auto declare_count = [&](const char* name, std::optional<std::int64_t> value, const char* help) {
    if (value) table.declare<std::int64_t>(name, *value, help, positive());
    else table.declare_optional<std::int64_t>(name, help, positive());
  };
  declare_count("epochs", training.epochs(), "passes over the training data");
  declare_count("max_steps", training.max_steps(), "optimizer steps (with epochs: whichever ends first)");
  declare_count("batch_size",
                training.batch_size().value > 0 ? std::optional(training.batch_size().value) : std::nullopt,
                "examples per optimizer step (per rank or global, as the program declares)");
  table.declare<std::int64_t>("gradient_accumulation", training.gradient_accumulation(),
                              "micro-batches per optimizer step: each rank's batch is run in this many slices",
                              positive());
  if (training.lr()) table.declare<double>("lr", *training.lr(), "base learning rate", positive());
  else table.declare_optional<double>("lr", "base learning rate (default: the optimizer's)", positive());
  const KnobCheck<std::string> stage_name(
      [](const std::string& name) { return zero_stage_from_name(name).has_value(); },
      fmt::format("must be one of {}", fmt::join(zero_stage_names, ", ")));
  if (training.sharding()) {
    table.declare<std::string>("sharding", to_string(*training.sharding()),
                               "data-parallel strategy: none (replicated), zero1, zero2, zero3 or hsdp", stage_name);
  } else {
    table.declare_optional<std::string>("sharding",
                                        "data-parallel strategy: none (replicated), zero1, zero2, zero3 or hsdp "
                                        "(default: the program's strategy)",
                                        stage_name);
  }
  table.declare<std::int64_t>(
      "hsdp_group_size", training.hsdp_group_size(),
      "under --sharding hsdp: ranks per shard group, dividing the world (0: the ranks of a node)", non_negative());
  table.declare<std::string>(
      "precision", std::string(to_string(training.precision())),
      "forward precision: fp32, bf16, or auto (bf16 on a GPU or a CPU with AVX512-BF16/AMX)",
      KnobCheck<std::string>([](const std::string& name) { return precision_from_name(name).has_value(); },
                             "must be fp32, bf16 or auto"));
  table.declare<std::string>(
      "reduce_dtype", std::string(to_string(training.reduce_dtype())),
      "dtype gradients are reduced in under --sharding zero2, zero3 and hsdp: fp32, or bf16 (half the bytes)",
      KnobCheck<std::string>([](const std::string& name) { return reduce_dtype_from_name(name).has_value(); },
                             "must be fp32 or bf16"));
  table.declare<std::int64_t>("log_every", training.log_every(),
                              "steps between train records (progress lines, metrics.jsonl)", positive());
  table.declare<std::int64_t>("eval_every", training.eval_every(), "steps between evaluations (0: only at the end)",
                              non_negative());
  table.declare<std::int64_t>("max_eval_examples", training.max_eval_examples(),
                              "evaluate on the first N examples of the evaluation data (0: all)", non_negative());
  table.declare<std::int64_t>("eval_batch_size", training.eval_batch_size(),
                              "examples per evaluation forward on each rank", positive());
  table.declare<std::int64_t>("checkpoint_every", training.checkpoint_every(),
                              "steps between checkpoints (0: only at the end)", non_negative());
  table.declare<bool>(
      "checkpoint_async", training.checkpoint_async(),
      "write checkpoints in the background while the steps go on (the step serialises them into host memory)");
  table.declare<bool>("cuda_graphs", training.cuda_graphs(),
                      "capture the whole step in a CUDA graph and replay it (one GPU, batches of fixed shapes)");
  table.declare<std::string>(
      "export_dtype", "auto",
      "dtype of the weights an export writes: bf16, fp16, fp32, or auto (the pretrained checkpoint's, else bf16)",
      KnobCheck<std::string>(
          [](const std::string& name) { return name == "auto" || models::export_dtype_from_name(name); },
          "must be bf16, fp16, fp32 or auto"));
  table.declare<std::string>(
      "export_shard_size", "5GB",
      "most bytes of a safetensors file an export writes, as transformers' max_shard_size (5GB, 500MB, 2GiB)",
      KnobCheck<std::string>([](const std::string& size) { return models::parse_shard_size(size).has_value(); },
                             "must be a positive size: bytes, or a number with KB, MB, GB, KiB, MiB or GiB"));
  const char* wandb_help =
      "a W&B offline run in the run directory, project PROJECT (alone: the program's project, else the job's name), "
      "uploaded by --wandb-sync; off: none";
  if (training.wandb())
    table.declare<std::string>("wandb", training.wandb()->project(), wandb_help, wandb_project_check());
  else table.declare_optional<std::string>("wandb", wandb_help, wandb_project_check());
  table.allow_bare("wandb", training.wandb() ? training.wandb()->project() : wandb_project_name(program), "[PROJECT]");
  table.extend(training.knobs());
  table.extend(detail::inline_knobs());  // hpctrain::knob(...), declared where main uses them
  return table;
}

/// Parses `args` (`--epochs N --max-steps=N ...`) with `training`'s knob table: UsageError for an unknown
/// argument, SpecError `[hpctrain.spec.knob]` for an invalid value.
inline Knobs parse_training_knobs(const Training& training, const std::vector<std::string>& args) {
  return training_knobs(training).with_arguments(args);
}

/// `training` with the knobs applied: built-ins that were given replace the description's values (a
/// `--batch-size` keeps the declared scope, per rank or global); all values become `training.knobs()`.
inline Training with_knobs(Training training, const Knobs& knobs) {
  if (auto epochs = knobs.get_if_given<std::int64_t>("epochs")) training.epochs(*epochs);
  if (auto steps = knobs.get_if_given<std::int64_t>("max_steps")) training.max_steps(*steps);
  if (auto batch = knobs.get_if_given<std::int64_t>("batch_size"))
    training.batch_size({*batch, training.batch_size().scope});
  if (auto micro = knobs.get_if_given<std::int64_t>("gradient_accumulation")) training.gradient_accumulation(*micro);
  if (auto lr = knobs.get_if_given<double>("lr")) training.lr(*lr);
  if (auto size = knobs.get_if_given<std::int64_t>("hsdp_group_size"))
    training.hsdp_group_size(static_cast<int>(*size));
  if (auto sharding = knobs.get_if_given<std::string>("sharding"))
    training.sharding(zero_stage_from_name(*sharding).value());
  if (auto precision = knobs.get_if_given<std::string>("precision"))
    training.precision(precision_from_name(*precision).value());
  if (auto dtype = knobs.get_if_given<std::string>("reduce_dtype"))
    training.reduce_dtype(reduce_dtype_from_name(*dtype).value());
  if (auto every = knobs.get_if_given<std::int64_t>("log_every")) training.log_every(*every);
  if (auto every = knobs.get_if_given<std::int64_t>("eval_every")) training.eval_every(*every);
  if (auto examples = knobs.get_if_given<std::int64_t>("max_eval_examples")) training.max_eval_examples(*examples);
  if (auto examples = knobs.get_if_given<std::int64_t>("eval_batch_size")) training.eval_batch_size(*examples);
  if (auto every = knobs.get_if_given<std::int64_t>("checkpoint_every")) training.checkpoint_every(*every);
  if (auto async = knobs.get_if_given<bool>("checkpoint_async")) training.checkpoint_async(*async);
  if (auto graphs = knobs.get_if_given<bool>("cuda_graphs")) training.cuda_graphs(*graphs);
  if (auto project = knobs.get_if_given<std::string>("wandb")) {
    if (project->empty() || *project == "off") training.no_wandb();
    else training.wandb(training.wandb() ? Wandb(*training.wandb()).project(*project) : Wandb(*project));
  }
  if (training.schedule_from_knobs()) training.schedule(training.schedule_from_knobs()(knobs));
  training.knob_values(knobs);
  return training;
}

namespace detail {
/// A whole number of seconds in [0, 86400] from environment variable `name`, or nothing when it is unset;
/// RuntimeError(rendezvous) naming the variable and its value otherwise.
inline std::optional<std::int64_t> seconds_from_environment(const char* name) {
  const auto text = hpctrain::getenv(name);
  if (!text) return std::nullopt;
  std::int64_t seconds = -1;
  const auto [end, error] = std::from_chars(text->data(), text->data() + text->size(), seconds);
  if (error != std::errc() || end != text->data() + text->size() || seconds < 0 || seconds > 86400)
    throw RuntimeError(errors::runtime_rendezvous,
                       fmt::format("{}={:?} is not a whole number of seconds in [0, 86400]", name, *text));
  return seconds;
}

/// The distributed runtime's settings: the rendezvous, collective and checkpoint timeouts from
/// HPCTRAIN_RENDEZVOUS_TIMEOUT_S, HPCTRAIN_COLLECTIVE_TIMEOUT_S and HPCTRAIN_CHECKPOINT_TIMEOUT_S where set (the
/// script exports the site file's; the submitting shell's win there).
inline dist::Options dist_options_from_environment() {
  dist::Options options;
  const std::pair<const char*, std::chrono::milliseconds*> timeouts[] = {
      {env::rendezvous_timeout, &options.rendezvous_timeout},
      {env::collective_timeout, &options.collective_timeout},
      {env::checkpoint_timeout, &options.checkpoint_timeout}};
  for (const auto& [name, timeout] : timeouts)
    if (auto seconds = seconds_from_environment(name)) {
      if (*seconds == 0)
        throw RuntimeError(errors::runtime_rendezvous, fmt::format("{}=0: the timeout must be positive", name));
      *timeout = std::chrono::seconds(*seconds);
    }
  return options;
}

/// `--check-fabric`'s request (HPCTRAIN_CHECK_FABRIC_MAX_BYTES: the largest message, 0 for the backend's
/// default) and the site's expected bus bandwidth (HPCTRAIN_EXPECTED_BUSBW_GBPS), both set by the login command.
inline std::optional<std::int64_t> check_fabric_request() {
  const auto text = hpctrain::getenv(env::check_fabric);
  if (!text) return std::nullopt;
  std::int64_t bytes = -1;
  const auto [end, error] = std::from_chars(text->data(), text->data() + text->size(), bytes);
  if (error != std::errc() || end != text->data() + text->size() || bytes < 0)
    throw RuntimeError(errors::runtime_fabric,
                       fmt::format("{}={:?} is not a number of bytes", env::check_fabric, *text));
  return bytes;
}

inline std::optional<double> expected_busbw_from_environment() {
  const auto text = hpctrain::getenv(env::expected_busbw);
  if (!text) return std::nullopt;
  char* end = nullptr;
  const double gbps = std::strtod(text->c_str(), &end);
  if (end != text->c_str() + text->size() || !(gbps > 0))
    throw RuntimeError(errors::runtime_fabric,
                       fmt::format("{}={:?} is not a positive number of GB/s", env::expected_busbw, *text));
  return gbps;
}

}  // namespace detail

/// One rank: applies the knobs, trains, returns exit_ok, exit_requeue, exit_usage or exit_failure.
inline int run_worker(const Training& training, const Knobs& knobs) {
  int rank = 0;
  try {
    const auto world = slurm::world_from_environment();
    rank = world.rank;
    const auto configured = with_knobs(training, knobs);
    if (rank == 0) fmt::print("hpctrain: {}\n", resolve_run_directory(configured.run_dir()).describe());
    std::fflush(stdout);
    const auto options = detail::dist_options_from_environment();
    if (const auto max_bytes = detail::check_fabric_request())  // --check-fabric: measure, do not train
      return dist::check_fabric(world, options, *max_bytes, detail::expected_busbw_from_environment());
    // Refused alike on every rank, before any rank connects; at one rank hsdp trains as Replicated (no groups).
    if (configured.sharding() == hsdp && !sharded_stage_runs_replicated(ZeroStage::hsdp, world.world_size))
      hsdp_shard_group_size(configured.hsdp_group_size(), world.world_size, world.local_world_size);
    return train(configured, world, options).exit_code;
  } catch (const std::exception& error) {  // hpctrain's errors, and c10::Error from LibTorch
    fmt::print(stderr, "rank {}: {}\n", rank, error.what());
    return exit_code_of(error);
  }
}

}  // namespace hpctrain
