#pragma once
// A Hugging Face tokenizer directory as `AutoTokenizer.from_pretrained(dir)` reads it: `tokenizer.json` (or a
// `*.tiktoken` file), its post-processor, and `tokenizer_config.json` — the special tokens (strings or
// AddedToken objects), `add_bos_token`/`add_eos_token`, the chat template (there, or in `chat_template.jinja`,
// where transformers 4.57 saves it). `encode(text, true)` gives the ids `AutoTokenizer(dir)(text)` gives.
// Torch-free.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/error.hpp>
#include <hpctrain/files.hpp>
#include <hpctrain/text/post_processor.hpp>
#include <hpctrain/text/tiktoken.hpp>
#include <hpctrain/text/tokenizer.hpp>

namespace hpctrain::text {

namespace detail {
inline nlohmann::json read_json_or_empty(const std::filesystem::path& file) {
  const auto text = hpctrain::detail::read_file_if_present(file, errors::runtime_text_tokenizer);
  if (!text) return nlohmann::json::object();
  try {
    return nlohmann::json::parse(*text);
  } catch (const nlohmann::json::exception& error) {
    bad_tokenizer(file, "", fmt::format("not JSON: {}", error.what()));
  }
}

/// A special token of tokenizer_config.json: a string, or an AddedToken object with "content".
inline std::string token_text(const nlohmann::json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return {};
}
}  // namespace detail

/// The tokenizer of a Hugging Face model directory.
class PretrainedTokenizer {
 public:
  PretrainedTokenizer(Tokenizer tokenizer, PostProcessor post, std::filesystem::path directory, nlohmann::json config,
                      std::optional<std::string> chat_template)
      : tokenizer_(std::move(tokenizer)),
        post_(std::move(post)),
        directory_(std::move(directory)),
        chat_template_(std::move(chat_template)) {
    bos_token_ = detail::token_text(config, "bos_token");
    eos_token_ = detail::token_text(config, "eos_token");
    pad_token_ = detail::token_text(config, "pad_token");
    add_bos_ = config.value("add_bos_token", false);
    add_eos_ = config.value("add_eos_token", false);
  }

  const Tokenizer& tokenizer() const { return tokenizer_; }
  /// The ids of `text` (added and special tokens in it are matched literally, as `tokenizers` does); with
  /// `add_special_tokens`, the post-processor's tokens — and BOS/EOS where tokenizer_config.json asks for them
  /// and the post-processor does not already add them (transformers' slow-tokenizer flags).
  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens) const {
    auto ids = tokenizer_.encode(text, /*allow_special=*/true);
    if (!add_special_tokens) return ids;
    if (!post_.empty()) return post_.apply(ids);
    if (add_bos_ && bos_id()) ids.insert(ids.begin(), *bos_id());
    if (add_eos_ && eos_id()) ids.push_back(*eos_id());
    return ids;
  }
  std::string decode(std::span<const TokenId> ids) const { return tokenizer_.decode(ids); }

  std::optional<TokenId> bos_id() const { return id_of(bos_token_); }
  std::optional<TokenId> eos_id() const { return id_of(eos_token_); }
  std::optional<TokenId> pad_id() const { return id_of(pad_token_); }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  /// The chat template (tokenizer_config.json's, or chat_template.jinja's), if the model has one.
  const std::optional<std::string>& chat_template_source() const { return chat_template_; }
  /// The files of the directory an export carries along.
  std::vector<std::filesystem::path> files() const {
    std::vector<std::filesystem::path> out;
    for (const char* name :
         {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"})
      if (std::filesystem::is_regular_file(directory_ / name)) out.push_back(directory_ / name);
    return out;
  }

 private:
  std::optional<TokenId> id_of(const std::string& token) const {
    if (token.empty()) return std::nullopt;
    return tokenizer_.token_id(token);
  }

  Tokenizer tokenizer_;
  PostProcessor post_;
  std::filesystem::path directory_;
  std::optional<std::string> chat_template_;
  std::string bos_token_, eos_token_, pad_token_;
  bool add_bos_ = false, add_eos_ = false;
};

/// The tokenizer of Hugging Face directory `directory`: tokenizer.json (else the first *.tiktoken file), its
/// post_processor, tokenizer_config.json and chat_template.jinja. RuntimeError naming the file otherwise.
inline PretrainedTokenizer load_pretrained_tokenizer(const std::filesystem::path& directory) {
  std::filesystem::path file = directory / "tokenizer.json";
  PostProcessor post;
  if (!std::filesystem::is_regular_file(file)) {
    std::vector<std::filesystem::path> candidates;
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(directory, error))
      if (entry.path().extension() == ".tiktoken") candidates.push_back(entry.path());
    std::sort(candidates.begin(), candidates.end());
    if (candidates.empty()) detail::bad_tokenizer(directory, "", "holds neither tokenizer.json nor a *.tiktoken file");
    file = candidates.front();
  } else {
    post = PostProcessor::from_json(detail::read_json_or_empty(file).value("post_processor", nlohmann::json()), file);
  }
  auto tokenizer = load_tokenizer(file);
  auto config = detail::read_json_or_empty(directory / "tokenizer_config.json");
  std::optional<std::string> chat_template;
  if (const auto it = config.find("chat_template"); it != config.end() && !it->is_null()) {
    if (it->is_string()) {
      chat_template = it->get<std::string>();
    } else if (it->is_array()) {  // named templates: the default one
      for (const auto& named : *it)
        if (named.value("name", std::string()) == "default") chat_template = named.value("template", std::string());
    }
  }
  if (!chat_template)
    chat_template =
        hpctrain::detail::read_file_if_present(directory / "chat_template.jinja", errors::runtime_text_tokenizer);
  return PretrainedTokenizer(std::move(tokenizer), std::move(post), directory, std::move(config),
                             std::move(chat_template));
}

}  // namespace hpctrain::text
