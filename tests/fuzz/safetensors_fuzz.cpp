// Fuzzes the safetensors header parser (models/hf/safetensors_format.hpp) that every Hugging Face checkpoint
// import runs before LibTorch sees a byte. An accepted header's tensors tile the data buffer exactly, each
// sized shape × dtype, all inside the file.
#include <hpctrain/models/hf/safetensors_format.hpp>

#include "fuzz_support.hpp"

namespace st = hpctrain::models::safetensors;

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  const auto bytes = hpctrain::fuzz::as_text(data, size);
  hpctrain::fuzz::expect_clean_rejection([&] {
    const st::Header header = st::parse_header(bytes, "fuzz.safetensors");
    FUZZ_CHECK(header.data_start + header.data_size == bytes.size());
    std::uint64_t next = 0;
    for (const auto& tensor : header.tensors) {
      FUZZ_CHECK(tensor.begin == next && tensor.end >= tensor.begin && tensor.end <= header.data_size);
      __int128 elements = 1;
      for (auto d : tensor.shape) {
        FUZZ_CHECK(d >= 0);
        elements *= d;
      }
      FUZZ_CHECK(elements * st::dtype_size(tensor.dtype) == static_cast<__int128>(tensor.size()));
      next = tensor.end;
    }
    FUZZ_CHECK(next == header.data_size);
  });
  return 0;
}
