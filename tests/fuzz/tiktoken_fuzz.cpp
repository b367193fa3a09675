// Fuzzes the tiktoken ranks reader (text/tiktoken.hpp): one `<base64 bytes> <rank>` per line, GPT-2's
// pattern and specials. An accepted file gives a tokenizer that encodes and decodes a short text without
// failing. The input goes through a file in /dev/shm, as the loader takes a path.
#include <fstream>
#include <string>

#include <hpctrain/text/tiktoken.hpp>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  static const std::string path = hpctrain::fuzz::scratch_file("input.tiktoken");
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  hpctrain::fuzz::expect_clean_rejection([&] {
    const auto tokenizer = hpctrain::text::load_tiktoken(path);
    const auto ids = tokenizer.encode("Hello, world! 123 éλ");
    (void)tokenizer.decode(ids);
  });
  return 0;
}
