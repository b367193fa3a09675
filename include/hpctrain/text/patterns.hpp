#pragma once
// The split patterns of the byte-level BPE families, as their reference implementations write them. A
// tiktoken ranks file carries no pattern: the caller names one of these (tiktoken keeps them in code too).
#include <string_view>

namespace hpctrain::text::patterns {

/// GPT-2's pattern as its release and HF's ByteLevel(use_regex=true) write it.
inline constexpr std::string_view gpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

/// r50k_base / p50k_base / gpt2 as tiktoken 0.12 writes it (equivalent to `gpt2`, faster).
inline constexpr std::string_view r50k =
    R"('(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s)";

/// cl100k_base (GPT-3.5/4), as tiktoken 0.12 writes it (possessive quantifiers).
inline constexpr std::string_view cl100k =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s)";

/// o200k_base (GPT-4o), as tiktoken 0.12 writes it.
inline constexpr std::string_view o200k =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

/// Llama 3's Split pre-tokenizer (its tokenizer.json spells it the same way).
inline constexpr std::string_view llama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace hpctrain::text::patterns
