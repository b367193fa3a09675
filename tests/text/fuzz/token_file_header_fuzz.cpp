// libFuzzer target: the token-file header parser never crashes and accepts only what it can serve.
//   clang++-14 -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -I include \
//     tests/text/fuzz/token_file_header_fuzz.cpp -lfmt -o build/token_file_header_fuzz && build/token_file_header_fuzz -max_total_time=60
#include <cstdint>
#include <cstdlib>

#include <hpctrain/text/token_file.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 8) return 0;
  std::uint64_t file_size = 0;
  for (int k = 0; k < 8; ++k) file_size |= std::uint64_t{data[k]} << (8 * k);
  const std::span<const char> bytes(reinterpret_cast<const char*>(data + 8), size - 8);
  try {
    const auto header = hpctrain::text::parse_token_file_header(bytes, file_size, "fuzz.tokens");
    // Accepted: the payload is exactly the count times the width, which is 2 or 4.
    if ((header.token_bytes != 2 && header.token_bytes != 4) ||
        file_size != hpctrain::text::token_file_header_size + header.tokens * header.token_bytes)
      std::abort();
  } catch (const hpctrain::Error&) {
  }
  return 0;
}
