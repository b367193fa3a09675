#pragma once
// A byte-level BPE tokenizer (GPT-2, GPT-NeoX, Llama 3, Qwen families): split the text with the family's
// regex, look each piece up (whole, then in a cache of earlier pieces), else merge its bytes
// (text/bpe.hpp). Loaded from a Hugging Face tokenizer.json (text/huggingface.hpp) or a tiktoken ranks
// file (text/tiktoken.hpp); both give the same immutable model, shared by every Encoder.
#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/text/bpe.hpp>
#include <hpctrain/text/regex.hpp>

namespace hpctrain::text {

/// A token matched in the raw text before splitting (`<|endoftext|>`, `<|begin_of_text|>`, ...).
struct AddedToken {
  std::string content;
  TokenId id = no_token;
  /// Special tokens are recognised only when the caller allows them; others (HF `"special": false`) always.
  bool special = true;
};

namespace detail {

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
template <class Value>
using StringMap = std::unordered_map<std::string, Value, StringHash, std::equal_to<>>;

/// Everything a tokenizer is, filled by a loader and then frozen: an Encoder only reads it.
struct BpeModel {
  /// Where it came from, for messages ("tokenizer.json", "gpt2.tiktoken").
  std::string source;
  /// id → the bytes it stands for (decode); empty for an id nothing uses.
  std::vector<std::string> bytes_of;
  /// bytes → id for the model's own tokens (whole-piece lookup).
  StringMap<TokenId> id_of;
  /// byte → its single-byte token, or no_token.
  std::array<TokenId, 256> byte_token{};
  PairTable merges;
  /// The pre-tokenizer's split; none: a segment is one piece.
  std::optional<Regex> split;
  /// Text the split pattern does not match becomes a piece too (HF's Split "Isolated"); tiktoken drops it.
  bool keep_unmatched = true;
  /// HF ByteLevel(add_prefix_space=true): a segment not starting with a space gets one.
  bool add_prefix_space = false;
  /// A piece that is itself a token is that token without merging (tiktoken always; HF `ignore_merges`).
  bool whole_piece_lookup = false;
  /// HF `unk_token` for a byte the vocabulary lacks (else the byte is dropped, as HF does).
  TokenId unknown = no_token;
  bool fuse_unknown = false;
  std::vector<AddedToken> added;
  /// Alternations of the added tokens, longest first: all of them, and only the non-special ones.
  std::optional<Regex> added_all, added_non_special;
  std::uint64_t fingerprint = 0;
  std::string description;
};

/// Escapes `literal` for a PCRE2 pattern (a backslash before every ASCII punctuation character).
inline std::string escape_for_regex(std::string_view literal) {
  std::string out;
  for (const char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out += '\\';
    out += c;
  }
  return out;
}

/// Builds the added-token alternations and the fingerprint once the loader has filled the rest.
inline void finish_model(BpeModel& model, std::span<const std::pair<std::string, std::uint64_t>> identity) {
  auto alternation = [&](bool include_special) -> std::optional<Regex> {
    std::vector<const AddedToken*> tokens;
    for (const auto& token : model.added)
      if ((include_special || !token.special) && !token.content.empty()) tokens.push_back(&token);
    if (tokens.empty()) return std::nullopt;
    std::stable_sort(tokens.begin(), tokens.end(),
                     [](const AddedToken* a, const AddedToken* b) { return a->content.size() > b->content.size(); });
    std::string pattern;
    for (const auto* token : tokens) pattern += (pattern.empty() ? "" : "|") + escape_for_regex(token->content);
    return Regex(pattern, RegexDialect::tiktoken, model.source + ": added tokens");
  };
  model.added_all = alternation(true);
  model.added_non_special = alternation(false);

  Fingerprint fingerprint;
  fingerprint.add("hpctrain byte-level BPE v1");
  for (const auto& [name, value] : identity) {
    fingerprint.add(name);
    fingerprint.add_u64(value);
  }
  fingerprint.add(model.split ? model.split->pattern() : std::string());
  fingerprint.add_u64((model.keep_unmatched ? 1 : 0) | (model.add_prefix_space ? 2 : 0) |
                      (model.whole_piece_lookup ? 4 : 0));
  fingerprint.add_u64(model.bytes_of.size());
  for (const auto& bytes : model.bytes_of) fingerprint.add(bytes);
  for (const auto& token : model.added) {
    fingerprint.add(token.content);
    fingerprint.add_u64(token.id);
  }
  model.fingerprint = fingerprint.value();
}

}  // namespace detail

/// One thread's encoding state over a shared model: regex match data and the cache of pieces seen.
/// Not thread-safe; make one per thread (Tokenizer::encoder()).
class Encoder {
 public:
  explicit Encoder(std::shared_ptr<const detail::BpeModel> model) : model_(std::move(model)) {
    if (model_->split) split_.emplace(*model_->split);
    if (model_->added_all) added_all_.emplace(*model_->added_all);
    if (model_->added_non_special) added_non_special_.emplace(*model_->added_non_special);
  }

