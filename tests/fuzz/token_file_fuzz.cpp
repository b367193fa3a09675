// Fuzzes the token-file header (text/token_file.hpp, "HPCTOKEN" + 56 bytes) that every token dataset
// checks before it maps the ids. The input is the file's first bytes; its size is the input's size, or a
// size from the input's last 8 bytes when the first byte is odd (a header that lies about a big file).
#include <cstring>
#include <span>

#include <hpctrain/text/token_file.hpp>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  if (size < 9) return 0;
  std::uint64_t file_size = size - 1;
  if ((data[0] & 1) != 0) std::memcpy(&file_size, data + size - 8, 8);
  const std::span<const char> bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  hpctrain::text::TokenFileExpectation expect;
  if ((data[0] & 2) != 0) expect.token_bytes = (data[0] & 4) != 0 ? 4 : 2;
  hpctrain::fuzz::expect_clean_rejection([&] {
    const auto header = hpctrain::text::parse_token_file_header(bytes, file_size, "fuzz.tokens", expect);
    FUZZ_CHECK(header.token_bytes == 2 || header.token_bytes == 4);
    // The ids the header announces are exactly what the file holds after the header.
    FUZZ_CHECK(static_cast<__int128>(header.tokens) * header.token_bytes + hpctrain::text::token_file_header_size ==
               static_cast<__int128>(file_size));
  });
  return 0;
}
