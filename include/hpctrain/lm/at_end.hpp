#pragma once
// What a language-model run does once it has finished (Training::at_end hooks, called with the whole model
// after the final evaluation, under every strategy): report the validation loss, print a greedy sample,
// and export the model in Hugging Face format with its tokenizer, for `transformers` and `generate`.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <hpctrain/compiled_runtime.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/job/files.hpp>
#include <hpctrain/lm/setting.hpp>
#include <hpctrain/models/generation.hpp>
#include <hpctrain/models/hf_checkpoint.hpp>
#include <hpctrain/models/roberta.hpp>
#include <hpctrain/text/prepare_step.hpp>
#include <hpctrain/text/tiktoken.hpp>
#include <hpctrain/train/run_context.hpp>

namespace hpctrain::lm {

/// Where this run's tokenizer files are: the pretrained model's directory, else the preparation's tokens
/// directory (text::prepare_tokens_step keeps its tokenizer there); nothing when neither exists.
inline std::optional<std::filesystem::path> tokenizer_directory(const RunContext& run) {
  if (run.pretrained_dir) return run.pretrained_dir;
  if (run.prepared_dir && std::filesystem::is_directory(*run.prepared_dir / text::prepared_tokens_subdir))
    return *run.prepared_dir / text::prepared_tokens_subdir;
  return std::nullopt;
}

/// The tokenizer file of `directory`: tokenizer.json, else the first *.tiktoken file (in name order).
inline std::optional<std::filesystem::path> tokenizer_file_in(const std::filesystem::path& directory) {
  if (std::filesystem::is_regular_file(directory / "tokenizer.json")) return directory / "tokenizer.json";
  std::vector<std::filesystem::path> candidates;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error))
    if (entry.path().extension() == ".tiktoken") candidates.push_back(entry.path());
  std::sort(candidates.begin(), candidates.end());
  if (candidates.empty()) return std::nullopt;
  return candidates.front();
}

/// The files of a tokenizer directory that an export carries along (tokenizer, its config, chat template).
inline std::vector<std::filesystem::path> tokenizer_files_in(const std::filesystem::path& directory) {
  std::vector<std::filesystem::path> files;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                           "generation_config.json"})
    if (std::filesystem::is_regular_file(directory / name)) files.push_back(directory / name);
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error))
    if (entry.path().extension() == ".tiktoken") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

namespace detail {
/// The model of a finish hook as a causal LM; RuntimeError naming `what` for another module.
inline models::CausalLM& causal_lm(torch::nn::Module& module, std::string_view what) {
  auto* model = dynamic_cast<models::CausalLM*>(&module);
  if (model == nullptr) throw RuntimeError(errors::runtime_io, fmt::format("{} needs a models::CausalLM; the model is {}", what, module.name()));
  return *model;
}

/// The whole of `file`; RuntimeError naming it when it cannot be read.
inline std::string read_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream content;
  content << in.rdbuf();
  if (!in.is_open() || in.bad()) throw RuntimeError(errors::runtime_io, fmt::format("{}: cannot read", file.string()));
  return content.str();
}

inline void copy_file_atomically(const std::filesystem::path& from, const std::filesystem::path& to) {
  hpctrain::detail::write_file_atomically(to, read_file(from));
}
}  // namespace detail

namespace detail {
/// A causal LM as hf_export writes it; the files written. With LoRA: the adapter as PEFT writes it
/// (adapter_config.json, adapter_model.safetensors; PeftModel.from_pretrained loads it over the base), then the
/// merged model in `merged/` (what merge_and_unload gives).
inline std::vector<std::string> export_causal_lm(models::CausalLM& model, const FinishContext& at_end, const std::filesystem::path& out) {
  if (!at_end.run.lora) {
    models::save_pretrained(model, out);
    return {"config.json", "model.safetensors"};
  }
  const auto base = at_end.run.pretrained_dir ? std::filesystem::absolute(*at_end.run.pretrained_dir).string() : std::string();
  models::save_peft_adapter(model, out, *at_end.run.lora, base, models::hf_names(model), models::stores_transposed_projections(model));
  models::merge_lora(model);
  models::save_pretrained(model, out / "merged");
  return {"adapter_config.json", "adapter_model.safetensors", "merged/"};
}
}  // namespace detail