  /// Appends the ids of `text` to `out`. Special tokens are recognised only with `allow_special`;
  /// non-special added tokens always (as Hugging Face does).
  void encode(std::string_view text, std::vector<TokenId>& out, bool allow_special = false) {
    auto& matcher = allow_special ? added_all_ : added_non_special_;
    if (!matcher) return encode_ordinary(text, out);
    // Added tokens are searched run by run of valid UTF-8 (PCRE2 matches valid UTF-8 only).
    std::size_t done = 0, run_start = 0, begin = 0, end = 0;
    while (run_start < text.size()) {
      const std::size_t valid = detail::valid_utf8_prefix(text.substr(run_start));
      if (valid == 0) {
        ++run_start;
        continue;
      }
      const std::string_view run = text.substr(run_start, valid);
      for (std::size_t position = 0; position < run.size() && matcher->find(run, position, begin, end);
           position = end) {
        encode_ordinary(text.substr(done, run_start + begin - done), out);
        out.push_back(id_of_added(run.substr(begin, end - begin)));
        done = run_start + end;
      }
      run_start += valid;
    }
    encode_ordinary(text.substr(done), out);
  }

  /// The ids of `text` (see above).
  std::vector<TokenId> encode(std::string_view text, bool allow_special = false) {
    std::vector<TokenId> out;
    encode(text, out, allow_special);
    return out;
  }

  /// Appends the ids of `text` with no added token recognised (tiktoken's `encode_ordinary`).
  void encode_ordinary(std::string_view text, std::vector<TokenId>& out) {
    if (text.empty()) return;
    if (model_->add_prefix_space && text.front() != ' ') {
      std::string prefixed = " ";
      prefixed += text;
      return encode_segment(prefixed, out);
    }
    encode_segment(text, out);
  }

  /// The bytes of `ids` concatenated (not necessarily valid UTF-8: an id may hold part of a character).
  std::string decode(std::span<const TokenId> ids) const {
    std::string out;
    for (const TokenId id : ids) {
      if (id >= model_->bytes_of.size() || (model_->bytes_of[id].empty() && !is_known(id)))
        throw RuntimeError(errors::runtime_text_decode,
                           fmt::format("{}: token id {} is not in the vocabulary (size {})", model_->source, id,
                                       model_->bytes_of.size()));
      out += model_->bytes_of[id];
    }
    return out;
  }

 private:
  bool is_known(TokenId id) const {
    for (const auto& token : model_->added)
      if (token.id == id) return true;
    return false;
  }
  TokenId id_of_added(std::string_view content) const {
    for (const auto& token : model_->added)
      if (token.content == content) return token.id;
    return no_token;  // unreachable: the alternation holds only added tokens
  }

  /// Splits a segment into valid UTF-8 runs (split by the regex) and runs of invalid bytes (one piece each:
  /// neither reference defines a split for them, see docs/text.md).
  void encode_segment(std::string_view text, std::vector<TokenId>& out) {
    while (!text.empty()) {
      const std::size_t valid = detail::valid_utf8_prefix(text);
      if (valid > 0) {
        split_valid(text.substr(0, valid), out);
        text.remove_prefix(valid);
        continue;
      }
      std::size_t invalid = 1;
      while (invalid < text.size() && detail::valid_utf8_prefix(text.substr(invalid, 4)) == 0) ++invalid;
      encode_piece(text.substr(0, invalid), out);
      text.remove_prefix(invalid);
    }
  }

  void split_valid(std::string_view text, std::vector<TokenId>& out) {
    if (!split_) return encode_piece(text, out);
    std::size_t position = 0, begin = 0, end = 0;
    while (position < text.size() && split_->find(text, position, begin, end)) {
      if (begin > position && model_->keep_unmatched) encode_piece(text.substr(position, begin - position), out);
      if (end == begin) {  // an empty match: step over one character so the loop advances
        std::size_t next = begin + 1;
        while (next < text.size() && (static_cast<unsigned char>(text[next]) & 0xC0) == 0x80) ++next;
        if (model_->keep_unmatched) encode_piece(text.substr(begin, next - begin), out);
        position = next;
        continue;
      }
      encode_piece(text.substr(begin, end - begin), out);
      position = end;
    }
    if (position < text.size() && model_->keep_unmatched) encode_piece(text.substr(position), out);
  }

