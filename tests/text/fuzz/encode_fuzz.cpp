// libFuzzer target: encoding any bytes (invalid UTF-8 included) never crashes and decodes back to them.
//   clang++-14 -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -I include \
//     tests/text/fuzz/encode_fuzz.cpp -lfmt -lpcre2-8 -o build/encode_fuzz && build/encode_fuzz -max_total_time=60
// Uses GPT-2's ranks (~/.cache/hpctrain/gpt2.tiktoken), special tokens allowed.
#include <cstdint>
#include <cstdlib>

#include <hpctrain/text/tiktoken.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto tokenizer =
      hpctrain::text::load_tiktoken(std::string(std::getenv("HOME")) + "/.cache/hpctrain/gpt2.tiktoken");
  static auto encoder = tokenizer.encoder();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto ids = encoder.encode(text, size % 2 == 0);
  if (encoder.decode(ids) != text) std::abort();
  return 0;
}
