// Fuzzes the checkpoint header check (train/checkpoint/checkpoint_format.hpp) that runs on every checkpoint file
// before LibTorch's reader sees its payload (format 1: the payload is the rest; format 2: pieces may follow). The first
// input byte chooses whether the target repairs the CRC field, so that the fuzzer also explores the inputs that pass
// the checksum (the torn and edited files that a real CRC would catch are in the other half).
#include <cstring>
#include <string>

#include <hpctrain/train/checkpoint/checkpoint_format.hpp>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  if (size == 0) return 0;
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((data[0] & 1) != 0 && bytes.size() >= hpctrain::detail::checkpoint_header_size) {
    const std::uint32_t crc =
        hpctrain::detail::crc32c(std::string_view(bytes).substr(hpctrain::detail::checkpoint_header_size));
    std::memcpy(bytes.data() + 12, &crc, 4);
  }
  hpctrain::fuzz::expect_clean_rejection([&] {
    const auto checked = hpctrain::detail::verify_checkpoint(bytes, "checkpoints/fuzz.hpct");
    // Format 1: the payload is the rest of the file; format 2: the pieces region may follow it.
    const auto held = checked.payload.size() + hpctrain::detail::checkpoint_header_size;
    if (checked.format == hpctrain::detail::checkpoint_format) FUZZ_CHECK(held == bytes.size());
    else FUZZ_CHECK(checked.format == hpctrain::detail::checkpoint_format_with_pieces && held <= bytes.size());
    FUZZ_CHECK(checked.payload.data() == bytes.data() + hpctrain::detail::checkpoint_header_size);
  });
  return 0;
}
