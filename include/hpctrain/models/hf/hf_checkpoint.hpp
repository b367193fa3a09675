#pragma once
// Hugging Face checkpoints, both ways: a directory of `config.json` + `model.safetensors` (or shards and
// `model.safetensors.index.json`) into a GPT2 or Llama module, and a module back into a directory
// transformers' `from_pretrained` loads. Every tensor of the checkpoint is checked against the config —
// present, expected, of the right shape and a floating dtype — before any weight is copied.
//
// Names: GPT-2 `transformer.h.N.attn.c_attn.weight` ↔ our `h.N.attn.c_attn.weight`, with the weights of
// GPT-2's Conv1D layers (c_attn, c_proj, c_fc) stored [in, out] and transposed to Linear's [out, in];
// Llama `model.layers.N.self_attn.q_proj.weight` ↔ our `layers.N.self_attn.q_proj.weight`; `lm_head.weight`
// on both sides when the head is untied.
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/ranges.h>
#include <torch/torch.h>

#include <hpctrain/files.hpp>
#include <hpctrain/models/blocks.hpp>
#include <hpctrain/models/gpt2.hpp>
#include <hpctrain/models/hf/safetensors.hpp>
#include <hpctrain/models/hf/safetensors_shards.hpp>
#include <hpctrain/models/llama.hpp>
#include <hpctrain/models/weights_from_checkpoint.hpp>

