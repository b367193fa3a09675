#pragma once
// Loads a Hugging Face `tokenizer.json` holding a byte-level BPE: model.type "BPE" with vocab and merges
// (the "a b" string form and the newer ["a", "b"] pair form), a ByteLevel pre-tokenizer (alone, or after a
// Split with the family's regex as Llama 3 and Qwen write it), added/special tokens. Anything else is
// refused with the file, the JSON path and the reason: a tokenizer that loads encodes as HF does.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/error.hpp>
#include <hpctrain/files.hpp>
#include <hpctrain/text/patterns.hpp>
#include <hpctrain/text/tokenizer.hpp>

namespace hpctrain::text {

namespace detail {

/// `[hpctrain.runtime.text.tokenizer] <file>: <where>: <reason>`
[[noreturn]] inline void bad_tokenizer(const std::filesystem::path& file, std::string_view where,
                                       std::string_view reason) {
  throw RuntimeError(errors::runtime_text_tokenizer, where.empty()
                                                         ? fmt::format("{}: {}", file.string(), reason)
                                                         : fmt::format("{}: {}: {}", file.string(), where, reason));
}

/// A byte-level vocabulary entry ("Ġthe") → the bytes it stands for (" the"). Like HF's ByteLevel decoder,
/// a token holding a character outside the byte alphabet stands for its own UTF-8 text.
inline std::string byte_level_to_bytes(std::string_view token) {
  static const auto byte_of = [] {
    std::array<int, 512> table;
    table.fill(-1);
    const auto& characters = byte_level_characters();
    for (int b = 0; b < 256; ++b) table[characters[static_cast<std::size_t>(b)]] = b;
    return table;
  }();
  if (valid_utf8_prefix(token) != token.size()) return std::string(token);
  std::string bytes;
  for (const char32_t c : utf8_code_points(token)) {
    if (c >= byte_of.size() || byte_of[c] < 0) return std::string(token);
    bytes += static_cast<char>(byte_of[c]);
  }
  return bytes;
}

/// What the pre_tokenizer section says, reduced to what the Encoder needs.
struct PreTokenizerPlan {
  std::optional<std::string> pattern;
  bool literal = false;
  bool byte_level = false;
  bool add_prefix_space = false;
};

inline void read_pre_tokenizer(const std::filesystem::path& file, const nlohmann::json& node, const std::string& where,
                               PreTokenizerPlan& plan) {
  if (node.is_null()) return;
  if (!node.is_object() || !node.contains("type") || !node["type"].is_string())
    bad_tokenizer(file, where, "expected an object with a \"type\"");
  const auto type = node["type"].get<std::string>();
  auto set_pattern = [&](std::string pattern, bool literal) {
    if (plan.pattern) bad_tokenizer(file, where, "a second split pattern (only one regex split is supported)");
    plan.pattern = std::move(pattern);
    plan.literal = literal;
  };
  if (type == "Sequence") {
    const auto& items = node.value("pretokenizers", nlohmann::json::array());
    for (std::size_t i = 0; i < items.size(); ++i)
      read_pre_tokenizer(file, items[i], fmt::format("{}.pretokenizers[{}]", where, i), plan);
  } else if (type == "ByteLevel") {
    plan.byte_level = true;
    plan.add_prefix_space = node.value("add_prefix_space", false);
    if (node.value("use_regex", true)) set_pattern(std::string(patterns::gpt2), false);
  } else if (type == "Split") {
    const auto& pattern = node.value("pattern", nlohmann::json::object());
    const auto behavior = node.value("behavior", std::string("Isolated"));
    if (behavior != "Isolated")
      bad_tokenizer(file, where, fmt::format("Split behavior {:?} is not supported (only \"Isolated\")", behavior));
    if (node.value("invert", false)) bad_tokenizer(file, where, "Split with invert = true is not supported");
    if (pattern.contains("Regex") && pattern["Regex"].is_string())
      set_pattern(pattern["Regex"].get<std::string>(), false);
    else if (pattern.contains("String") && pattern["String"].is_string())
      set_pattern(pattern["String"].get<std::string>(), true);
    else bad_tokenizer(file, where + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
  } else {
    bad_tokenizer(file, where,
                  fmt::format("pre-tokenizer type {:?} is not supported (ByteLevel, Split, Sequence)", type));
  }
}

/// A merge as "a b" or ["a", "b"].
inline std::pair<std::string, std::string> read_merge(const std::filesystem::path& file, const nlohmann::json& merge,
                                                      std::size_t index) {
  const auto where = fmt::format("model.merges[{}]", index);
  if (merge.is_string()) {
    const auto text = merge.get<std::string>();
    const auto space = text.find(' ', 1);
    if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos)
      bad_tokenizer(file, where, fmt::format("{:?} is not two tokens separated by one space", text));
    return {text.substr(0, space), text.substr(space + 1)};
  }
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string())
    return {merge[0].get<std::string>(), merge[1].get<std::string>()};
  bad_tokenizer(file, where, fmt::format("expected \"a b\" or [\"a\", \"b\"], got {}", merge.dump()));
}

inline void read_model(const std::filesystem::path& file, const nlohmann::json& model_node, BpeModel& model,
                       std::vector<std::pair<std::string, std::uint64_t>>& identity) {
  if (!model_node.is_object()) bad_tokenizer(file, "model", "missing or not an object");
  const auto type = model_node.value("type", std::string(model_node.contains("merges") ? "BPE" : "?"));
  if (type != "BPE")
    bad_tokenizer(file, "model.type", fmt::format("model type {:?} is not supported (byte-level BPE only)", type));
  for (const char* field : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto it = model_node.find(field);
    if (it != model_node.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      bad_tokenizer(file, fmt::format("model.{}", field),
                    fmt::format("{} is not supported for a byte-level BPE", it->dump()));
  }
  if (model_node.value("byte_fallback", false))
    bad_tokenizer(file, "model.byte_fallback", "byte_fallback (SentencePiece-style BPE) is not supported");
  model.whole_piece_lookup = model_node.value("ignore_merges", false);
  model.fuse_unknown = model_node.value("fuse_unk", false);

  const auto& vocab = model_node.value("vocab", nlohmann::json());
  if (!vocab.is_object()) bad_tokenizer(file, "model.vocab", "missing or not an object");
  StringMap<TokenId> id_of_name;
  // Ids number the tokens from 0: an id far beyond the vocabulary's size is a defect, and resizing to it
  // would take gigabytes (as fuzz_tiktoken found for ranks). Gaps of up to 2^20 unused ids stay allowed.
  const std::uint64_t id_limit = vocab.size() + (std::uint64_t{1} << 20);
  for (const auto& [name, id] : vocab.items()) {
    if (!id.is_number_unsigned() || id.get<std::uint64_t>() >= no_token)
      bad_tokenizer(file, fmt::format("model.vocab[{:?}]", name), fmt::format("id {} is not a token id", id.dump()));
    if (id.get<std::uint64_t>() >= id_limit)
      bad_tokenizer(file, fmt::format("model.vocab[{:?}]", name),
                    fmt::format("id {} leaves more than 2^20 ids unused (ids count tokens from 0)", id.dump()));
    const auto token = id.get<TokenId>();
    id_of_name.emplace(name, token);
    if (token >= model.bytes_of.size()) model.bytes_of.resize(token + 1);
    model.bytes_of[token] = byte_level_to_bytes(name);
    model.id_of.emplace(model.bytes_of[token], token);
  }
  if (const auto it = model_node.find("unk_token"); it != model_node.end() && it->is_string()) {
    const auto found = id_of_name.find(it->get<std::string>());
    if (found == id_of_name.end())
      bad_tokenizer(file, "model.unk_token", fmt::format("{} is not in model.vocab", it->dump()));
    model.unknown = found->second;
  }
  const auto& characters = byte_level_characters();
  for (int b = 0; b < 256; ++b) {
    std::string name;
    append_utf8(name, characters[static_cast<std::size_t>(b)]);
    const auto it = id_of_name.find(name);
    model.byte_token[static_cast<std::size_t>(b)] = it == id_of_name.end() ? no_token : it->second;
  }

  const auto& merges = model_node.value("merges", nlohmann::json());
  if (!merges.is_array()) bad_tokenizer(file, "model.merges", "missing or not an array");
  model.merges.reserve(merges.size());
  std::vector<Merge> resolved(merges.size());
  std::vector<std::pair<TokenId, TokenId>> pairs(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const auto [left, right] = read_merge(file, merges[i], i);
    auto id = [&](const std::string& name, std::string_view role) {
      const auto it = id_of_name.find(name);
      if (it == id_of_name.end())
        bad_tokenizer(file, fmt::format("model.merges[{}]", i),
                      fmt::format("the {} token {:?} is not in model.vocab", role, name));
      return it->second;
    };
    pairs[i] = {id(left, "left"), id(right, "right")};
    resolved[i] = Merge{static_cast<std::uint32_t>(i), id(left + right, "merged")};
    identity.emplace_back("merge", (std::uint64_t{pairs[i].first} << 32) | pairs[i].second);
  }
  // HF keeps the last of duplicate merges (it collects them into a map): insert from the end, first wins.
  for (std::size_t i = merges.size(); i-- > 0;) model.merges.insert(pairs[i].first, pairs[i].second, resolved[i]);
}

inline void read_added_tokens(const std::filesystem::path& file, const nlohmann::json& root, BpeModel& model) {
  const auto& added = root.value("added_tokens", nlohmann::json::array());
  if (!added.is_array()) bad_tokenizer(file, "added_tokens", "not an array");
  for (std::size_t i = 0; i < added.size(); ++i) {
    const auto& token = added[i];
    const auto where = fmt::format("added_tokens[{}]", i);
    if (!token.is_object() || !token.contains("id") || !token["id"].is_number_unsigned() ||
        !token.contains("content") || !token["content"].is_string())
      bad_tokenizer(file, where, "expected an object with \"id\" and \"content\"");
    for (const char* flag : {"lstrip", "rstrip", "single_word"})
      if (token.value(flag, false))
        bad_tokenizer(file, where, fmt::format("{} = true is not supported for added tokens", flag));
    if (token["id"].get<std::uint64_t>() >= model.bytes_of.size() + added.size() + (std::uint64_t{1} << 20))
      bad_tokenizer(
          file, where,
          fmt::format("id {} leaves more than 2^20 ids unused (ids count tokens from 0)", token["id"].dump()));
    AddedToken entry{token["content"].get<std::string>(), token["id"].get<TokenId>(), token.value("special", false)};
    if (entry.id >= model.bytes_of.size()) model.bytes_of.resize(entry.id + 1);
    model.bytes_of[entry.id] = entry.content;
    model.added.push_back(std::move(entry));
  }
}

}  // namespace detail

/// Loads a Hugging Face tokenizer.json (byte-level BPE). Throws `[hpctrain.runtime.text.tokenizer]` naming
/// the file, the JSON path and the reason for a malformed file or one hpctrain would not encode as HF does.
inline Tokenizer load_huggingface_tokenizer(const std::filesystem::path& file) {
  const std::string content = hpctrain::detail::read_file(file, errors::runtime_text_tokenizer);
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(content);
  } catch (const nlohmann::json::parse_error& error) {
    detail::bad_tokenizer(file, fmt::format("byte {}", error.byte), fmt::format("not valid JSON ({})", error.what()));
  } catch (const nlohmann::json::exception& error) {
    // out_of_range.406 while parsing: a number beyond a double (`1e999`); it escaped as a JSON library
    // exception before (fuzz_tokenizer_json; tests/fuzz/corpus/tokenizer_json/number_overflow).
    detail::bad_tokenizer(file, "", fmt::format("not valid JSON ({})", error.what()));
  }
  if (!root.is_object()) detail::bad_tokenizer(file, "", "not a tokenizer.json (the top level is not an object)");
  auto model = std::make_shared<detail::BpeModel>();
  model->source = file.string();
  std::vector<std::pair<std::string, std::uint64_t>> identity;
  try {
    if (const auto it = root.find("normalizer"); it != root.end() && !it->is_null())
      detail::bad_tokenizer(file, "normalizer",
                            fmt::format("normalizer {} is not supported (byte-level BPE takes the text as it is)",
                                        it->value("type", std::string("?"))));
    detail::read_model(file, root.contains("model") ? root["model"] : nlohmann::json(), *model, identity);
    detail::PreTokenizerPlan plan;
    detail::read_pre_tokenizer(file, root.value("pre_tokenizer", nlohmann::json()), "pre_tokenizer", plan);
    if (!plan.byte_level)
      detail::bad_tokenizer(file, "pre_tokenizer", "no ByteLevel pre-tokenizer: not a byte-level BPE");
    if (plan.pattern)
      model->split.emplace(*plan.pattern, RegexDialect::oniguruma, file.string() + ": pre_tokenizer", plan.literal);
    model->add_prefix_space = plan.add_prefix_space;
    detail::read_added_tokens(file, root, *model);
  } catch (const nlohmann::json::exception& error) {  // a field of the wrong JSON type
    detail::bad_tokenizer(file, "", fmt::format("unexpected structure ({})", error.what()));
  }
  detail::finish_model(*model, identity);
  model->description = fmt::format("byte-level BPE from tokenizer.json, {} ids, {} merges", model->bytes_of.size(),
                                   model->merges.size());
  return Tokenizer(std::move(model));
}

}  // namespace hpctrain::text
