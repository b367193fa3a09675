#pragma once
// Reading and writing the fields of a Hugging Face `config.json` (torch-free). A field of the wrong type
// fails with the field's id, `[hpctrain.spec.<family>.<field>]`, and the value found.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/error.hpp>
#include <hpctrain/files.hpp>

namespace hpctrain::models::detail {

/// Reads `path` as a JSON object; RuntimeError `hpctrain.runtime.model_config` naming the file otherwise.
inline nlohmann::json read_json_file(const std::filesystem::path& path) {
  auto json = nlohmann::json::parse(hpctrain::detail::read_file(path, errors::runtime_model_config), nullptr,
                                    /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object())
    throw RuntimeError(errors::runtime_model_config, fmt::format("{}: not a JSON object", path.string()));
  return json;
}

inline std::string field_id(std::string_view family, std::string_view key) { return fmt::format("{}.{}", family, key); }

/// Sets `out` from `json[key]` when present (and not null); a value of another type is a SpecError.
template <class T>
void read_field(const nlohmann::json& json, std::string_view family, const char* key, T& out) {
  const auto it = json.find(key);
  if (it == json.end() || it->is_null()) return;
  bool ok = false;
  if constexpr (std::is_same_v<T, bool>) {
    ok = it->is_boolean();
  } else if constexpr (std::is_integral_v<T>) {
    ok = it->is_number_integer();
  } else if constexpr (std::is_floating_point_v<T>) {
    ok = it->is_number();
  } else {
    ok = it->is_string();
  }
  if (!ok) throw SpecError(field_id(family, key), it->dump(), "has the wrong type");
  out = it->get<T>();
}

/// Like read_field, for a field that may be null (then `out` stays nullopt).
template <class T>
void read_optional_field(const nlohmann::json& json, std::string_view family, const char* key, std::optional<T>& out) {
  const auto it = json.find(key);
  if (it == json.end() || it->is_null()) return;
  T value{};
  read_field(json, family, key, value);
  out = value;
}

/// Token ids (`bos_token_id`, `eos_token_id`) are an integer or a list of integers; hpctrain keeps the first.
inline void read_token_id(const nlohmann::json& json, std::string_view family, const char* key,
                          std::optional<std::int64_t>& out) {
  const auto it = json.find(key);
  if (it == json.end()) return;
  if (it->is_null()) {
    out.reset();
  } else if (it->is_number_integer()) {
    out = it->get<std::int64_t>();
  } else if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) {
    out = (*it)[0].get<std::int64_t>();
  } else {
    throw SpecError(field_id(family, key), it->dump(), "must be a token id or a list of them");
  }
}

/// The config's `model_type` must be `expected` when present.
inline void check_model_type(const nlohmann::json& json, std::string_view family, std::string_view expected) {
  const auto it = json.find("model_type");
  if (it != json.end() && !(it->is_string() && it->get<std::string>() == expected))
    throw SpecError(field_id(family, "model_type"), it->dump(), fmt::format("this is not a {} config", expected));
}

/// The weights' dtype as the config states it: transformers 5 writes `dtype`, 4.x `torch_dtype` (4.56+ reads
/// both). Where both are present they must agree. Returns "" when neither is given.
inline std::string read_dtype(const nlohmann::json& json, std::string_view family) {
  std::string dtype, legacy;
  read_field(json, family, "dtype", dtype);
  read_field(json, family, "torch_dtype", legacy);
  if (!dtype.empty() && !legacy.empty() && dtype != legacy)
    throw SpecError(field_id(family, "dtype"), fmt::format("\"{}\" but torch_dtype = \"{}\"", dtype, legacy),
                    "the transformers 5 and 4 spellings of the dtype disagree");
  const auto& stated = dtype.empty() ? legacy : dtype;
  static constexpr std::string_view known[] = {"float32", "float16", "bfloat16", "float64", "auto"};
  if (!stated.empty() && std::find(std::begin(known), std::end(known), stated) == std::end(known))
    throw SpecError(field_id(family, dtype.empty() ? "torch_dtype" : "dtype"), stated,
                    "must be float32, float16, bfloat16, float64 or auto");
  return stated;
}