namespace hpctrain::models {

namespace detail {

inline std::string shape_text(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

/// The file to name for a tensor the checkpoint lacks: the single file, or the index of the shards.
inline std::string checkpoint_source(const std::filesystem::path& directory) {
  const auto single = directory / safetensors::single_file_name;
  return (std::filesystem::exists(single) ? single : directory / safetensors::index_file_name).string();
}

}  // namespace detail

namespace detail {

/// One weight the module needs: the parameter, its full shape (ours), its checkpoint name and layout.
struct WeightTarget {
  torch::Tensor parameter;
  std::vector<std::int64_t> shape;
  std::string hf;
  bool transposed = false;
};

/// Every weight `module` needs, each checked against `checkpoint` (present, of the config's shape, a floating
/// dtype) and every tensor of the checkpoint expected or ignorable: RuntimeError `hpctrain.runtime.safetensors`
/// naming the file, the tensor and the reason. `full_shape` gives a parameter's shape (a deferred one is empty).
inline std::vector<WeightTarget> checked_targets(
    torch::nn::Module& module, const safetensors::Checkpoint& checkpoint, const CheckpointNaming& naming,
    const std::filesystem::path& directory,
    const std::function<std::vector<std::int64_t>(const torch::Tensor&)>& full_shape) {
  std::vector<WeightTarget> targets;
  std::set<std::string> expected;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (is_lora_parameter(item.key())) continue;  // adapters go to their own file (save_peft_adapter)
    auto [hf, transposed] = naming.to_hf(item.key());
    targets.push_back({item.value(), full_shape(item.value()), hf, transposed});
    expected.insert(hf);
  }
  for (const auto& target : targets) {
    if (!checkpoint.contains(target.hf))
      throw safetensors::format_error(checkpoint_source(directory), target.hf, "missing: the config needs it");
    const auto& info = checkpoint.info(target.hf);
    auto shape = target.shape;
    if (target.transposed) std::swap(shape[0], shape[1]);
    const auto& file = checkpoint.file_of(target.hf).path().string();
    if (info.shape != shape)
      throw safetensors::format_error(
          file, target.hf, fmt::format("shape {} but the config needs {}", shape_text(info.shape), shape_text(shape)));
    const auto dtype = info.dtype;
    if (dtype != safetensors::Dtype::F32 && dtype != safetensors::Dtype::F16 && dtype != safetensors::Dtype::BF16 &&
        dtype != safetensors::Dtype::F64)
      throw safetensors::format_error(file, target.hf,
                                      fmt::format("dtype {} is not a floating type", safetensors::dtype_name(dtype)));
  }
  for (const auto& name : checkpoint.names()) {
    if (!expected.count(name) && !naming.ignorable(name))
      throw safetensors::format_error(checkpoint.file_of(name).path().string(), name,
                                      "unexpected: the config has no such weight");
  }
  return targets;
}

/// Elements [offset, offset + out.numel()) of a checkpoint tensor flattened in our layout, into `out`. Only
/// those bytes of the mapping are read (a transposed GPT-2 projection is read whole: its rows are columns).
inline void read_slice(const safetensors::Checkpoint& checkpoint, const std::string& hf, bool transposed,
                       std::int64_t offset, torch::Tensor out) {
  torch::NoGradGuard no_grad;
  const auto stored = checkpoint.tensor(hf);
  const auto flat = transposed ? stored.t().contiguous().view({-1}) : stored.reshape({-1});
  out.copy_(flat.narrow(0, offset, out.numel()));
}

/// Builds a model of Holder's family with each block emptied as soon as it is built (BlockConstruction), its
/// DeferredBlocks holding the shapes; the rest converted to `dtype`. Nothing is initialised (WeightsFromCheckpoint):
/// the caller's load writes every parameter, and refuses a checkpoint that lacks one.
template <class Holder, class Config>
Holder build_with_empty_blocks(const Config& config, torch::Dtype dtype) {
  auto deferred = std::make_shared<DeferredBlocks>();
  Holder model(nullptr);
  {
    BlockConstruction scope(
        [&](torch::nn::Module& block) { deferred->shapes.push_back(empty_block_parameters(block)); });
    WeightsFromCheckpoint uninitialised;
    model = Holder(config);
  }
  // The edges (an untied embedding and head) are emptied before the conversion touches them: built uninitialised,
  // their pages were never written.
  deferred->edges_deferred = true;
  for (const auto which : {Edge::embedding, Edge::head})
    if (auto module = model->edge(which)) deferred->shapes.push_back(empty_block_parameters(*module));
  model->to(dtype);
  model->set_deferred_blocks(std::move(deferred));
  return model;
}

}  // namespace detail

/// Copies the weights of `checkpoint` into `module` after checking every tensor (RuntimeError
/// `hpctrain.runtime.safetensors` naming the file, the tensor and the reason); converts dtypes to the
/// module's. Nothing is copied when any check fails.
inline void load_weights(torch::nn::Module& module, const safetensors::Checkpoint& checkpoint,
                         const CheckpointNaming& naming, const std::filesystem::path& directory) {
  auto targets = detail::checked_targets(module, checkpoint, naming, directory,
                                         [](const torch::Tensor& p) { return p.sizes().vec(); });
  torch::NoGradGuard no_grad;
  for (auto& target : targets) {
    auto tensor = checkpoint.tensor(target.hf, target.parameter.scalar_type());
    target.parameter.copy_(target.transposed ? tensor.t() : tensor);
  }
}

/// As load_weights, for a model whose blocks were built empty (detail::build_with_empty_blocks): every tensor
/// is checked now, the parameters outside the blocks are copied, and the blocks' DeferredBlocks read from the
/// checkpoint (kept mapped) when a strategy asks for its slices or materialize_blocks for all of them.
template <class Model>
void load_weights_deferred(Model& model, std::shared_ptr<const safetensors::Checkpoint> checkpoint,
                           const CheckpointNaming& naming, const std::filesystem::path& directory) {
  const auto deferred = model.deferred_blocks();
  const auto places = deferred_places(model);
  const auto full_shape = [&](const torch::Tensor& parameter) {
    const auto found = places.find(parameter.unsafeGetTensorImpl());
    return found == places.end() ? parameter.sizes().vec()
                                 : deferred->shapes[found->second.block][found->second.parameter].sizes().vec();
  };
  auto targets = detail::checked_targets(model, *checkpoint, naming, directory, full_shape);
  struct Source {
    std::string hf;
    bool transposed = false;
  };
  std::vector<std::vector<Source>> sources(deferred->shapes.size());
  for (std::size_t b = 0; b < sources.size(); ++b) sources[b].resize(deferred->shapes[b].size());
  torch::NoGradGuard no_grad;
  for (auto& target : targets) {
    const auto found = places.find(target.parameter.unsafeGetTensorImpl());
    if (found != places.end()) {
      sources[found->second.block][found->second.parameter] = {target.hf, target.transposed};
      continue;
    }
    auto tensor = checkpoint->tensor(target.hf, target.parameter.scalar_type());
    target.parameter.copy_(target.transposed ? tensor.t() : tensor);
  }
  deferred->read = [checkpoint, sources = std::move(sources)](std::size_t block, std::size_t parameter,
                                                              std::int64_t offset, torch::Tensor out) {
    const auto& source = sources.at(block).at(parameter);
    detail::read_slice(*checkpoint, source.hf, source.transposed, offset, std::move(out));
  };
}

/// Reads `directory/config.json` as a GPT-2 config.
inline GPT2Config read_gpt2_config(const std::filesystem::path& directory) {
  return detail::read_config_file<GPT2Config>(directory / "config.json");
}
inline LlamaConfig read_llama_config(const std::filesystem::path& directory) {
  return detail::read_config_file<LlamaConfig>(directory / "config.json");
}

/// A GPT-2 from a Hugging Face directory (weights converted to `dtype`), its blocks still empty: each is read
/// when a strategy asks for its slices (ZeRO-3) or materialize_blocks for the whole.
inline GPT2 load_gpt2_deferred(const std::filesystem::path& directory, torch::Dtype dtype = torch::kFloat32) {
  const auto config = read_gpt2_config(directory);
  const auto checkpoint = std::make_shared<const safetensors::Checkpoint>(directory);
  auto model = detail::build_with_empty_blocks<GPT2>(config, dtype);
  const bool prefixed = !checkpoint->contains("wte.weight");
  load_weights_deferred(*model, checkpoint, detail::gpt2_naming(config, prefixed ? "transformer." : ""), directory);
  return model;
}

/// A Llama (Qwen2, Mistral) from a Hugging Face directory, its blocks still empty, as load_gpt2_deferred.
inline Llama load_llama_deferred(const std::filesystem::path& directory, torch::Dtype dtype = torch::kFloat32) {
  const auto config = read_llama_config(directory);
  const auto checkpoint = std::make_shared<const safetensors::Checkpoint>(directory);
  auto model = detail::build_with_empty_blocks<Llama>(config, dtype);
  load_weights_deferred(*model, checkpoint, detail::llama_naming(config), directory);
  return model;
}

/// A GPT-2 from a Hugging Face directory (weights converted to `dtype`). Built a block at a time: the host
/// holds the model once, never a random initialisation beside the weights.
inline GPT2 load_gpt2(const std::filesystem::path& directory, torch::Dtype dtype = torch::kFloat32) {
  auto model = load_gpt2_deferred(directory, dtype);
  materialize_blocks(*model);
  return model;
}

/// A Llama from a Hugging Face directory (weights converted to `dtype`), as load_gpt2.
inline Llama load_llama(const std::filesystem::path& directory, torch::Dtype dtype = torch::kFloat32) {
  auto model = load_llama_deferred(directory, dtype);
  materialize_blocks(*model);
  return model;
}

namespace detail {
/// Whether `directory/config.json` describes a GPT-2 (else one of llama_family_types); SpecError naming its
/// `model_type` for any other.
inline bool is_gpt2_directory(const std::filesystem::path& directory) {
  const auto json = read_json_file(directory / "config.json");
  const auto type = json.value("model_type", std::string());
  if (type == "gpt2" || is_llama_family(type)) return type == "gpt2";
  throw SpecError("model_type", json.contains("model_type") ? json["model_type"].dump() : "(absent)",
                  fmt::format("{}: hpctrain reads \"gpt2\", {}", (directory / "config.json").string(),
                              quoted_llama_family_types()));
}
}  // namespace detail

/// The model a Hugging Face directory holds, by its config's `model_type` ("gpt2" or one of
/// llama_family_types), its blocks still empty (DeferredBlocks): the fully sharded strategy reads only its own slices
/// of them; materialize_blocks reads them whole.
inline std::shared_ptr<CausalLM> load_pretrained_deferred(const std::filesystem::path& directory,
                                                          torch::Dtype dtype = torch::kFloat32) {
  if (detail::is_gpt2_directory(directory)) return load_gpt2_deferred(directory, dtype).ptr();
  return load_llama_deferred(directory, dtype).ptr();
}

/// Whether `directory` holds weights (`model.safetensors`, or a sharded checkpoint's index), not a config alone.
inline bool holds_weights(const std::filesystem::path& directory) {
  return std::filesystem::exists(directory / safetensors::single_file_name) ||
         std::filesystem::exists(directory / safetensors::index_file_name);
}

/// The model `directory/config.json` describes, with random weights drawn from the generator as it stands (each
/// family's initialisation, transformers' `_init_weights`: N(0, initializer_range), norms the identity), converted to
/// `dtype`: transformers' `AutoModelForCausalLM.from_config`, for a run at a model's shape without its weights.
inline std::shared_ptr<CausalLM> build_from_config(const std::filesystem::path& directory,
                                                   torch::Dtype dtype = torch::kFloat32) {
  std::shared_ptr<CausalLM> model;
  if (detail::is_gpt2_directory(directory)) model = GPT2(read_gpt2_config(directory)).ptr();
  else model = Llama(read_llama_config(directory)).ptr();
  model->to(dtype);
  return model;
}

/// The model a Hugging Face directory holds, whole.
inline std::shared_ptr<CausalLM> load_pretrained(const std::filesystem::path& directory,
                                                 torch::Dtype dtype = torch::kFloat32) {
  auto model = load_pretrained_deferred(directory, dtype);
  materialize_blocks(*model);
  return model;
}

namespace detail {

inline void save_directory(torch::nn::Module& module, const nlohmann::ordered_json& config,
                           const CheckpointNaming& naming, const std::filesystem::path& directory,
                           std::uint64_t max_shard_bytes) {
  // A block built empty (DeferredInitialization, a deferred load) has no values to write yet: refused before
  // anything is written rather than exported as zero-sized tensors.
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    if (item.value().numel() == 0)
      throw RuntimeError(
          errors::runtime_io,
          fmt::format("{}: cannot write {}: it is empty (under --sharding zero3 a model's blocks are built empty and "
                      "filled slice by slice when the strategy shards them; lm::hf_export writes the model at the end)",
                      directory.string(), item.key()));
  std::filesystem::create_directories(directory);
  safetensors::NamedTensors tensors;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (is_lora_parameter(item.key())) continue;  // adapters go to their own file (save_peft_adapter)
    auto [hf, transposed] = naming.to_hf(item.key());
    auto tensor = item.value().detach();
    tensors.emplace_back(hf, transposed ? tensor.t().contiguous() : tensor);
  }
  safetensors::save_checkpoint(directory, tensors, max_shard_bytes);
  // config.json last: a directory with a config has its weights.
  hpctrain::detail::write_file_atomically(directory / "config.json", config.dump(2) + "\n",
                                          errors::runtime_safetensors);
}

}  // namespace detail

