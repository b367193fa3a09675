// Fuzzes the Hugging Face tokenizer.json reader (text/huggingface.hpp): vocabulary, merges, added tokens and
// the pre-tokenizer's regex all come from the file. An accepted tokenizer then encodes and decodes a short
// text without failing. The input goes through a file in /dev/shm, as the loader takes a path.
#include <fstream>
#include <string>

#include <hpctrain/text/huggingface.hpp>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  static const std::string path = hpctrain::fuzz::scratch_file("input.json");
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  hpctrain::fuzz::expect_clean_rejection([&] {
    const auto tokenizer = hpctrain::text::load_huggingface_tokenizer(path);
    const auto ids = tokenizer.encode("Hello, world! 123 éλ");
    (void)tokenizer.decode(ids);
  });
  return 0;
}
