#pragma once
// The read side of a checkpoint file's pieces region (train/checkpoint/checkpoint_pieces.hpp has the layout), without
// LibTorch so that tests/fuzz can fuzz it: the index, checked field by field against the region's size, and the checked
// read of the chunks that an element range of a piece overlaps. Every number in the index is an integer in range before
// any arithmetic uses it: a hand-edited or corrupt index is refused naming the file and the field, never read as
// another number (nlohmann's get<> converts 1e30 to an int64 by undefined behaviour, -1 to a CRC of 2^32 - 1).
#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/checksums.hpp>
#include <hpctrain/error.hpp>

namespace hpctrain::detail {

/// A dtype a piece may hold: its name in the index and the bytes of one element.
struct PieceDtype {
  std::string_view name;
  std::int64_t element_bytes;
};

inline constexpr std::array<PieceDtype, 6> piece_dtypes{
    {{"float32", 4}, {"float64", 8}, {"bfloat16", 2}, {"float16", 2}, {"int64", 8}, {"int32", 4}}};

/// One piece of a pieces region, as its index describes it (checked).
struct PieceEntry {
  std::size_t dtype = 0;  ///< its place in piece_dtypes
  std::int64_t element_bytes = 4;
  std::int64_t numel = 0;
  std::int64_t offset = 0;  ///< bytes from the region's start
  std::vector<std::uint32_t> crcs;

  std::int64_t bytes() const { return numel * element_bytes; }
};

/// The largest chunk an index may name. A read of an element range holds the whole chunks it overlaps: at most one
/// chunk more than the range on each side (never more than the piece, itself within the file). So a chunk_bytes of
/// 2^62 allocates no more than the file holds, but turns a resharding rank's read of a few elements into a read and a
/// CRC of its whole piece, up to gigabytes per rank. Capped at 64 MiB (64 times the writer's 1 MiB,
/// PieceWriter::chunk_bytes): a range read then holds at most 128 MiB beyond what it asked for.
inline constexpr std::int64_t max_chunk_bytes = std::int64_t{64} << 20;

/// ceil(a / b) for a >= 0, b > 0, without the overflow of (a + b - 1) / b.
inline std::int64_t chunks_of(std::int64_t a, std::int64_t b) { return a == 0 ? 0 : (a - 1) / b + 1; }

/// Whether `value` is a JSON integer in [low, high], for high >= 0 (nlohmann holds a non-negative integer as unsigned,
/// a negative one as signed, and a number beyond 64 bits as a double).
inline bool integer_within(const nlohmann::json& value, std::int64_t low, std::int64_t high) {
  if (value.is_number_unsigned()) {
    const auto number = value.get<std::uint64_t>();
    return number <= static_cast<std::uint64_t>(high) && static_cast<std::int64_t>(number) >= low;
  }
  return value.is_number_integer() && value.get<std::int64_t>() >= low && value.get<std::int64_t>() <= high;
}

/// A pieces region's index, checked field by field against the region's `region_size` bytes: throws
/// RuntimeError(errors::runtime_checkpoint) naming `file` and what is wrong.
struct PieceIndex {
  std::int64_t chunk_bytes = 0;
  std::vector<PieceEntry> pieces;

  static PieceIndex parse(std::string_view text, std::int64_t region_size, const std::string& file) {
    const auto fail = [&](const std::string& why) {
      return RuntimeError(errors::runtime_checkpoint,
                          fmt::format("{}: the index of its pieces is malformed: {}", file, why));
    };
    // A field that must be an integer in [low, high]: get<> would convert a float, a bool or an unsigned beyond
    // int64 without a word (a float beyond 64 bits by undefined behaviour).
    const auto integer = [&](const nlohmann::json& object, const char* name, const std::string& where, std::int64_t low,
                             std::int64_t high) {
      const auto& value = object.at(name);
      if (!integer_within(value, low, high))
        throw fail(fmt::format("{}{} is {}, not an integer in [{}, {}]", where, name, value.dump(), low, high));
      return value.get<std::int64_t>();
    };
    constexpr auto max = std::numeric_limits<std::int64_t>::max();
    PieceIndex index;
    try {
      const auto j = nlohmann::json::parse(text.begin(), text.end());
      if (!j.is_object()) throw fail(fmt::format("a JSON object expected, not {}", j.type_name()));
      if (j.at("format") != 1) throw fail(fmt::format("format {} is not 1", j.at("format").dump()));
      index.chunk_bytes = integer(j, "chunk_bytes", "", 8, max_chunk_bytes);
      if (index.chunk_bytes % 8 != 0)
        throw fail(fmt::format("chunk_bytes {} is not a multiple of 8", index.chunk_bytes));
      const auto described = integer(j, "size", "", 0, max);
      if (described > region_size)
        throw RuntimeError(
            errors::runtime_checkpoint,
            fmt::format("{}: truncated: its pieces region has {} of {} bytes", file, region_size, described));
      if (described != region_size)
        throw fail(fmt::format("it describes {} bytes of pieces, the file holds {}", described, region_size));
      const auto& pieces = j.at("pieces");
      if (!pieces.is_array()) throw fail(fmt::format("pieces is {}, not an array", pieces.type_name()));
      for (const auto& piece : pieces) index.pieces.push_back(parse_piece(piece, index, region_size, integer, fail));
    } catch (const nlohmann::json::exception& error) {
      throw fail(error.what());
    }
    return index;
  }

