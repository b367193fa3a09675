#pragma once
// The token file the trainer reads: a 64-byte header, then the ids as little-endian uint16 (when every id
// fits) or uint32. The header says what a reader must agree with before it trusts a single token: the
// width, the count (a truncated file is caught), and the fingerprint of the tokenizer that made it.
// Torch-free so it can be fuzzed; train/data/tokens.hpp reads the same header.
//
//   offset  size  field
//        0     8  magic "HPCTOKEN"
//        8     4  version (1)
//       12     4  bytes per token (2 or 4)
//       16     8  token count
//       24     8  vocabulary size (largest id + 1)
//       32     8  tokenizer fingerprint (Tokenizer::fingerprint)
//       40     8  source digest (inputs and options of prepare_tokens; 0 if unknown)
//       48     4  end-of-text id (0xFFFFFFFF if none)
//       52    12  zero
#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string_view>

#include <fmt/format.h>

#include <hpctrain/error.hpp>

namespace hpctrain::text {

inline constexpr std::string_view token_file_magic = "HPCTOKEN";
inline constexpr std::uint32_t token_file_version = 1;
inline constexpr std::size_t token_file_header_size = 64;

/// What a token file's header holds.
struct TokenFileHeader {
  std::uint32_t token_bytes = 2;
  std::uint64_t tokens = 0;
  std::uint64_t vocab_size = 0;
  std::uint64_t fingerprint = 0;
  std::uint64_t source_digest = 0;
  std::uint32_t end_of_text = 0xFFFFFFFFu;
};

/// What a reader expects of a token file; an unset field is not checked.
struct TokenFileExpectation {
  /// The fingerprint of the tokenizer the model was built for (Tokenizer::fingerprint()).
  std::optional<std::uint64_t> fingerprint;
  /// 2 or 4.
  std::optional<std::uint32_t> token_bytes;
};

namespace detail {
template <class T>
void put_le(std::array<char, token_file_header_size>& out, std::size_t offset, T value) {
  for (std::size_t k = 0; k < sizeof(T); ++k) out[offset + k] = static_cast<char>((value >> (8 * k)) & 0xFF);
}
template <class T>
T get_le(std::span<const char> in, std::size_t offset) {
  T value = 0;
  for (std::size_t k = 0; k < sizeof(T); ++k)
    value |= static_cast<T>(static_cast<unsigned char>(in[offset + k])) << (8 * k);
  return value;
}
[[noreturn]] inline void bad_token_file(const std::filesystem::path& file, std::string_view reason) {
  throw RuntimeError(errors::runtime_text_token_file, fmt::format("{}: {}", file.string(), reason));
}
}  // namespace detail

/// The 64 header bytes for `header`.
inline std::array<char, token_file_header_size> encode_token_file_header(const TokenFileHeader& header) {
  std::array<char, token_file_header_size> out{};
  std::memcpy(out.data(), token_file_magic.data(), token_file_magic.size());
  detail::put_le(out, 8, token_file_version);
  detail::put_le(out, 12, header.token_bytes);
  detail::put_le(out, 16, header.tokens);
  detail::put_le(out, 24, header.vocab_size);
  detail::put_le(out, 32, header.fingerprint);
  detail::put_le(out, 40, header.source_digest);
  detail::put_le(out, 48, header.end_of_text);
  return out;
}

/// Whether `bytes` starts with the token-file magic (else it may be a raw nanoGPT `.bin`).
inline bool has_token_file_magic(std::span<const char> bytes) {
  return bytes.size() >= token_file_magic.size() &&
         std::string_view(bytes.data(), token_file_magic.size()) == token_file_magic;
}

/// Parses and checks the header of `file` (its first bytes and its size). Throws
/// `[hpctrain.runtime.text.token_file]` naming the file: bad magic, version or width, a size that does
/// not match the count, ids wider than the width, or a mismatch with `expect`.
inline TokenFileHeader parse_token_file_header(std::span<const char> bytes, std::uint64_t file_size,
                                               const std::filesystem::path& file,
                                               const TokenFileExpectation& expect = {}) {
  if (bytes.size() < token_file_header_size || file_size < token_file_header_size)
    detail::bad_token_file(
        file, fmt::format("{} bytes is shorter than the {}-byte header", file_size, token_file_header_size));
  if (!has_token_file_magic(bytes)) detail::bad_token_file(file, "no \"HPCTOKEN\" magic: not an hpctrain token file");
  const auto version = detail::get_le<std::uint32_t>(bytes, 8);
  if (version != token_file_version)
    detail::bad_token_file(file,
                           fmt::format("version {} (this hpctrain reads version {})", version, token_file_version));
  TokenFileHeader header;
  header.token_bytes = detail::get_le<std::uint32_t>(bytes, 12);
  header.tokens = detail::get_le<std::uint64_t>(bytes, 16);
  header.vocab_size = detail::get_le<std::uint64_t>(bytes, 24);
  header.fingerprint = detail::get_le<std::uint64_t>(bytes, 32);
  header.source_digest = detail::get_le<std::uint64_t>(bytes, 40);
  header.end_of_text = detail::get_le<std::uint32_t>(bytes, 48);
  if (header.token_bytes != 2 && header.token_bytes != 4)
    detail::bad_token_file(file, fmt::format("{} bytes per token (2 or 4)", header.token_bytes));
  if (header.token_bytes == 2 && header.vocab_size > 65536)
    detail::bad_token_file(file,
                           fmt::format("a vocabulary of {} ids does not fit 2 bytes per token", header.vocab_size));
  const std::uint64_t payload = file_size - token_file_header_size;
  if (header.tokens > payload / header.token_bytes || payload != header.tokens * header.token_bytes)
    detail::bad_token_file(
        file, fmt::format("the header counts {} tokens of {} bytes but the file holds {} bytes after it", header.tokens,
                          header.token_bytes, payload));
  if (expect.token_bytes && *expect.token_bytes != header.token_bytes)
    detail::bad_token_file(file,
                           fmt::format("{} bytes per token, expected {}", header.token_bytes, *expect.token_bytes));
  if (expect.fingerprint && *expect.fingerprint != header.fingerprint)
    detail::bad_token_file(
        file, fmt::format("made by the tokenizer with fingerprint {:016x}, expected {:016x} (another tokenizer)",
                          header.fingerprint, *expect.fingerprint));
  return header;
}

}  // namespace hpctrain::text
