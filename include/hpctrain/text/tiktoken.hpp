#pragma once
// Loads a tiktoken ranks file: one `base64(token bytes) rank` per line. The file carries neither the split
// pattern nor the special tokens; tiktoken keeps them in code (tiktoken_ext/openai_public.py), and so do we
// (text/patterns.hpp, TiktokenOptions::gpt2() and friends).
#include <algorithm>
#include <charconv>
#include <filesystem>
#include <map>
#include <string>
#include <utility>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/text/huggingface.hpp>
#include <hpctrain/text/patterns.hpp>
#include <hpctrain/text/tokenizer.hpp>

namespace hpctrain::text {

/// What a ranks file does not say: the pattern and the special tokens (ids above or among the ranks).
struct TiktokenOptions {
  std::string pattern;
  std::map<std::string, TokenId> special_tokens;

  /// gpt2 / r50k_base: `<|endoftext|>` = 50256.
  static TiktokenOptions gpt2() { return {std::string(patterns::r50k), {{"<|endoftext|>", 50256}}}; }
  /// cl100k_base.
  static TiktokenOptions cl100k() {
    return {std::string(patterns::cl100k),
            {{"<|endoftext|>", 100257},
             {"<|fim_prefix|>", 100258},
             {"<|fim_middle|>", 100259},
             {"<|fim_suffix|>", 100260},
             {"<|endofprompt|>", 100276}}};
  }
  /// o200k_base.
  static TiktokenOptions o200k() {
    return {std::string(patterns::o200k), {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}};
  }
};

namespace detail {

/// Standard base64 (with padding), as tiktoken's files use; nullopt when `text` is not.
inline std::optional<std::string> decode_base64(std::string_view text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (text.empty() || text.size() % 4 != 0) return std::nullopt;
  std::string out;
  for (std::size_t i = 0; i < text.size(); i += 4) {
    int v[4];
    int padding = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text[i + static_cast<std::size_t>(k)];
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        v[k] = 0;
        ++padding;
      } else if (padding > 0 || (v[k] = value(c)) < 0) {
        return std::nullopt;
      }
    }
    const std::uint32_t bits = (static_cast<std::uint32_t>(v[0]) << 18) | (static_cast<std::uint32_t>(v[1]) << 12) |
                               (static_cast<std::uint32_t>(v[2]) << 6) | static_cast<std::uint32_t>(v[3]);
    out += static_cast<char>(bits >> 16);
    if (padding < 2) out += static_cast<char>((bits >> 8) & 0xFF);
    if (padding < 1) out += static_cast<char>(bits & 0xFF);
  }
  return out;
}

[[noreturn]] inline void bad_ranks(const std::filesystem::path& file, std::size_t line, std::string_view reason) {
  throw RuntimeError(errors::runtime_text_tokenizer, fmt::format("{}:{}: {}", file.string(), line, reason));
}

/// Reads the ranks into the model's vocabulary; every line is checked before anything is used.
inline void read_ranks(const std::filesystem::path& file, std::string_view content, BpeModel& model) {
  std::size_t line_number = 0;
  // Ranks number a file's tokens from 0 (published ranks files are dense): a rank far beyond the file's line
  // count is a defect, and resizing the vocabulary to it took gigabytes (fuzz_tiktoken: rank 4294967294;
  // tests/fuzz/corpus/tiktoken/rank_beyond_the_file). Gaps of up to 2^20 unused ids stay allowed.
  const auto rank_limit =
      static_cast<std::size_t>(std::count(content.begin(), content.end(), '\n')) + 1 + (std::size_t{1} << 20);
  while (!content.empty()) {
    ++line_number;
    const auto end = content.find('\n');
    std::string_view line = content.substr(0, end);
    content.remove_prefix(end == std::string_view::npos ? content.size() : end + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const auto space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos)
      bad_ranks(file, line_number, fmt::format("{:?} is not `base64 rank`", std::string(line.substr(0, 80))));
    const auto bytes = decode_base64(line.substr(0, space));
    if (!bytes) bad_ranks(file, line_number, fmt::format("{:?} is not base64", std::string(line.substr(0, space))));
    const auto rank_text = line.substr(space + 1);
    TokenId rank = 0;
    const auto [rest, error] = std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    if (error != std::errc{} || rest != rank_text.data() + rank_text.size() || rank == no_token)
      bad_ranks(file, line_number, fmt::format("rank {:?} is not a token id", std::string(rank_text)));
    if (rank < model.bytes_of.size() && !model.bytes_of[rank].empty())
      bad_ranks(file, line_number, fmt::format("rank {} appears twice", rank));
    if (!model.id_of.emplace(*bytes, rank).second)
      bad_ranks(file, line_number, fmt::format("the token {:?} appears twice", *bytes));
    if (rank >= rank_limit)
      bad_ranks(file, line_number,
                fmt::format("rank {} leaves more than 2^20 ids unused (ranks count tokens from 0)", rank));
    if (rank >= model.bytes_of.size()) model.bytes_of.resize(rank + 1);
    model.bytes_of[rank] = *bytes;
  }
  if (model.id_of.empty()) bad_ranks(file, line_number, "no ranks in the file");
}

