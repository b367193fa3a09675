#pragma once
// The built-in knobs, one row each: the declaration (name, type, default from the description, check, help), where
// the value goes (into the Training the worker trains, or read later from Training::knobs() by the reader the row
// names), and — for the test that no row is checked at login and then ignored on the workers — a value to try and
// how to read it back. training_knobs (the table the login command, --help and the worker read) and with_knobs (the
// worker's Training) walk these rows; the planner (lm/plan.hpp) reads the same with_knobs. Adding a knob is a row.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/job/knobs.hpp>
#include <hpctrain/job/setting.hpp>  // the knobs declared inline
#include <hpctrain/models/hf/export_format.hpp>
#include <hpctrain/train/loggers/wandb.hpp>
#include <hpctrain/train/precision.hpp>
#include <hpctrain/train/strategies/sharding.hpp>
#include <hpctrain/train/training.hpp>

namespace hpctrain {

/// One built-in knob (see the header comment).
struct BuiltinKnob {
  const char* name;
  /// Declares the knob in `table`, its default the description's value.
  void (*declare)(Knobs& table, const char* name, const Training& described, std::string_view program);
  /// Puts a given value into the worker's Training; nullptr when `reader` reads it from Training::knobs().
  void (*apply)(Training& training, const Knobs& knobs, const char* name);
  const char* reader;   ///< with apply == nullptr: where the value is read
  const char* example;  ///< a valid value unlike the default, for the check
  /// What the worker's Training holds for this knob, spelled as `example` is.
  std::string (*read_back)(const Training& training, const char* name);
};

namespace detail {
inline void declare_count(Knobs& table, const char* name, std::optional<std::int64_t> value, const char* help) {
  if (value) table.declare<std::int64_t>(name, *value, help, positive());
  else table.declare_optional<std::int64_t>(name, help, positive());
}
template <class T>
std::string spelled(const std::optional<T>& value) {
  return value ? fmt::format("{}", *value) : "-";
}
template <class T>
std::string spelled(const T& value) {
  return fmt::format("{}", value);
}
inline std::string knob_value(const Training& training, const char* name) {
  return training.knobs().get<std::string>(name);
}
inline constexpr const char* wandb_help =
    "a W&B offline run in the run directory, project PROJECT (alone: the program's project, else the job's name), "
    "uploaded by --wandb-sync; off: none";
}  // namespace detail

/// The rows, in --help's order.
inline const std::vector<BuiltinKnob>& builtin_knobs() {
  using T = const Training&;
  static const std::vector<BuiltinKnob> rows = {
      {"epochs",
       [](Knobs& k, const char* n, T d, std::string_view) {
         detail::declare_count(k, n, d.epochs(), "passes over the training data");
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto v = k.get_if_given<std::int64_t>(n)) t.epochs(*v);
       },
       nullptr, "7", [](T t, const char*) { return detail::spelled(t.epochs()); }},
      {"max_steps",
       [](Knobs& k, const char* n, T d, std::string_view) {
         detail::declare_count(k, n, d.max_steps(), "optimizer steps (with epochs: whichever ends first)");
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto v = k.get_if_given<std::int64_t>(n)) t.max_steps(*v);
       },
       nullptr, "13", [](T t, const char*) { return detail::spelled(t.max_steps()); }},
      {"batch_size",
       [](Knobs& k, const char* n, T d, std::string_view) {
         detail::declare_count(k, n, d.batch_size().value > 0 ? std::optional(d.batch_size().value) : std::nullopt,
                               "examples per optimizer step (per rank or global, as the program declares)");
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto v = k.get_if_given<std::int64_t>(n)) t.batch_size({*v, t.batch_size().scope});  // the scope kept
       },
       nullptr, "24", [](T t, const char*) { return detail::spelled(t.batch_size().value); }},
      {"gradient_accumulation",
       [](Knobs& k, const char* n, T d, std::string_view) {
         k.declare<std::int64_t>(n, d.gradient_accumulation(),
                                 "micro-batches per optimizer step: each rank's batch is run in this many slices",
                                 positive());
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto v = k.get_if_given<std::int64_t>(n)) t.gradient_accumulation(*v);
       },
       nullptr, "3", [](T t, const char*) { return detail::spelled(t.gradient_accumulation()); }},
      {"lr",
       [](Knobs& k, const char* n, T d, std::string_view) {
         if (d.lr()) k.declare<double>(n, *d.lr(), "base learning rate", positive());
         else k.declare_optional<double>(n, "base learning rate (default: the optimizer's)", positive());
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto v = k.get_if_given<double>(n)) t.lr(*v);
       },
       nullptr, "0.25", [](T t, const char*) { return detail::spelled(t.lr()); }},
      {"seed",
       [](Knobs& k, const char* n, T d, std::string_view) {
         k.declare<std::int64_t>(n, d.seed(),
                                 "the run's seed: the model's initialisation (a model from scratch or from a config "
                                 "alone), the data's order, masks and dropout",
                                 non_negative());
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto v = k.get_if_given<std::int64_t>(n)) t.seed(*v);
       },
       nullptr, "17", [](T t, const char*) { return detail::spelled(t.seed()); }},
      {"sharding",
       [](Knobs& k, const char* n, T d, std::string_view) {
         const KnobCheck<std::string> stage_name(
             [](const std::string& name) { return zero_stage_from_name(name).has_value(); },
             fmt::format("must be one of {}", fmt::join(zero_stage_names, ", ")));
         const char* help = "data-parallel strategy: none (replicated), zero1, zero2, zero3 or hsdp";
         if (d.sharding()) k.declare<std::string>(n, to_string(*d.sharding()), help, stage_name);
         else k.declare_optional<std::string>(n, fmt::format("{} (default: the program's strategy)", help), stage_name);
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto v = k.get_if_given<std::string>(n)) t.sharding(zero_stage_from_name(*v).value());
       },
       nullptr, "zero2", [](T t, const char*) { return t.sharding() ? to_string(*t.sharding()) : "-"; }},
      {"hsdp_group_size",
       [](Knobs& k, const char* n, T d, std::string_view) {
         k.declare<std::int64_t>(n, d.hsdp_group_size(),
                                 "under --sharding hsdp: ranks per shard group, dividing the world (0: the ranks of "
                                 "a node)",
                                 non_negative());
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto v = k.get_if_given<std::int64_t>(n)) t.hsdp_group_size(static_cast<int>(*v));
       },
       nullptr, "4", [](T t, const char*) { return detail::spelled(t.hsdp_group_size()); }},
      {"shard_at_one_rank",
       [](Knobs& k, const char* n, T d, std::string_view) {
         k.declare<bool>(n, d.shard_at_one_rank(),
                         "at one rank, a sharded --sharding runs its own strategy instead of training as replicated "
                         "(to measure or reproduce it in one process)");
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto v = k.get_if_given<bool>(n)) t.shard_at_one_rank(*v);
       },
       nullptr, "true", [](T t, const char*) { return detail::spelled(t.shard_at_one_rank()); }},
      {"precision",
       [](Knobs& k, const char* n, T d, std::string_view) {
         k.declare<std::string>(
             n, std::string(to_string(d.precision())),
             "forward precision: fp32, bf16, or auto (bf16 on a GPU or a CPU with AVX512-BF16/AMX)",
             KnobCheck<std::string>([](const std::string& name) { return precision_from_name(name).has_value(); },
                                    "must be fp32, bf16 or auto"));
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto v = k.get_if_given<std::string>(n)) t.precision(precision_from_name(*v).value());
       },
       nullptr, "bf16", [](T t, const char*) { return std::string(to_string(t.precision())); }},
      {"reduce_dtype",
       [](Knobs& k, const char* n, T d, std::string_view) {
         k.declare<std::string>(
             n, std::string(to_string(d.reduce_dtype())),
             "dtype gradients are reduced in under --sharding zero2, zero3 and hsdp: fp32, or bf16 (half the bytes)",
             KnobCheck<std::string>([](const std::string& name) { return reduce_dtype_from_name(name).has_value(); },
                                    "must be fp32 or bf16"));
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto v = k.get_if_given<std::string>(n)) t.reduce_dtype(reduce_dtype_from_name(*v).value());
       },
       nullptr, "bf16", [](T t, const char*) { return std::string(to_string(t.reduce_dtype())); }},
      {"log_every",
       [](Knobs& k, const char* n, T d, std::string_view) {
         k.declare<std::int64_t>(n, d.log_every(), "steps between train records (progress lines, metrics.jsonl)",
                                 positive());
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto v = k.get_if_given<std::int64_t>(n)) t.log_every(*v);
       },
       nullptr, "3", [](T t, const char*) { return detail::spelled(t.log_every()); }},
      {"eval_every",
       [](Knobs& k, const char* n, T d, std::string_view) {
         k.declare<std::int64_t>(n, d.eval_every(), "steps between evaluations (0: only at the end)", non_negative());
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto v = k.get_if_given<std::int64_t>(n)) t.eval_every(*v);
       },
       nullptr, "5", [](T t, const char*) { return detail::spelled(t.eval_every()); }},
      {"max_eval_examples",
       [](Knobs& k, const char* n, T d, std::string_view) {
         k.declare<std::int64_t>(n, d.max_eval_examples(),
                                 "evaluate on the first N examples of the evaluation data (0: all)", non_negative());
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto v = k.get_if_given<std::int64_t>(n)) t.max_eval_examples(*v);
       },
       nullptr, "9", [](T t, const char*) { return detail::spelled(t.max_eval_examples()); }},
      {"eval_batch_size",
       [](Knobs& k, const char* n, T d, std::string_view) {
         k.declare<std::int64_t>(n, d.eval_batch_size(), "examples per evaluation forward on each rank", positive());
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto v = k.get_if_given<std::int64_t>(n)) t.eval_batch_size(*v);
       },
       nullptr, "6", [](T t, const char*) { return detail::spelled(t.eval_batch_size()); }},
      {"checkpoint_every",
       [](Knobs& k, const char* n, T d, std::string_view) {
         k.declare<std::int64_t>(n, d.checkpoint_every(), "steps between checkpoints (0: only at the end)",
                                 non_negative());
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto v = k.get_if_given<std::int64_t>(n)) t.checkpoint_every(*v);
       },
       nullptr, "11", [](T t, const char*) { return detail::spelled(t.checkpoint_every()); }},
      {"checkpoint_async",
       [](Knobs& k, const char* n, T d, std::string_view) {
         k.declare<bool>(n, d.checkpoint_async(),
                         "write checkpoints in the background while the steps go on (the step serialises them into "
                         "host memory)");
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto v = k.get_if_given<bool>(n)) t.checkpoint_async(*v);
       },
       nullptr, "true", [](T t, const char*) { return detail::spelled(t.checkpoint_async()); }},
      {"report_digest",
       [](Knobs& k, const char* n, T d, std::string_view) {
         k.declare<bool>(n, d.report_digest(),
                         "every rank prints its parameters' CRC-32C at the end (rank <r> parameters_crc32c=<hex>): "
                         "two runs that should train the same compare bit for bit");
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto v = k.get_if_given<bool>(n)) t.report_digest(*v);
       },
       nullptr, "true", [](T t, const char*) { return detail::spelled(t.report_digest()); }},
      {"cuda_graphs",
       [](Knobs& k, const char* n, T d, std::string_view) {
         k.declare<bool>(n, d.cuda_graphs(),
                         "capture the whole step in a CUDA graph and replay it (one GPU, batches of fixed shapes)");
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto v = k.get_if_given<bool>(n)) t.cuda_graphs(*v);
       },
       nullptr, "true", [](T t, const char*) { return detail::spelled(t.cuda_graphs()); }},
      {"float8",
       [](Knobs& k, const char* n, T d, std::string_view) {
         k.declare<bool>(n, d.float8(),
                         "the blocks' projections of a full fine-tuning in float8 with rowwise scales (torchao's "
                         "recipe), the head and norms in bf16: CUDA with compute capability 8.9 or above, --precision "
                         "bf16, no LoRA");
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto v = k.get_if_given<bool>(n)) t.float8(*v);
       },
       nullptr, "true", [](T t, const char*) { return detail::spelled(t.float8()); }},
      {"export_dtype",
       [](Knobs& k, const char* n, T, std::string_view) {
         k.declare<std::string>(
             n, "auto",
             "dtype of the weights an export writes: bf16, fp16, fp32, or auto (the pretrained checkpoint's, else "
             "bf16)",
             KnobCheck<std::string>(
                 [](const std::string& name) { return name == "auto" || models::export_dtype_from_name(name); },
                 "must be bf16, fp16, fp32 or auto"));
       },
       nullptr, "lm/at_end.hpp (the Hugging Face export)", "fp16", detail::knob_value},
      {"export_shard_size",
       [](Knobs& k, const char* n, T, std::string_view) {
         k.declare<std::string>(
             n, "5GB",
             "most bytes of a safetensors file an export writes, as transformers' max_shard_size (5GB, 500MB, 2GiB)",
             KnobCheck<std::string>([](const std::string& size) { return models::parse_shard_size(size).has_value(); },
                                    "must be a positive size: bytes, or a number with KB, MB, GB, KiB, MiB or GiB"));
       },
       nullptr, "lm/at_end.hpp (the Hugging Face export)", "2GB", detail::knob_value},
      {"wandb",
       [](Knobs& k, const char* n, T d, std::string_view program) {
         if (d.wandb()) k.declare<std::string>(n, d.wandb()->project(), detail::wandb_help, wandb_project_check());
         else k.declare_optional<std::string>(n, detail::wandb_help, wandb_project_check());
         k.allow_bare(n, d.wandb() ? d.wandb()->project() : wandb_project_name(program), "[PROJECT]");
       },
       [](Training& t, const Knobs& k, const char* n) {
         if (auto project = k.get_if_given<std::string>(n)) {
           if (project->empty() || *project == "off") t.no_wandb();
           else t.wandb(t.wandb() ? Wandb(*t.wandb()).project(*project) : Wandb(*project));
         }
       },
       nullptr, "a-project", [](T t, const char*) { return t.wandb() ? t.wandb()->project() : std::string("-"); }},
  };
  return rows;
}

