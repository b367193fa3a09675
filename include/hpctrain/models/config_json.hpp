#pragma once
// Reading and writing the fields of a Hugging Face `config.json` (torch-free). A field of the wrong type
// fails with the field's id, `[hpctrain.spec.<family>.<field>]`, and the value found.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/error.hpp>

namespace hpctrain::models::detail {

/// Reads `path` as a JSON object; RuntimeError `hpctrain.runtime.model_config` naming the file otherwise.
inline nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw RuntimeError(errors::runtime_model_config, fmt::format("{}: cannot open", path.string()));
  std::stringstream text;
  text << in.rdbuf();
  auto json = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) throw RuntimeError(errors::runtime_model_config, fmt::format("{}: not a JSON object", path.string()));
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
inline void read_token_id(const nlohmann::json& json, std::string_view family, const char* key, std::optional<std::int64_t>& out) {
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

template <class T>
void set_optional(nlohmann::ordered_json& json, const char* key, const std::optional<T>& value) {
  if (value) {
    json[key] = *value;
  } else {
    json[key] = nullptr;
  }
}

}  // namespace hpctrain::models::detail