  /// One piece: its single-byte token, the whole piece, the cache, or the merge.
  void encode_piece(std::string_view piece, std::vector<TokenId>& out) {
    const auto& model = *model_;
    if (piece.size() == 1 && model.byte_token[static_cast<unsigned char>(piece[0])] != no_token) {
      out.push_back(model.byte_token[static_cast<unsigned char>(piece[0])]);
      return;
    }
    if (model.whole_piece_lookup) {
      if (const auto it = model.id_of.find(piece); it != model.id_of.end()) {
        out.push_back(it->second);
        return;
      }
    }
    if (const auto it = cache_.find(piece); it != cache_.end()) {
      out.insert(out.end(), cached_.begin() + it->second.first, cached_.begin() + it->second.first + it->second.second);
      return;
    }
    parts_.clear();
    for (const char c : piece) {
      const TokenId token = model.byte_token[static_cast<unsigned char>(c)];
      if (token != no_token) {
        parts_.push_back({token, {}});
      } else if (model.unknown != no_token &&
                 !(model.fuse_unknown && !parts_.empty() && parts_.back().token == model.unknown)) {
        parts_.push_back({model.unknown, {}});
      }  // else HF drops a character its vocabulary lacks (no unk_token)
    }
    detail::byte_pair_merge(model.merges, parts_);
    if (cache_.size() >= cache_limit) {
      cache_.clear();
      cached_.clear();
    }
    cache_.emplace(std::string(piece), std::pair{cached_.size(), parts_.size()});
    for (const auto& part : parts_) {
      cached_.push_back(part.token);
      out.push_back(part.token);
    }
  }

  static constexpr std::size_t cache_limit = 1 << 18;
  std::shared_ptr<const detail::BpeModel> model_;
  std::optional<Matcher> split_, added_all_, added_non_special_;
  std::vector<detail::Part> parts_;
  detail::StringMap<std::pair<std::size_t, std::size_t>> cache_;  // piece → (offset, count) in cached_
  std::vector<TokenId> cached_;
};

/// A loaded tokenizer: an immutable model (cheap to copy, shared between threads) plus, for convenience,
/// an Encoder of its own for single-threaded use; threads make their own with encoder().
class Tokenizer {
 public:
  explicit Tokenizer(std::shared_ptr<const detail::BpeModel> model) : model_(std::move(model)) {}
  Tokenizer(const Tokenizer& other) : model_(other.model_) {}
  Tokenizer& operator=(const Tokenizer& other) {
    model_ = other.model_;
    encoder_.reset();
    return *this;
  }
  Tokenizer(Tokenizer&&) noexcept = default;
  Tokenizer& operator=(Tokenizer&&) noexcept = default;

  /// The ids of `text`; special tokens only when `allow_special`. Uses this object's own Encoder: one thread.
  std::vector<TokenId> encode(std::string_view text, bool allow_special = false) const {
    return own_encoder().encode(text, allow_special);
  }
  /// The bytes the ids stand for; decode(encode(x)) == x for any x.
  std::string decode(std::span<const TokenId> ids) const { return own_encoder().decode(ids); }
  /// A new Encoder for another thread.
  Encoder encoder() const { return Encoder(model_); }

  /// Number of ids (the largest id + 1).
  std::size_t vocab_size() const { return model_->bytes_of.size(); }
  /// The id of a special or added token, or of a model token with those bytes; nullopt if none.
  std::optional<TokenId> token_id(std::string_view content) const {
    for (const auto& token : model_->added)
      if (token.content == content) return token.id;
    if (const auto it = model_->id_of.find(content); it != model_->id_of.end()) return it->second;
    return std::nullopt;
  }
  const std::vector<AddedToken>& added_tokens() const { return model_->added; }
  /// 64-bit hash of the vocabulary, merges, pattern and added tokens: a token file records it.
  std::uint64_t fingerprint() const { return model_->fingerprint; }
  /// Where it was loaded from.
  const std::string& source() const { return model_->source; }
  /// One line saying what it is ("byte-level BPE, 50257 ids, ...").
  const std::string& description() const { return model_->description; }
  const detail::BpeModel& model() const { return *model_; }

 private:
  Encoder& own_encoder() const {
    if (!encoder_) encoder_ = std::make_unique<Encoder>(model_);
    return *encoder_;
  }
  std::shared_ptr<const detail::BpeModel> model_;
  mutable std::unique_ptr<Encoder> encoder_;
};

}  // namespace hpctrain::text
