// Fuzzes the token-file header check (text/token_file.hpp) that the trainer's reader runs before it trusts a
// token. The first eight input bytes are the file size the parser is told; the rest are the file's start.
#include <cstdint>

#include <hpctrain/text/token_file.hpp>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  if (size < 8) return 0;
  std::uint64_t file_size = 0;
  for (int k = 0; k < 8; ++k) file_size |= std::uint64_t{data[k]} << (8 * k);
  const std::span<const char> bytes(reinterpret_cast<const char*>(data + 8), size - 8);
  hpctrain::fuzz::expect_clean_rejection([&] {
    const auto header = hpctrain::text::parse_token_file_header(bytes, file_size, "fuzz.tokens");
    // Accepted: the width is 2 or 4 and the file holds exactly the counted tokens after the header.
    FUZZ_CHECK(header.token_bytes == 2 || header.token_bytes == 4);
    FUZZ_CHECK(file_size == hpctrain::text::token_file_header_size + header.tokens * header.token_bytes);
  });
  return 0;
}