 private:
  template <class Integer, class Fail>
  static PieceEntry parse_piece(const nlohmann::json& piece, const PieceIndex& index, std::int64_t region_size,
                                const Integer& integer, const Fail& fail) {
    const auto where = fmt::format("piece {}: ", index.pieces.size());
    if (!piece.is_object()) throw fail(fmt::format("{}a JSON object expected, not {}", where, piece.type_name()));
    PieceEntry entry;
    const auto dtype = piece.at("dtype").get<std::string>();
    const auto found =
        std::find_if(piece_dtypes.begin(), piece_dtypes.end(), [&](const auto& e) { return e.name == dtype; });
    if (found == piece_dtypes.end()) throw fail(fmt::format("{}dtype '{}'", where, dtype));
    entry.dtype = static_cast<std::size_t>(found - piece_dtypes.begin());
    entry.element_bytes = found->element_bytes;
    // Each within the region first: beyond it, numel times the element size could overflow.
    entry.numel = integer(piece, "numel", where, 0, region_size);
    entry.offset = integer(piece, "offset", where, 0, region_size);
    if (entry.bytes() > region_size - entry.offset)
      throw fail(fmt::format("{}{} elements at byte {} lie outside the {} bytes of pieces", where, entry.numel,
                             entry.offset, region_size));
    const auto& crcs = piece.at("crc32c");
    if (!crcs.is_array()) throw fail(fmt::format("{}crc32c is {}, not an array", where, crcs.type_name()));
    const auto expected = chunks_of(entry.bytes(), index.chunk_bytes);
    if (static_cast<std::int64_t>(crcs.size()) != expected)
      throw fail(
          fmt::format("{}{} CRCs for {} bytes in chunks of {}", where, crcs.size(), entry.bytes(), index.chunk_bytes));
    for (std::size_t k = 0; k < crcs.size(); ++k) {
      if (!crcs[k].is_number_unsigned() || crcs[k].get<std::uint64_t>() > 0xffffffffu)
        throw fail(fmt::format("{}crc32c[{}] is {}, not a 32-bit CRC", where, k, crcs[k].dump()));
      entry.crcs.push_back(crcs[k].get<std::uint32_t>());
    }
    return entry;
  }
};

/// Reads `size` bytes at `offset` of the region into `into`; throws RuntimeError(errors::runtime_checkpoint) naming the
/// file.
using RegionReader = std::function<void(std::int64_t offset, std::int64_t size, void* into)>;

/// The bytes of a piece that a read of an element range covers: the whole chunks it overlaps, cut at the piece's end.
struct PieceSpan {
  std::int64_t from = 0, to = 0;  ///< bytes of the piece
  std::int64_t first_chunk = 0, end_chunk = 0;
  std::int64_t skip = 0;  ///< elements from `from` to the range's first
};

/// Where elements [begin, begin + length) of piece `id` of `index` lie; throws RuntimeError(errors::runtime_checkpoint)
/// naming `file` when the piece or the range does not exist.
inline PieceSpan piece_span(const PieceIndex& index, std::int64_t id, std::int64_t begin, std::int64_t length,
                            const std::string& file) {
  if (id < 0 || id >= static_cast<std::int64_t>(index.pieces.size()))
    throw RuntimeError(errors::runtime_checkpoint,
                       fmt::format("{}: it holds {} pieces, not piece {}", file, index.pieces.size(), id));
  const auto& piece = index.pieces[static_cast<std::size_t>(id)];
  if (begin < 0 || length < 0 || begin > piece.numel || length > piece.numel - begin) {  // begin + length may overflow
    const bool sums = begin >= 0 && length >= 0 && length <= std::numeric_limits<std::int64_t>::max() - begin;
    throw RuntimeError(errors::runtime_checkpoint,
                       fmt::format("{}: piece {} holds {} elements, not [{}, {})", file, id, piece.numel, begin,
                                   sums ? std::to_string(begin + length) : fmt::format("{} + {}", begin, length)));
  }
  PieceSpan span;
  if (length == 0) return span;  // no bytes: not even the chunk of `begin`, which may lie past the piece's end
  span.first_chunk = begin * piece.element_bytes / index.chunk_bytes;
  span.end_chunk = chunks_of((begin + length) * piece.element_bytes, index.chunk_bytes);
  span.from = span.first_chunk * index.chunk_bytes;
  // The last chunk ends at the piece's end: end_chunk * chunk_bytes could overflow beyond it.
  span.to = span.end_chunk == chunks_of(piece.bytes(), index.chunk_bytes) ? piece.bytes()
                                                                          : span.end_chunk * index.chunk_bytes;
  span.skip = begin - span.from / piece.element_bytes;
  return span;
}

/// Reads `span` of piece `id` through `read` into `into` (span.to - span.from bytes), checking each chunk against its
/// CRC-32C before any byte is used; throws RuntimeError(errors::runtime_checkpoint) naming `file`, the piece and the
/// chunk.
inline void read_checked_chunks(const PieceIndex& index, std::int64_t id, const PieceSpan& span,
                                const RegionReader& read, unsigned char* into, const std::string& file) {
  const auto& piece = index.pieces[static_cast<std::size_t>(id)];
  if (span.to > span.from) read(piece.offset + span.from, span.to - span.from, into);
  for (auto chunk = span.first_chunk; chunk < span.end_chunk; ++chunk) {
    const auto start = chunk * index.chunk_bytes, size = std::min(index.chunk_bytes, piece.bytes() - start);
    if (crc32c(into + (start - span.from), static_cast<std::size_t>(size)) !=
        piece.crcs[static_cast<std::size_t>(chunk)])
      throw RuntimeError(errors::runtime_checkpoint,
                         fmt::format("{}: corrupt: piece {}, bytes [{}, {}) of its {}: CRC-32C does not match", file,
                                     id, start, start + size, piece.bytes()));
  }
}

}  // namespace hpctrain::detail