/// `model`'s Hugging Face layout; RuntimeError naming `directory` for a model that has none (a family of your own).
inline const HuggingFaceLayout& hf_layout(const torch::nn::Module& model, const std::filesystem::path& directory = {}) {
  if (const auto* layout = dynamic_cast<const HuggingFaceLayout*>(&model)) return *layout;
  throw RuntimeError(errors::runtime_io,
                     fmt::format("{}{}no Hugging Face layout for this model ({}): its family does not implement "
                                 "models::HuggingFaceLayout",
                                 directory.string(), directory.empty() ? "" : ": ", model.name()));
}

/// Writes `model` — any family with a Hugging Face layout: GPT-2, Llama, Qwen2, Mistral, RoBERTa, BERT — as a
/// Hugging Face directory (config.json + model.safetensors, sharded above `max_shard_bytes`) that transformers'
/// from_pretrained loads. Every file is atomic; RoBERTa's tied decoder is not written, as transformers saves it.
inline void save_pretrained(torch::nn::Module& model, const std::filesystem::path& directory,
                            std::uint64_t max_shard_bytes = std::numeric_limits<std::uint64_t>::max()) {
  const auto& layout = hf_layout(model, directory);
  detail::save_directory(model, layout.hf_config(), layout.hf_naming(), directory, max_shard_bytes);
}

/// How `model`'s family names a parameter in a Hugging Face checkpoint (our name → theirs).
inline std::function<std::string(const std::string&)> hf_names(const torch::nn::Module& model) {
  return [naming = hf_layout(model).hf_naming()](const std::string& ours) { return naming.to_hf(ours).first; };
}

/// Whether the family stores its projections transposed (GPT-2's Conv1D: PEFT's fan_in_fan_out).
inline bool stores_transposed_projections(const torch::nn::Module& model) {
  const auto naming = hf_layout(model).hf_naming();
  for (const auto& item : model.named_parameters(/*recurse=*/true))
    if (naming.to_hf(item.key()).second) return true;
  return false;
}

}  // namespace hpctrain::models
