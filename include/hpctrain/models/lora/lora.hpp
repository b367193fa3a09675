#pragma once
// LoRA (Hu et al. 2021) as PEFT implements it: a targeted linear layer computes
//   W x + b + s · B(A(dropout(x))),   s = alpha / r  (rsLoRA: alpha / √r),
// with A [r, in] Kaiming-uniform (a = √5, torch's Linear default, as PEFT's "default" init), B [out, r] zero
// (so training starts from the base model), and every other parameter frozen. The adapter lives inside the
// layer as children `lora_A` and `lora_B` (parameter names `...q_proj.lora_A.weight`, the base weight staying
// `...q_proj.weight`, so Hugging Face naming keeps working); the families call their projections through
// `models::linear`, which adds the adapter when there is one. PEFT's files both ways: adapter_model.safetensors
// (`base_model.model.<HF module>.lora_A.weight`) and adapter_config.json; `merge_lora` folds B·A into W.
#include <cmath>
#include <fstream>
#include <map>
#include <functional>
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <hpctrain/error.hpp>
#include <hpctrain/files.hpp>
#include <hpctrain/models/hf/safetensors.hpp>
#include <hpctrain/models/lora/lora_config.hpp>
#include <hpctrain/models/lora/lora_layer.hpp>
#include <hpctrain/models/model_units.hpp>

namespace hpctrain::models {

/// Adds an adapter to every targeted torch::nn::Linear of `model` and freezes every other parameter; returns
/// the number of adapter parameters. SpecError `[hpctrain.spec.lora.targets]` when no layer matches.
inline std::int64_t apply_lora(torch::nn::Module& model, const LoraConfig& config) {
  config.validate();
  for (auto& parameter : model.parameters()) parameter.set_requires_grad(false);
  std::int64_t count = 0;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* linear = item.value()->as<torch::nn::Linear>();
    if (linear == nullptr || !is_lora_target(item.key(), config)) continue;
    if (detail::child(*linear, "lora_A")) continue;  // already adapted
    // From the layer's options, not its weight: a block built empty (deferred, models/blocks.hpp) has a 0-element
    // weight until the strategy reads its slices.
    const auto in = linear->options.in_features(), out = linear->options.out_features();
    const auto options = linear->weight.options();
    auto a =
        torch::nn::Linear(torch::nn::LinearOptions(in, config.r).bias(false));  // torch's default: Kaiming-uniform(√5)
    auto b = torch::nn::Linear(torch::nn::LinearOptions(config.r, out).bias(false));
    {
      torch::NoGradGuard no_grad;
      b->weight.zero_();
    }
    // What trains stays fp32 beside a base held in bf16 or fp16, as PEFT's autocast_adapter_dtype keeps it.
    const auto base = options.dtype().toScalarType();
    const auto adapter = base == torch::kBFloat16 || base == torch::kHalf ? torch::kFloat32 : base;
    a->to(options.device(), adapter);
    b->to(options.device(), adapter);
    linear->register_module("lora_A", a);
    linear->register_module("lora_B", b);
    linear->register_module(detail::lora_scale_child, LoraScale(config.dropout, config.scaling()));
    count += a->weight.numel() + b->weight.numel();
  }
  if (count == 0)
    throw SpecError("lora.targets", fmt::format("[{}]", fmt::join(config.targets, ", ")),
                    "no linear layer of the model has such a name");
  return count;
}

namespace detail {
/// B A in fp32, also where the caller runs under autocast (an export at the end of a bf16 run): autocast would compute
/// the product in bf16, and the merged weights would then differ from PEFT's merge of the same fp32 adapter by up
/// to 2^-8 of the update.
inline torch::Tensor fp32_product(const torch::Tensor& b, const torch::Tensor& a) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return torch::matmul(b.to(torch::kFloat32), a.to(torch::kFloat32));
}
}  // namespace detail

