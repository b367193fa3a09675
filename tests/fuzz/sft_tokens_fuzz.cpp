// Fuzzes the prepared SFT file (text/sft_tokens.hpp, "HPCSFTOK"): the input is the whole file. Whatever it
// holds, parse_sft_tokens rejects it with its own error or returns a view whose every record and id lies
// inside the bytes it was given, ids within the vocabulary and masks 0 or 1.
#include <span>

#include <hpctrain/text/sft_tokens.hpp>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  const std::span<const char> bytes(reinterpret_cast<const char*>(data), size);
  hpctrain::fuzz::expect_clean_rejection([&] {
    const auto view = hpctrain::text::parse_sft_tokens(bytes, "fuzz.sfttokens");
    const auto& header = view.header();
    FUZZ_CHECK(static_cast<__int128>(header.tokens) * 5 + static_cast<__int128>(header.records) * 16 + 64 ==
               static_cast<__int128>(size));
    std::uint64_t covered = 0;
    for (std::uint64_t r = 0; r < view.records(); ++r) {
      const auto record = view.record(r);
      FUZZ_CHECK(record.first == covered);
      covered += record.count;
    }
    FUZZ_CHECK(covered == header.tokens);
    for (std::uint64_t i = 0; i < header.tokens; ++i) {
      FUZZ_CHECK(view.id(i) >= 0 && static_cast<std::uint64_t>(view.id(i)) < header.vocab_size);
      FUZZ_CHECK(view.trained(i) <= 1);
    }
  });
  return 0;
}
