// Fuzzes the IDX header check (train/data/idx_format.hpp) that read_idx runs on every MNIST-family file
// before LibTorch sees it. An accepted file's dimensions multiply exactly to its data bytes.
#include <hpctrain/train/data/idx_format.hpp>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  if (size == 0) return 0;
  // The first byte picks the rank read_idx expects (images 3, labels 1, or another), the rest is the file.
  const int rank = data[0] % 5;
  const auto bytes = hpctrain::fuzz::as_text(data + 1, size - 1);
  hpctrain::fuzz::expect_clean_rejection([&] {
    const auto layout = hpctrain::data::parse_idx_layout(bytes, rank, "fuzz.idx");
    FUZZ_CHECK(layout.dims.size() == static_cast<std::size_t>(rank));
    FUZZ_CHECK(layout.data_offset + layout.count == bytes.size());
    __int128 product = 1;
    for (auto dim : layout.dims) product *= dim;
    FUZZ_CHECK(product == static_cast<__int128>(layout.count));
  });
  return 0;
}
