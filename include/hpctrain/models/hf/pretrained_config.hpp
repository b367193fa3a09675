#pragma once
// A Hugging Face directory's `config.json` read by its `model_type`, without LibTorch: what the login node
// checks before anything is queued (a setting hpctrain does not implement exits 2 there, not in the worker)
// and the one line the worker prints of what it understood.
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <hpctrain/error.hpp>
#include <hpctrain/models/gpt2_config.hpp>
#include <hpctrain/models/hf/config_json.hpp>
#include <hpctrain/models/llama_config.hpp>
#include <hpctrain/models/roberta_config.hpp>

namespace hpctrain::models {

/// What reading a `config.json` understood.
struct ConfigReading {
  std::string summary;                     ///< the values that shape the math, one line (`LlamaConfig::summary`)
  std::vector<std::string> unread_keys;    ///< keys hpctrain does not know
  std::vector<std::string> linear_layers;  ///< the family's Linear layers by name, what LoRA targets name

  /// One warning line naming the unread keys of `file`, or "" when there are none.
  std::string warning(const std::filesystem::path& file) const {
    if (unread_keys.empty()) return {};
    return fmt::format("hpctrain: warning: {} has keys hpctrain does not read (ignored): {}", file.string(),
                       fmt::join(unread_keys, ", "));
  }
};

/// Reads `directory/config.json` as the family its `model_type` names (gpt2, llama_family_types, roberta,
/// bert). SpecError naming the file and the field for an invalid or unimplemented setting or another model_type.
inline ConfigReading read_config_reading(const std::filesystem::path& directory) {
  const auto file = directory / "config.json";
  const auto json = detail::read_json_file(file);
  const auto type = json.value("model_type", std::string());
  const auto reading = [&](const auto& config) {
    return ConfigReading{config.summary(), config.unread_keys, config.linear_layers()};
  };
  if (type == "gpt2") return reading(detail::read_config_file<GPT2Config>(file));
  if (is_llama_family(type)) return reading(detail::read_config_file<LlamaConfig>(file));
  if (type == "roberta" || type == "bert") return reading(detail::read_config_file<RobertaConfig>(file));
  throw SpecError("model_type", json.contains("model_type") ? json["model_type"].dump() : "(absent)",
                  fmt::format("{}: hpctrain reads \"gpt2\", {}, \"roberta\" and \"bert\"", file.string(),
                              quoted_llama_family_types()));
}

}  // namespace hpctrain::models
