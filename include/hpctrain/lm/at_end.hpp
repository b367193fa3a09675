#pragma once
// What a language-model run does once it has finished (Training::at_end hooks, called after the final evaluation,
// under every strategy): report the validation loss, print a greedy sample (from the whole model), and export the
// model in Hugging Face format with its tokenizer, for `transformers` and `generate` (unit by unit: a sharded
// model is never whole on any rank).
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>  // std::hash: the staging directory's token
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fcntl.h>   // O_DIRECTORY: the export directory's rename made durable
#include <unistd.h>  // getpid: the name of the export an export replaces, while it is removed

#include <fmt/format.h>
#include <torch/torch.h>

#include <hpctrain/compiled_runtime.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/files.hpp>
#include <hpctrain/lm/hooks.hpp>
#include <hpctrain/lm/run_tokenizer.hpp>
#include <hpctrain/lm/setting.hpp>
#include <hpctrain/models/generation/generation.hpp>
#include <hpctrain/models/hf/hf_checkpoint.hpp>
#include <hpctrain/models/hf/hf_export.hpp>
#include <hpctrain/models/lora/lora.hpp>
#include <hpctrain/models/roberta.hpp>
#include <hpctrain/train/run_context.hpp>

namespace hpctrain::lm {

namespace detail {
/// The model of a finish hook as a causal LM; RuntimeError naming `what` for another module.
inline models::CausalLM& causal_lm(torch::nn::Module& module, std::string_view what) {
  auto* model = dynamic_cast<models::CausalLM*>(&module);
  if (model == nullptr)
    throw RuntimeError(errors::runtime_io,
                       fmt::format("{} needs a models::CausalLM; the model is {}", what, module.name()));
  return *model;
}

inline void copy_file_atomically(const std::filesystem::path& from, const std::filesystem::path& to) {
  hpctrain::detail::write_file_atomically(to, hpctrain::detail::read_file(from));
}
}  // namespace detail

namespace detail {
/// What an export writes: --export-dtype (auto: the dtype the pretrained checkpoint states, else bf16) and
/// --export-shard-size.
inline models::ExportFormat export_format(const Knobs& knobs, std::optional<torch::Dtype> stated) {
  models::ExportFormat format;
  const auto dtype = knobs.get<std::string>("export_dtype");
  format.dtype = dtype == "auto" ? stated.value_or(torch::kBFloat16) : models::export_dtype_from_name(dtype).value();
  format.max_shard_bytes = models::parse_shard_size(knobs.get<std::string>("export_shard_size")).value();
  return format;
}

/// A directory written whole under a temporary name beside `target`, then renamed into place, replacing the one
/// there: a crash leaves the previous export or none, never a half-written one that loads. Its owner makes the
/// temporary directory and commits it; the ranks that write into it too name it with the same `token` (the run's:
/// every rank's is the same, and two runs exporting to one place do not meet). Dropped uncommitted (an exception),
/// the owner removes it.
class StagedDirectory {
 public:
  StagedDirectory(std::filesystem::path target, std::string_view token, bool owner)
      : target_(std::filesystem::absolute(std::move(target)).lexically_normal()), owner_(owner) {
    if (!target_.has_filename()) target_ = target_.parent_path();  // "dir/" names dir
    staging_ = sibling(fmt::format(".tmp.{}", token));
    if (!owner_) return;
    hpctrain::detail::remove_tree(staging_);  // a crashed export's leftovers, of this run
    std::filesystem::create_directories(staging_);
  }
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;
  ~StagedDirectory() {
    if (owner_ && !committed_) hpctrain::detail::remove_tree(staging_);
  }
  const std::filesystem::path& path() const { return staging_; }

  /// Renames the written directory to the target (the previous one, if any, moved aside first and removed).
  void commit() {
    const auto previous = sibling(fmt::format(".old.{}", ::getpid()));
    const bool replaces = std::filesystem::exists(target_);
    if (replaces) std::filesystem::rename(target_, previous);
    std::filesystem::rename(staging_, target_);
    committed_ = true;
    hpctrain::detail::fsync_path(target_.parent_path(), O_RDONLY | O_DIRECTORY, errors::runtime_io);
    if (replaces) hpctrain::detail::remove_tree(previous);
  }

