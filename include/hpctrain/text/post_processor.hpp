#pragma once
// tokenizer.json's `post_processor`: what Hugging Face `tokenizers` adds around a sequence when asked for
// special tokens (`encode(text, add_special_tokens=True)`): Llama 3's `<|begin_of_text|> $A`
// (TemplateProcessing), RoBERTa's `<s> $A </s>` (RobertaProcessing), BERT's `[CLS] $A [SEP]`
// (BertProcessing); ByteLevel changes offsets only, and a Sequence applies its members in order. Single
// sequences only (pairs are a classification matter). Torch-free.
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/error.hpp>
#include <hpctrain/text/bpe.hpp>
#include <hpctrain/text/huggingface.hpp>

namespace hpctrain::text {

/// What a post-processor puts around the ids of one sequence.
class PostProcessor {
 public:
  PostProcessor() = default;

  /// From the `post_processor` object of `file` (null: nothing). RuntimeError `[hpctrain.runtime.text.tokenizer]`
  /// naming the file and the JSON path for a kind this reader does not know or a malformed one.
  static PostProcessor from_json(const nlohmann::json& json, const std::filesystem::path& file,
                                 const std::string& path = "post_processor") {
    PostProcessor processor;
    if (json.is_null()) return processor;
    if (!json.is_object() || !json.contains("type") || !json["type"].is_string()) fail(file, path, "has no \"type\"");
    const auto type = json["type"].get<std::string>();
    if (type == "ByteLevel") return processor;  // offsets only
    if (type == "Sequence") {
      const auto members = json.value("processors", nlohmann::json::array());
      if (!members.is_array()) fail(file, path + ".processors", "is not an array");
      for (std::size_t i = 0; i < members.size(); ++i) {
        auto member = from_json(members[i], file, fmt::format("{}.processors[{}]", path, i));
        processor.before_.insert(processor.before_.end(), member.before_.begin(), member.before_.end());
        processor.after_.insert(processor.after_.begin(), member.after_.begin(), member.after_.end());
      }
      return processor;
    }
    if (type == "RobertaProcessing" || type == "BertProcessing") {
      processor.before_.push_back(token_of(json, "cls", file, path));
      processor.after_.push_back(token_of(json, "sep", file, path));
      return processor;
    }
    if (type == "TemplateProcessing") {
      const auto single = json.value("single", nlohmann::json::array());
      if (!single.is_array()) fail(file, path + ".single", "is not an array");
      const auto specials = json.value("special_tokens", nlohmann::json::object());
      bool seen_sequence = false;
      for (std::size_t i = 0; i < single.size(); ++i) {
        const auto& piece = single[i];
        const auto where = fmt::format("{}.single[{}]", path, i);
        if (piece.is_object() && piece.contains("Sequence")) {
          seen_sequence = true;
        } else if (piece.is_object() && piece.contains("SpecialToken")) {
          const auto& special = piece["SpecialToken"];
          if (!special.is_object() || !special.contains("id") || !special["id"].is_string())
            fail(file, where + ".SpecialToken", "has no \"id\" string");
          const auto name = special["id"].get<std::string>();
          if (!specials.is_object() || !specials.contains(name) || !specials[name].is_object() ||
              !specials[name].contains("ids") || !specials[name]["ids"].is_array())
            fail(file, fmt::format("{}.special_tokens", path), fmt::format("has no ids for {}", name));
          const auto& ids = specials[name]["ids"];
          for (std::size_t k = 0; k < ids.size(); ++k)
            (seen_sequence ? processor.after_ : processor.before_)
                .push_back(token_id(ids[k], file, fmt::format("{}.special_tokens[{:?}].ids[{}]", path, name, k)));
        } else {
          fail(file, where, "is neither a Sequence nor a SpecialToken");
        }
      }
      return processor;
    }
    fail(file, path + ".type",
         fmt::format("\"{}\" is not a post-processor hpctrain reads (TemplateProcessing, RobertaProcessing, "
                     "BertProcessing, ByteLevel, Sequence)",
                     type));
    return processor;
  }

  /// `ids` with the special tokens before and after.
  std::vector<TokenId> apply(const std::vector<TokenId>& ids) const {
    std::vector<TokenId> out(before_);
    out.insert(out.end(), ids.begin(), ids.end());
    out.insert(out.end(), after_.begin(), after_.end());
    return out;
  }
  bool empty() const { return before_.empty() && after_.empty(); }
  const std::vector<TokenId>& before() const { return before_; }
  const std::vector<TokenId>& after() const { return after_; }

 private:
  [[noreturn]] static void fail(const std::filesystem::path& file, const std::string& path, const std::string& reason) {
    detail::bad_tokenizer(file, path, reason);
  }
  /// RobertaProcessing's and BertProcessing's `cls`/`sep`: ["<s>", 0].
  static TokenId token_of(const nlohmann::json& json, const char* key, const std::filesystem::path& file,
                          const std::string& path) {
    const auto it = json.find(key);
    if (it == json.end() || !it->is_array() || it->size() != 2)
      fail(file, fmt::format("{}.{}", path, key), "is not [token, id]");
    return token_id((*it)[1], file, fmt::format("{}.{}[1]", path, key));
  }
  /// An id as nlohmann read it: an unsigned integer below no_token. A number beyond 64 bits reads as a double,
  /// whose conversion to an integer would be undefined; a negative one would wrap.
  static TokenId token_id(const nlohmann::json& id, const std::filesystem::path& file, const std::string& path) {
    if (!id.is_number_unsigned() || id.get<std::uint64_t>() >= no_token)
      fail(file, path, fmt::format("{} is not a token id", id.dump()));
    return static_cast<TokenId>(id.get<std::uint64_t>());
  }

  std::vector<TokenId> before_, after_;
};

}  // namespace hpctrain::text