/// Folds every adapter into its layer (W += s · B A; a reduced-precision W becomes fp32) and removes it: the model is a
/// plain one again, which save_pretrained writes as a full Hugging Face model (PEFT's merge_and_unload).
inline void merge_lora(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* linear = item.value()->as<torch::nn::Linear>();
    if (linear == nullptr || !detail::child(*linear, "lora_A")) continue;
    auto a = std::dynamic_pointer_cast<torch::nn::LinearImpl>(detail::child(*linear, "lora_A"));
    auto b = std::dynamic_pointer_cast<torch::nn::LinearImpl>(detail::child(*linear, "lora_B"));
    auto scale = std::dynamic_pointer_cast<LoraScaleImpl>(detail::child(*linear, detail::lora_scale_child));
    const auto update = detail::fp32_product(b->weight, a->weight) * scale->scaling();
    // A base held in bf16 (sharded under zero3/hsdp) is merged in fp32, where its values are exact: the export then
    // rounds once, to the dtype it writes.
    if (linear->weight.scalar_type() == torch::kFloat32) linear->weight.add_(update);
    else linear->weight.set_data(linear->weight.to(torch::kFloat32) + update.to(torch::kFloat32));
    linear->unregister_module("lora_A");
    linear->unregister_module("lora_B");
    linear->unregister_module(detail::lora_scale_child);
  }
}

/// The scale s of every adapted layer of `model`, by the layer's name (`layers.0.self_attn.q_proj`).
inline std::map<std::string, double> lora_scalings(torch::nn::Module& model) {
  std::map<std::string, double> scalings;
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    if (auto scale = std::dynamic_pointer_cast<LoraScaleImpl>(detail::child(*item.value(), detail::lora_scale_child)))
      scalings[item.key()] = scale->scaling();
  return scalings;
}

/// `unit` as merge_lora leaves the model, one unit at a time: each adapted layer's weight merged (W + s · B A, in fp32,
/// where a bf16 W is exact: the writer rounds once), the adapters left out, every other parameter as it is. The
/// export of a sharded model merges what each gathered unit holds, never the whole model on a rank.
inline NamedUnit merged_unit(const NamedUnit& unit, const std::map<std::string, double>& scalings) {
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> by_name(unit.begin(), unit.end());
  NamedUnit merged;
  for (const auto& [name, tensor] : unit) {
    if (is_lora_parameter(name)) continue;
    const auto layer = name.ends_with(".weight") ? name.substr(0, name.size() - 7) : std::string();
    const auto scaling = scalings.find(layer);
    const auto a = by_name.find(layer + ".lora_A.weight"), b = by_name.find(layer + ".lora_B.weight");
    if (layer.empty() || scaling == scalings.end() || a == by_name.end() || b == by_name.end()) {
      merged.emplace_back(name, tensor);
      continue;
    }
    const auto update = detail::fp32_product(b->second, a->second);
    merged.emplace_back(name, tensor.to(torch::kFloat32) + update * scaling->second);
  }
  return merged;
}

/// PEFT's key of adapter parameter `ours` (`layers.0.self_attn.q_proj.lora_A.weight`), given how the family
/// names the base layer's weight in a Hugging Face checkpoint (`hf_weight_name`).
inline std::string peft_key(const std::string& ours,
                            const std::function<std::string(const std::string&)>& hf_weight_name) {
  const auto at = ours.find(".lora_");
  const auto layer = ours.substr(0, at);                    // layers.0.self_attn.q_proj
  const auto hf_layer = hf_weight_name(layer + ".weight");  // model.layers.0.self_attn.q_proj.weight
  return "base_model.model." + hf_layer.substr(0, hf_layer.size() - 7) + ours.substr(at);  // … .lora_A.weight
}

