#pragma once
// The IDX header (the MNIST family's format), checked without LibTorch so that tests/fuzz can fuzz it:
// magic number, element type, rank, big-endian dimensions, and a data size that matches them.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join for the dimensions in messages

#include <hpctrain/error.hpp>

namespace hpctrain::data {

/// A validated IDX file of unsigned bytes: its dimensions and where the `count` data bytes start.
struct IdxLayout {
  std::vector<std::int64_t> dims;
  std::size_t data_offset = 0;
  std::size_t count = 0;  ///< product of dims == bytes after the header
};

/// Checks `bytes` (a whole IDX file, decompressed) for unsigned bytes (type 0x08) in `expected_rank`
/// dimensions; throws `[hpctrain.runtime.data.idx] <path>: <why>` if the magic number, rank or size is wrong.
inline IdxLayout parse_idx_layout(std::string_view bytes, int expected_rank, const std::filesystem::path& path) {
  auto fail = [&](const std::string& why) {
    return RuntimeError(errors::runtime_data_idx, fmt::format("{}: {}", path.string(), why));
  };
  if (bytes.size() < 4) throw fail(fmt::format("{} bytes is too short for an IDX header", bytes.size()));
  const auto* raw = reinterpret_cast<const unsigned char*>(bytes.data());
  if (raw[0] != 0 || raw[1] != 0)
    throw fail(fmt::format("bad magic number 0x{:02x}{:02x}{:02x}{:02x} (an IDX file starts with two zero bytes)",
                           raw[0], raw[1], raw[2], raw[3]));
  if (raw[2] != 0x08) throw fail(fmt::format("element type 0x{:02x} is not 0x08 (unsigned byte)", raw[2]));
  if (raw[3] != expected_rank) throw fail(fmt::format("{} dimensions, expected {}", raw[3], expected_rank));
  IdxLayout layout;
  layout.data_offset = 4 + 4 * static_cast<std::size_t>(expected_rank);
  if (bytes.size() < layout.data_offset)
    throw fail(fmt::format("{} bytes is too short for a {}-dimension header", bytes.size(), expected_rank));
  const std::size_t data_bytes = bytes.size() - layout.data_offset;
  // Dimensions whose product overflows 64 bits used to wrap to a small number that matched a short file,
  // and torch::empty then failed on the real shape (tests/fuzz/corpus/idx/dimensions_overflow). The
  // non-zero dimensions must form a shape a tensor can have (numel below 2^62), which also keeps the
  // product exact; an empty file's zero dimension does not exempt the rest.
  bool too_big = false;
  std::uint64_t nonzero = 1;
  layout.count = 1;
  for (int d = 0; d < expected_rank; ++d) {
    const unsigned char* p = raw + 4 + 4 * d;  // dimensions are big-endian uint32
    const std::uint32_t dim =
        (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
    layout.dims.push_back(dim);
    if (dim != 0 && nonzero > (std::uint64_t{1} << 62) / dim) too_big = true;
    if (dim != 0) nonzero *= dim;
    layout.count *= dim;  // may wrap once too_big: only reported, never used
  }
  if (too_big || data_bytes != layout.count)
    throw fail(fmt::format("holds {} data bytes, but its dimensions {} need {}", data_bytes,
                           fmt::join(layout.dims, "x"), too_big ? std::string("more") : std::to_string(layout.count)));
  return layout;
}

}  // namespace hpctrain::data
