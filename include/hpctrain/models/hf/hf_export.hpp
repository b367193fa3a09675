#pragma once
// A model (a causal or masked LM) written as a Hugging Face directory from its parameters as they arrive, one unit (a
// block, an edge, a group of small parameters) at a time: the shards are planned first from the parameters' names and
// whole shapes (no value needed), then each tensor is converted to the export's dtype and appended to its shard as its
// unit arrives. A sharded model is never whole on any rank: a strategy gathers one unit, the writer appends it, the
// unit is freed (train/strategies/strategy.hpp's visit_units). Names and transposes as save_pretrained writes them.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include <hpctrain/files.hpp>
#include <hpctrain/models/hf/export_format.hpp>
#include <hpctrain/models/hf/hf_checkpoint.hpp>
#include <hpctrain/models/hf/safetensors_shards.hpp>
#include <hpctrain/models/model_units.hpp>

namespace hpctrain::models {

/// The dtype the checkpoint `model` was loaded from states (config.json's dtype / torch_dtype), when it states a
/// floating one: what an export keeps by default. Nothing for a model without a Hugging Face layout.
inline std::optional<torch::Dtype> stated_dtype(const torch::nn::Module& model) {
  const auto* layout = dynamic_cast<const HuggingFaceLayout*>(&model);
  return layout != nullptr ? export_dtype_from_name(layout->hf_stated_dtype()) : std::nullopt;
}

/// Writes `model` into `directory` as a Hugging Face directory (config.json last, and the weights in `format`): the
/// shards are planned from `order` (every parameter's name and whole shape, in the order the units give them), then
/// `visit_units` is called once with a visitor that appends each parameter of each unit to its shard. The adapters
/// of a LoRA model are not written (save_peft_adapter writes them). With a share (the ranks of a sharded run, each
/// seeing every unit), this writer writes only its shards (safetensors::ShardShare), and writer 0 the index and
/// config.json. Returns the files written: the whole export's on writer 0, the shards it wrote on another.
inline std::vector<std::string> save_pretrained_by_units(torch::nn::Module& model,
                                                         const std::vector<ParameterShape>& order,
                                                         const std::function<void(const UnitVisitor&)>& visit_units,
                                                         const std::filesystem::path& directory,
                                                         const ExportFormat& format,
                                                         safetensors::ShardShare share = {}) {
  const auto& layout = hf_layout(model, directory);
  const auto naming = layout.hf_naming();
  auto config = layout.hf_config();
  std::vector<safetensors::TensorSpec> specs;
  for (const auto& parameter : order) {
    if (is_lora_parameter(parameter.name)) continue;
    auto [hf, transposed] = naming.to_hf(parameter.name);
    auto shape = parameter.shape;
    if (transposed) std::swap(shape[0], shape[1]);
    specs.push_back({hf, safetensors::from_torch(format.dtype, hf), shape});
  }
  const auto plan = safetensors::plan_shards(specs, format.max_shard_bytes);
  safetensors::ShardWriter writer(directory, plan, share);
  visit_units([&](const NamedUnit& unit) {
    torch::NoGradGuard no_grad;
    for (const auto& [name, tensor] : unit) {
      if (is_lora_parameter(name)) continue;
      const auto [hf, transposed] = naming.to_hf(name);
      writer.append(hf, transposed ? tensor.t() : tensor);
    }
  });
  writer.finish();
  if (share.writer != 0) return writer.written_files();
  detail::state_dtype(config, config_dtype_name(format.dtype));
  hpctrain::detail::write_file_atomically(directory / "config.json", config.dump(2) + "\n",
                                          errors::runtime_safetensors);
  std::vector<std::string> files{"config.json"};  // writer 0 names the whole export: the index names every shard
  for (const auto& shard : plan.shards) files.push_back(shard.file);
  if (plan.shards.size() > 1) files.emplace_back(safetensors::index_file_name);
  return files;
}

}  // namespace hpctrain::models
