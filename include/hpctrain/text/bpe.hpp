#pragma once
// The byte-pair merge, shaped like tiktoken's `byte_pair_merge` (src/lib.rs): a piece starts as one part
// per byte; the adjacent pair with the lowest merge rank (leftmost on ties) merges until none is left.
// Parts hold token ids and pairs are looked up by id, which serves both references: Hugging Face ranks a
// merge by its (left, right) pair, tiktoken by the merged bytes (the same thing, since every part is a token).
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hpctrain::text {

/// A token id.
using TokenId = std::uint32_t;
/// "No such token / no such merge".
inline constexpr TokenId no_token = std::numeric_limits<TokenId>::max();

namespace detail {

/// What merging a pair of adjacent tokens gives: the merge's rank (lower merges first) and the new token.
struct Merge {
  std::uint32_t rank = no_token;
  TokenId token = no_token;
};

/// (left token, right token) → Merge, open addressing: the merge loop's only lookup, so it is flat.
class PairTable {
 public:
  void reserve(std::size_t pairs) {
    std::size_t capacity = 16;
    while (capacity < pairs * 2) capacity *= 2;
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    size_ = 0;
  }
  /// Adds a merge; a pair already present keeps its first (lowest) rank.
  void insert(TokenId left, TokenId right, Merge merge) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    const std::uint64_t key = pack(left, right);
    for (std::size_t i = slot_of(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == empty_key) {
        slots_[i] = Slot{key, merge};
        ++size_;
        return;
      }
      if (slots_[i].key == key) return;
    }
  }
  Merge find(TokenId left, TokenId right) const {
    const std::uint64_t key = pack(left, right);
    for (std::size_t i = slot_of(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return slots_[i].merge;
      if (slots_[i].key == empty_key) return {};
    }
  }
  std::size_t size() const { return size_; }

 private:
  static constexpr std::uint64_t empty_key = std::numeric_limits<std::uint64_t>::max();
  struct Slot {
    std::uint64_t key = empty_key;
    Merge merge;
  };
  static std::uint64_t pack(TokenId left, TokenId right) { return (std::uint64_t{left} << 32) | right; }
  std::size_t slot_of(std::uint64_t key) const { return ((key * 0x9E3779B97F4A7C15ULL) >> 20) & mask_; }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    reserve(old.empty() ? 8 : old.size());
    for (const Slot& slot : old)
      if (slot.key != empty_key)
        insert(static_cast<TokenId>(slot.key >> 32), static_cast<TokenId>(slot.key), slot.merge);
  }
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

/// One part of a piece during the merge: its token and what merging it with the next part would give.
struct Part {
  TokenId token;
  Merge with_next;
};

/// Merges `parts` (one per byte, already holding their tokens) in place until no adjacent pair has a merge.
inline void byte_pair_merge(const PairTable& merges, std::vector<Part>& parts) {
  if (parts.empty()) return;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i)
    parts[i].with_next = merges.find(parts[i].token, parts[i + 1].token);
  parts.back().with_next = {};
  while (parts.size() > 1) {
    std::size_t best = 0;
    for (std::size_t i = 1; i + 1 < parts.size(); ++i)
      if (parts[i].with_next.rank < parts[best].with_next.rank) best = i;
    if (parts[best].with_next.rank == no_token) break;
    parts[best].token = parts[best].with_next.token;
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    parts[best].with_next = best + 1 < parts.size() ? merges.find(parts[best].token, parts[best + 1].token) : Merge{};
    if (best > 0) parts[best - 1].with_next = merges.find(parts[best - 1].token, parts[best].token);
  }
}

/// Length of the longest valid UTF-8 prefix of `text` (no overlongs, no surrogates, at most U+10FFFF).
inline std::size_t valid_utf8_prefix(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    // ASCII fast path, eight bytes at a time.
    while (i + 8 <= n) {
      std::uint64_t word;
      __builtin_memcpy(&word, s + i, 8);
      if (word & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t length;
    unsigned char low = 0x80, high = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) length = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
      length = 3;
      if (c == 0xE0) low = 0xA0;
      if (c == 0xED) high = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      length = 4;
      if (c == 0xF0) low = 0x90;
      if (c == 0xF4) high = 0x8F;
    } else return i;
    if (i + length > n) return i;
    if (s[i + 1] < low || s[i + 1] > high) return i;
    for (std::size_t k = 2; k < length; ++k)
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i;
    i += length;
  }
  return n;
}

/// GPT-2's byte ↔ character table (`bytes_to_unicode`): printable Latin-1 bytes stand for themselves, the
/// others for U+0100 onwards, so a byte-level vocabulary is printable text.
inline const std::array<char32_t, 256>& byte_level_characters() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> characters{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      characters[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
    }
    return characters;
  }();
  return table;
}

/// Appends the UTF-8 encoding of `c` to `out`.
inline void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

/// Decodes valid UTF-8 into code points (the caller validated it).
inline std::u32string utf8_code_points(std::string_view text) {
  std::u32string out;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  for (std::size_t i = 0; i < text.size();) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      out += c;
      i += 1;
    } else if (c < 0xE0) {
      out += static_cast<char32_t>(((c & 0x1F) << 6) | (s[i + 1] & 0x3F));
      i += 2;
    } else if (c < 0xF0) {
      out += static_cast<char32_t>(((c & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F));
      i += 3;
    } else {
      out += static_cast<char32_t>(((c & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) |
                                   (s[i + 3] & 0x3F));
      i += 4;
    }
  }
  return out;
}

/// FNV-1a, 64 bits: the tokenizer fingerprint (stable across platforms and releases, unlike std::hash).
class Fingerprint {
 public:
  void add(std::string_view bytes) {
    add_u64(bytes.size());
    for (const char c : bytes) mix(static_cast<unsigned char>(c));
  }
  void add_u64(std::uint64_t value) {
    for (int k = 0; k < 8; ++k) mix(static_cast<unsigned char>(value >> (8 * k)));
  }
  std::uint64_t value() const { return hash_; }

 private:
  void mix(unsigned char byte) {
    hash_ ^= byte;
    hash_ *= 0x100000001b3ULL;
  }
  std::uint64_t hash_ = 0xcbf29ce484222325ULL;
};

}  // namespace detail
}  // namespace hpctrain::text