/// tiktoken merges by the rank of the merged bytes; as pairs: every split of a token into two tokens.
inline void derive_merges(BpeModel& model) {
  model.merges.reserve(model.id_of.size() * 4);
  for (const auto& [bytes, id] : model.id_of) {
    for (std::size_t k = 1; k < bytes.size(); ++k) {
      const auto left = model.id_of.find(std::string_view(bytes).substr(0, k));
      if (left == model.id_of.end()) continue;
      const auto right = model.id_of.find(std::string_view(bytes).substr(k));
      if (right == model.id_of.end()) continue;
      model.merges.insert(left->second, right->second, Merge{id, id});
    }
  }
}

}  // namespace detail

/// Loads a tiktoken ranks file with the pattern and special tokens `options` give. Throws
/// `[hpctrain.runtime.text.tokenizer]` naming the file and line of a bad line.
inline Tokenizer load_tiktoken(const std::filesystem::path& file,
                               const TiktokenOptions& options = TiktokenOptions::gpt2()) {
  const std::string content = hpctrain::detail::read_file(file, errors::runtime_text_tokenizer);
  auto model = std::make_shared<detail::BpeModel>();
  model->source = file.string();
  detail::read_ranks(file, content, *model);
  for (int b = 0; b < 256; ++b) {
    const auto it = model->id_of.find(std::string(1, static_cast<char>(b)));
    if (it == model->id_of.end())
      throw RuntimeError(errors::runtime_text_tokenizer,
                         fmt::format("{}: the single byte 0x{:02X} has no rank: every byte must", file.string(), b));
    model->byte_token[static_cast<std::size_t>(b)] = it->second;
  }
  detail::derive_merges(*model);
  model->split.emplace(options.pattern, RegexDialect::tiktoken, file.string() + ": pattern");
  model->keep_unmatched = false;  // tiktoken encodes only what the pattern matches
  model->whole_piece_lookup = true;
  for (const auto& [content_of, id] : options.special_tokens) {
    if (id < model->bytes_of.size() && !model->bytes_of[id].empty())
      throw RuntimeError(
          errors::runtime_text_tokenizer,
          fmt::format("{}: special token {:?} has id {}, which is a rank in the file", file.string(), content_of, id));
    if (id >= model->bytes_of.size()) model->bytes_of.resize(id + 1);
    model->bytes_of[id] = content_of;
    model->added.push_back({content_of, id, true});
  }
  detail::finish_model(*model, {});
  model->description = fmt::format("byte-level BPE from tiktoken ranks, {} ids", model->bytes_of.size());
  return Tokenizer(std::move(model));
}

/// Loads by extension: `.json` → Hugging Face; `.tiktoken` → tiktoken, the pattern and specials chosen by
/// the file name (`cl100k`, `o200k`, else GPT-2's r50k).
inline Tokenizer load_tokenizer(const std::filesystem::path& file) {
  if (file.extension() == ".tiktoken") {
    const auto name = file.filename().string();
    if (name.find("cl100k") != std::string::npos) return load_tiktoken(file, TiktokenOptions::cl100k());
    if (name.find("o200k") != std::string::npos) return load_tiktoken(file, TiktokenOptions::o200k());
    return load_tiktoken(file, TiktokenOptions::gpt2());
  }
  return load_huggingface_tokenizer(file);
}

}  // namespace hpctrain::text