 private:
  std::filesystem::path sibling(std::string_view suffix) const {
    return target_.parent_path() / fmt::format(".{}{}", target_.filename().string(), suffix);
  }
  std::filesystem::path target_, staging_;
  bool owner_;
  bool committed_ = false;
};

/// Writes the run's model into `out` as hf_export does; the files written. Every rank takes part in the gathers and
/// sees every unit whole in turn, so each writes its share of the weights' shards (safetensors::ShardShare: shard i
/// by rank i % world size) in parallel; rank 0 the index, config.json and the adapter. A causal LM is visited unit
/// by unit (never whole on any rank) and written in the export's format. With
/// LoRA, the merged model in `merged/` (what merge_and_unload gives), each unit merged as it passes
/// (models::merged_unit), then the adapter as PEFT writes it (adapter_config.json, adapter_model.safetensors;
/// PeftModel.from_pretrained loads it over the base) from the adapters collected on the way (r · (in + out) a layer).
/// Any other model with a Hugging Face layout (a masked LM: RoBERTa, BERT) is visited unit by unit too, by default
/// in its own dtype (--export-dtype auto).
inline std::vector<std::string> export_model(const FinishContext& at_end, const std::filesystem::path& out) {
  const bool lead = at_end.run.rank == 0;
  const models::safetensors::ShardShare share{static_cast<std::size_t>(at_end.run.rank),
                                              static_cast<std::size_t>(at_end.run.world_size)};
  models::hf_layout(at_end.module, out);  // every rank refuses a model without one, before any gather
  auto* causal = dynamic_cast<models::CausalLM*>(&at_end.module);
  // auto: the checkpoint's dtype, else bf16 for a causal LM and the parameters' own dtype for an encoder (small).
  auto stated = models::stated_dtype(at_end.module);
  if (causal == nullptr && !stated) stated = at_end.module.parameters().front().scalar_type();
  const auto format = export_format(at_end.run.knobs, stated);
  const auto order = at_end.unit_shapes();
  if (causal != nullptr && at_end.run.lora) {
    auto& model = *causal;
    const auto scalings = models::lora_scalings(model);
    models::NamedUnit adapters;  // rank 0's, for the adapter it writes
    const auto merging = [&](const models::UnitVisitor& write) {
      at_end.visit_units([&](const models::NamedUnit& unit) {
        for (const auto& [name, tensor] : unit)
          if (lead && models::is_lora_parameter(name))
            adapters.emplace_back(name, tensor.to(torch::kFloat32, false, true));
        write(models::merged_unit(unit, scalings));
      });
    };
    auto merged = models::save_pretrained_by_units(model, order, merging, out / "merged", format, share);
    if (!lead) return merged;
    const auto base =
        at_end.run.pretrained_dir ? std::filesystem::absolute(*at_end.run.pretrained_dir).string() : std::string();
    models::save_peft_adapter(adapters, out, *at_end.run.lora, base, models::hf_names(model),
                              models::stores_transposed_projections(model));
    return {"adapter_config.json", "adapter_model.safetensors", "merged/"};
  }
  return models::save_pretrained_by_units(
      at_end.module, order, [&](const models::UnitVisitor& visit) { at_end.visit_units(visit); }, out, format, share);
}
}  // namespace detail

#if HPCTRAIN_RUNTIME_DEFINITIONS
HPCTRAIN_RUNTIME_INLINE FinishHook hf_export(std::optional<std::filesystem::path> directory) {
  return FinishHook::unit_by_unit([directory](const FinishContext& at_end) {
    const auto out = directory.value_or(at_end.run.run_dir / "export");
    const bool lead = at_end.run.rank == 0;
    // Every rank writes its shards into rank 0's staging directory: made before anyone writes, committed after
    // everyone has (the waits run under the checkpoint timeout: a slow file system is the writers' business).
    detail::StagedDirectory staged(out, fmt::format("{:x}", std::hash<std::string>{}(at_end.run.run_dir.string())),
                                   lead);
    at_end.wait_for_writers();
    auto names = detail::export_model(at_end, staged.path());
    at_end.wait_for_writers();
    if (!lead) {
      if (!names.empty())
        fmt::print("rank {} wrote {} of the export's files ({})\n", at_end.run.rank, names.size(),
                   fmt::join(names, ", "));
      return;
    }
    if (const auto source = tokenizer_directory(at_end.run))
      for (const auto& file : tokenizer_files_in(*source)) {
        detail::copy_file_atomically(file, staged.path() / file.filename());
        if (at_end.run.lora) detail::copy_file_atomically(file, staged.path() / "merged" / file.filename());
        names.push_back(file.filename().string());
      }
    staged.commit();
    fmt::print("exported the model to {} ({})\n", out.string(), fmt::join(names, ", "));
  });
}

HPCTRAIN_RUNTIME_INLINE FinishHook sample_at_end(Setting<std::string> prompt, Setting<std::int64_t> tokens) {
  // Unit by unit: under ZeRO-3/HSDP every rank runs the same greedy generation, each block gathered while it runs
  // (never the whole model on a rank); otherwise rank 0 alone. Rank 0 prints it.
  return FinishHook::unit_by_unit([prompt, tokens](const FinishContext& at_end) {
    if (at_end.run.rank != 0 && !at_end.forward_is_collective()) return;
    auto& model = detail::causal_lm(at_end.module, "sample_at_end");
    const auto tokenizer = run_tokenizer(at_end.run, "sample_at_end");
    const auto text = prompt.get(at_end.run.knobs);
    std::vector<std::int64_t> ids;
    for (auto id : tokenizer.encode(text)) ids.push_back(static_cast<std::int64_t>(id));
    models::GenerationOptions options;
    options.max_new_tokens = tokens.get(at_end.run.knobs);
    options.vocabulary =
        static_cast<std::int64_t>(tokenizer.vocab_size());  // a padded vocabulary's extra ids are no token
    if (const auto limit = model.max_positions())
      options.max_new_tokens = std::min(options.max_new_tokens, *limit - static_cast<std::int64_t>(ids.size()));
    if (ids.empty() || options.max_new_tokens <= 0) return;
    const auto generated = models::generate(model, ids, options);
    if (at_end.run.rank != 0) return;
    fmt::print("sample (greedy): {}{}\n", text,
               tokenizer.decode(std::vector<text::TokenId>(generated.begin(), generated.end())));
  });
}

HPCTRAIN_RUNTIME_INLINE FinishHook print_eval_loss(std::string name) {
  return FinishHook::unit_by_unit([name](const FinishContext& at_end) {  // reads no weight: nothing to gather
    if (at_end.run.rank == 0 && at_end.result.eval_loss) fmt::print("{}={:.4f}\n", name, *at_end.result.eval_loss);
  });
}
#endif  // HPCTRAIN_RUNTIME_DEFINITIONS

}  // namespace hpctrain::lm