/// Writes `adapters` (a model's adapter parameters by our names, whole) as PEFT does (adapter_model.safetensors +
/// adapter_config.json, atomically). `hf_weight_name` maps our weight names to the checkpoint's; `fan_in_fan_out` is
/// true for GPT-2 (Conv1D).
inline void save_peft_adapter(const NamedUnit& adapters, const std::filesystem::path& directory,
                              const LoraConfig& config, const std::string& base_model_name_or_path,
                              const std::function<std::string(const std::string&)>& hf_weight_name,
                              bool fan_in_fan_out) {
  std::filesystem::create_directories(directory);
  safetensors::NamedTensors tensors;
  std::set<std::string> modules;
  for (const auto& [name, value] : adapters) {
    if (!is_lora_parameter(name)) continue;
    tensors.emplace_back(peft_key(name, hf_weight_name), value.detach().to(torch::kFloat32).contiguous());
    const auto layer = name.substr(0, name.find(".lora_"));
    modules.insert(layer.substr(layer.rfind('.') + 1));
  }
  safetensors::save_file(directory / "adapter_model.safetensors", tensors);
  nlohmann::ordered_json json{{"peft_type", "LORA"},
                              {"task_type", "CAUSAL_LM"},
                              {"base_model_name_or_path", base_model_name_or_path},
                              {"r", config.r},
                              {"lora_alpha", config.alpha},
                              {"lora_dropout", config.dropout},
                              {"target_modules", std::vector<std::string>(modules.begin(), modules.end())},
                              {"fan_in_fan_out", fan_in_fan_out},
                              {"use_rslora", config.use_rslora},
                              {"bias", "none"},
                              {"inference_mode", true},
                              {"init_lora_weights", true},
                              {"modules_to_save", nullptr}};
  hpctrain::detail::write_file_atomically(directory / "adapter_config.json", json.dump(2) + "\n");
}

/// Writes the adapters of `model` (whole on this rank) as PEFT does: save_peft_adapter of its adapter parameters.
inline void save_peft_adapter(torch::nn::Module& model, const std::filesystem::path& directory,
                              const LoraConfig& config, const std::string& base_model_name_or_path,
                              const std::function<std::string(const std::string&)>& hf_weight_name,
                              bool fan_in_fan_out) {
  save_peft_adapter(whole_unit(model), directory, config, base_model_name_or_path, hf_weight_name, fan_in_fan_out);
}

/// The LoraConfig of a PEFT adapter directory's adapter_config.json.
inline LoraConfig read_peft_config(const std::filesystem::path& directory) {
  const auto file = directory / "adapter_config.json";
  std::ifstream in(file);
  if (!in) throw RuntimeError(errors::runtime_io, fmt::format("{}: cannot read", file.string()));
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    throw RuntimeError(errors::runtime_io, fmt::format("{}: not JSON: {}", file.string(), error.what()));
  }
  if (json.value("peft_type", std::string()) != "LORA")
    throw SpecError("lora.peft_type", json.value("peft_type", std::string("(absent)")),
                    fmt::format("{}: only LORA adapters are read", file.string()));
  LoraConfig config;
  config.r = json.value("r", config.r);
  config.alpha = json.value("lora_alpha", config.alpha);
  config.dropout = json.value("lora_dropout", config.dropout);
  config.use_rslora = json.value("use_rslora", false);
  const auto& targets = json.at("target_modules");
  config.targets = targets.is_string() ? std::vector<std::string>{targets.get<std::string>()}
                                       : targets.get<std::vector<std::string>>();
  return config;
}

/// Adds the adapters of a PEFT directory to `model` (apply_lora with its config, then its weights); returns the
/// config. RuntimeError naming the file and the tensor for a missing or misshapen one.
inline LoraConfig load_peft_adapter(torch::nn::Module& model, const std::filesystem::path& directory,
                                    const std::function<std::string(const std::string&)>& hf_weight_name) {
  const auto config = read_peft_config(directory);
  apply_lora(model, config);
  const safetensors::File file(directory / "adapter_model.safetensors");
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters(/*recurse=*/true)) {
    if (!is_lora_parameter(item.key())) continue;
    const auto key = peft_key(item.key(), hf_weight_name);
    const auto stored = file.tensor(key);
    if (stored.sizes() != item.value().sizes())
      throw RuntimeError(
          errors::runtime_io,
          fmt::format("{}: {} has shape {}, the model's adapter {}", (directory / "adapter_model.safetensors").string(),
                      key, fmt::join(stored.sizes(), "x"), fmt::join(item.value().sizes(), "x")));
    item.value().copy_(stored);
  }
  return config;
}

}  // namespace hpctrain::models