/// Keys every transformers config may carry that do not change a model's math: PreTrainedConfig's own
/// (4.x and 5.x), the generation defaults 4.x wrote into config.json, and task heads' labels.
inline constexpr std::string_view generic_config_keys[] = {"architectures",
                                                           "model_type",
                                                           "transformers_version",
                                                           "dtype",
                                                           "torch_dtype",
                                                           "_name_or_path",
                                                           "_commit_hash",
                                                           "use_cache",
                                                           "pad_token_id",
                                                           "bos_token_id",
                                                           "eos_token_id",
                                                           "sep_token_id",
                                                           "decoder_start_token_id",
                                                           "output_attentions",
                                                           "output_hidden_states",
                                                           "return_dict",
                                                           "torchscript",
                                                           "use_bfloat16",
                                                           "tf_legacy_loss",
                                                           "is_encoder_decoder",
                                                           "is_decoder",
                                                           "add_cross_attention",
                                                           "cross_attention_hidden_size",
                                                           "tie_encoder_decoder",
                                                           "chunk_size_feed_forward",
                                                           "pruned_heads",
                                                           "problem_type",
                                                           "id2label",
                                                           "label2id",
                                                           "finetuning_task",
                                                           "tokenizer_class",
                                                           "prefix",
                                                           "task_specific_params",
                                                           "max_length",
                                                           "min_length",
                                                           "do_sample",
                                                           "early_stopping",
                                                           "num_beams",
                                                           "num_beam_groups",
                                                           "diversity_penalty",
                                                           "temperature",
                                                           "top_k",
                                                           "top_p",
                                                           "typical_p",
                                                           "repetition_penalty",
                                                           "length_penalty",
                                                           "no_repeat_ngram_size",
                                                           "encoder_no_repeat_ngram_size",
                                                           "bad_words_ids",
                                                           "num_return_sequences",
                                                           "output_scores",
                                                           "return_dict_in_generate",
                                                           "forced_bos_token_id",
                                                           "forced_eos_token_id",
                                                           "remove_invalid_values",
                                                           "exponential_decay_length_penalty",
                                                           "suppress_tokens",
                                                           "begin_suppress_tokens",
                                                           "output_router_logits",
                                                           "classifier_dropout",
                                                           "initializer_range",
                                                           "_attn_implementation_autoset",
                                                           "attn_implementation",
                                                           "_attn_implementation"};

/// The keys of `json` that are neither in `read` (the family's fields) nor generic: transformers keys this
/// reader does not know. They are reported (one warning line), not refused: a key that changes the math is
/// refused by name before this.
inline std::vector<std::string> unread_keys(const nlohmann::json& json, std::initializer_list<std::string_view> read) {
  std::vector<std::string> unread;
  for (const auto& item : json.items()) {
    const auto& key = item.key();
    const bool known =
        std::find(read.begin(), read.end(), key) != read.end() ||
        std::find(std::begin(generic_config_keys), std::end(generic_config_keys), key) != std::end(generic_config_keys);
    if (!known) unread.push_back(key);
  }
  return unread;
}

/// A field that changes the model's math and that hpctrain does not implement: a SpecError when present with
/// a value other than one that means "off" (`null` or `false`).
inline void refuse_unless_off(const nlohmann::json& json, std::string_view family, const char* key,
                              std::string_view what) {
  const auto it = json.find(key);
  if (it == json.end() || it->is_null() || (it->is_boolean() && !it->get<bool>())) return;
  throw SpecError(field_id(family, key), it->dump(), fmt::format("{} is not implemented by hpctrain", what));
}

/// Reads `file` as a config of type Config (`Config::from_json`); a SpecError names the file as well.
template <class Config>
Config read_config_file(const std::filesystem::path& file) {
  const auto json = read_json_file(file);
  try {
    return Config::from_json(json);
  } catch (const SpecError& error) {
    throw SpecError(error, file.string());
  }
}

template <class T>
void set_optional(nlohmann::ordered_json& json, const char* key, const std::optional<T>& value) {
  if (value) {
    json[key] = *value;
  } else {
    json[key] = nullptr;
  }
}

/// States the weights' dtype ("float32", "bfloat16") in both spellings transformers reads: 5's `dtype`, 4.x's
/// `torch_dtype`.
inline void state_dtype(nlohmann::ordered_json& json, const std::string& name) {
  json["dtype"] = name;
  json["torch_dtype"] = name;
}

}  // namespace hpctrain::models::detail