/// At the end, rank 0 writes the model — a causal LM (GPT-2, Llama, ...; with LoRA its PEFT adapter and the
/// merged model) or a masked LM (RoBERTa, BERT) — to `directory` (default: `<run dir>/export`) as a Hugging
/// Face directory with the run's tokenizer files, and says where.
HPCTRAIN_RUNTIME_INLINE FinishHook hf_export(std::optional<std::filesystem::path> directory = std::nullopt);

/// At the end, rank 0 prints `sample (greedy): <prompt><continuation>` — `tokens` new tokens (or fewer when
/// the model's positions run out) decoded with the run's tokenizer.
HPCTRAIN_RUNTIME_INLINE FinishHook sample_at_end(Setting<std::string> prompt, Setting<std::int64_t> tokens = std::int64_t{40});

/// At the end, rank 0 prints `<name>=<final evaluation loss>` (four decimals), the line scripts look for.
HPCTRAIN_RUNTIME_INLINE FinishHook print_eval_loss(std::string name = "val_loss");

#if HPCTRAIN_RUNTIME_DEFINITIONS
HPCTRAIN_RUNTIME_INLINE FinishHook hf_export(std::optional<std::filesystem::path> directory) {
  return [directory](const FinishContext& at_end) {
    if (at_end.run.rank != 0) return;
    const auto out = directory.value_or(at_end.run.run_dir / "export");
    std::vector<std::string> names{"config.json", "model.safetensors"};
    if (auto* encoder = dynamic_cast<models::RobertaForMaskedLMImpl*>(&at_end.module))
      models::save_pretrained(*encoder, out);
    else
      names = detail::export_causal_lm(detail::causal_lm(at_end.module, "hf_export"), at_end, out);
    if (const auto source = tokenizer_directory(at_end.run))
      for (const auto& file : tokenizer_files_in(*source)) {
        detail::copy_file_atomically(file, out / file.filename());
        if (at_end.run.lora) detail::copy_file_atomically(file, out / "merged" / file.filename());
        names.push_back(file.filename().string());
      }
    fmt::print("exported the model to {} ({})\n", out.string(), fmt::join(names, ", "));
  };
}

HPCTRAIN_RUNTIME_INLINE FinishHook sample_at_end(Setting<std::string> prompt, Setting<std::int64_t> tokens) {
  return [prompt, tokens](const FinishContext& at_end) {
    if (at_end.run.rank != 0) return;
    const auto directory = tokenizer_directory(at_end.run);
    const auto file = directory ? tokenizer_file_in(*directory) : std::nullopt;
    if (!file) throw RuntimeError(errors::runtime_io, "sample_at_end: this run has no tokenizer (neither a pretrained directory nor prepared tokens)");
    auto& model = detail::causal_lm(at_end.module, "sample_at_end");
    const auto tokenizer = text::load_tokenizer(*file);
    const auto text = prompt.get(at_end.run.knobs);
    std::vector<std::int64_t> ids;
    for (auto id : tokenizer.encode(text)) ids.push_back(static_cast<std::int64_t>(id));
    models::GenerationOptions options;
    options.max_new_tokens = tokens.get(at_end.run.knobs);
    options.vocabulary = static_cast<std::int64_t>(tokenizer.vocab_size());  // a padded vocabulary's extra ids are no token
    if (const auto limit = model.max_positions()) options.max_new_tokens = std::min(options.max_new_tokens, *limit - static_cast<std::int64_t>(ids.size()));
    if (ids.empty() || options.max_new_tokens <= 0) return;
    const auto generated = models::generate(model, ids, options);
    fmt::print("sample (greedy): {}{}\n", text, tokenizer.decode(std::vector<text::TokenId>(generated.begin(), generated.end())));
  };
}

HPCTRAIN_RUNTIME_INLINE FinishHook print_eval_loss(std::string name) {
  return [name](const FinishContext& at_end) {
    if (at_end.run.rank == 0 && at_end.result.eval_loss) fmt::print("{}={:.4f}\n", name, *at_end.result.eval_loss);
  };
}
#endif  // HPCTRAIN_RUNTIME_DEFINITIONS

}  // namespace hpctrain::lm
