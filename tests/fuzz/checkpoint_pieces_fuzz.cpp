// Fuzzes the index of a checkpoint file's pieces region and the checked reads of its pieces
// (train/checkpoint/checkpoint_pieces_index.hpp), which every sharded resume runs on files another run wrote. The input
// is the index (JSON text, which holds no NUL byte) up to its first NUL byte, and the region after it (no NUL: all
// index, an empty region). An accepted index describes pieces inside the region; then every piece is read whole, by its
// first and last element, from its middle, and by ranges that must be refused (beyond its end, negative, overflowing):
// a read returns exactly the region's bytes at the piece's offset, or is refused with `[hpctrain.runtime.checkpoint]`,
// and never asks the region for a byte outside it.
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <hpctrain/train/checkpoint/checkpoint_pieces_index.hpp>

#include "fuzz_support.hpp"

namespace {

namespace d = hpctrain::detail;
constexpr auto max = std::numeric_limits<std::int64_t>::max();

/// memcmp, which may not be given a null pointer even for no bytes (an empty vector's data()).
bool same(const void* a, const void* b, std::size_t size) { return size == 0 || std::memcmp(a, b, size) == 0; }

/// Reads elements [begin, begin + length) of piece `id`: the bytes, or empty after a clean refusal (`refused`).
std::vector<unsigned char> read_range(const d::PieceIndex& index, std::string_view region, std::int64_t id,
                                      std::int64_t begin, std::int64_t length, bool& refused) {
  const auto file = std::string("fuzz.hpct");
  const d::RegionReader read = [&](std::int64_t offset, std::int64_t size, void* into) {
    FUZZ_CHECK(offset >= 0 && size >= 0 && size <= static_cast<std::int64_t>(region.size()) &&
               offset <= static_cast<std::int64_t>(region.size()) - size);
    std::memcpy(into, region.data() + offset, static_cast<std::size_t>(size));
  };
  refused = true;
  std::vector<unsigned char> bytes;
  hpctrain::fuzz::expect_clean_rejection([&] {
    const auto span = d::piece_span(index, id, begin, length, file);
    const auto& piece = index.pieces[static_cast<std::size_t>(id)];
    FUZZ_CHECK(span.from >= 0 && span.from <= span.to && span.to <= piece.bytes());
    FUZZ_CHECK(span.skip >= 0 && (span.skip + length) * piece.element_bytes <= span.to - span.from);
    std::vector<unsigned char> chunks(static_cast<std::size_t>(span.to - span.from));
    d::read_checked_chunks(index, id, span, read, chunks.data(), file);
    const auto first = chunks.begin() + span.skip * piece.element_bytes;
    bytes.assign(first, first + length * piece.element_bytes);
    refused = false;
  });
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  const auto input = hpctrain::fuzz::as_text(data, size);
  const auto nul = input.find('\0');
  const auto text = input.substr(0, nul);
  const auto region = nul == std::string_view::npos ? std::string_view() : input.substr(nul + 1);
  d::PieceIndex index;
  bool accepted = false;
  hpctrain::fuzz::expect_clean_rejection([&] {
    index = d::PieceIndex::parse(text, static_cast<std::int64_t>(region.size()), "fuzz.hpct");
    accepted = true;
  });
  if (!accepted) return 0;
  FUZZ_CHECK(index.chunk_bytes > 0 && index.chunk_bytes <= d::max_chunk_bytes && index.chunk_bytes % 8 == 0);
  const auto pieces = static_cast<std::int64_t>(index.pieces.size());
  for (std::int64_t id = 0; id < pieces; ++id) {
    const auto& piece = index.pieces[static_cast<std::size_t>(id)];
    FUZZ_CHECK(piece.numel >= 0 && piece.offset >= 0 &&
               piece.bytes() <= static_cast<std::int64_t>(region.size()) - piece.offset);
    const auto n = piece.numel;
    bool whole_refused = false;
    const auto whole = read_range(index, region, id, 0, n, whole_refused);
    // Read whole, it is the region's bytes at its offset (or some chunk's CRC does not match).
    if (!whole_refused)
      FUZZ_CHECK(whole.size() == static_cast<std::size_t>(piece.bytes()) &&
                 same(whole.data(), region.data() + piece.offset, whole.size()));
    // Parts of it: refused only where the whole was (a corrupt chunk), else equal to the whole's bytes.
    const std::int64_t parts[][2] = {{0, std::min<std::int64_t>(n, 1)},
                                     {n > 0 ? n - 1 : 0, n > 0 ? 1 : 0},
                                     {n / 3, n / 3},
                                     {n / 2, 0},
                                     {n, 0},
                                     {n / 4, n - n / 4}};
    for (const auto& [begin, length] : parts) {
      bool refused = false;
      const auto part = read_range(index, region, id, begin, length, refused);
      FUZZ_CHECK(!refused || whole_refused);
      if (!refused && !whole_refused)
        FUZZ_CHECK(part.size() == static_cast<std::size_t>(length * piece.element_bytes) &&
                   same(part.data(), whole.data() + begin * piece.element_bytes, part.size()));
    }
    // Ranges that do not exist in the piece: refused, whatever the arithmetic on them.
    const std::int64_t outside[][2] = {{n, 1}, {-1, 1}, {0, -1}, {0, n + 1}, {1, max}, {max, max}, {-max, max}};
    for (const auto& [begin, length] : outside) {
      bool refused = false;
      read_range(index, region, id, begin, length, refused);
      FUZZ_CHECK(refused);
    }
  }
  // Pieces that do not exist.
  for (const auto id : {pieces, std::int64_t{-1}, max}) {
    bool refused = false;
    read_range(index, region, id, 0, 0, refused);
    FUZZ_CHECK(refused);
  }
  return 0;
}