/// The knob table of `training`: the built-in rows, whose defaults are the description's values, then the program's
/// own knobs (Training::knob's, then those hpctrain::knob declared inline). Throws SpecError when a program knob
/// reuses a built-in's name. `program` (the job's name) is the W&B project a bare `--wandb` stands for when the
/// Training names none.
inline Knobs training_knobs(const Training& training, std::string_view program = "hpctrain") {
  Knobs table;
  for (const auto& row : builtin_knobs()) row.declare(table, row.name, training, program);
  table.extend(training.knobs());
  table.extend(detail::inline_knobs());  // hpctrain::knob(...), declared where main uses them
  return table;
}

/// Parses `args` (`--epochs N --max-steps=N ...`) with `training`'s knob table: UsageError for an unknown
/// argument, SpecError `[hpctrain.spec.knob]` for an invalid value.
inline Knobs parse_training_knobs(const Training& training, const std::vector<std::string>& args) {
  return training_knobs(training).with_arguments(args);
}

/// `training` with the knobs applied: built-ins that were given replace the description's values (a `--batch-size`
/// keeps the declared scope, per rank or global); all values become `training.knobs()`.
inline Training with_knobs(Training training, const Knobs& knobs) {
  for (const auto& row : builtin_knobs())
    if (row.apply != nullptr) row.apply(training, knobs, row.name);
  if (training.schedule_from_knobs()) training.schedule(training.schedule_from_knobs()(knobs));
  training.knob_values(knobs);
  return training;
}

}  // namespace hpctrain
