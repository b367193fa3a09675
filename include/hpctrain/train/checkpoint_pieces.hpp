#pragma once
// Flat tensors a strategy saves beside its LibTorch archive (a sharded strategy's shards and their optimizer state),
// in the same checkpoint file after the archive, so that a load reads only the elements it needs: LibTorch's archive
// deserialises whole, and a rank that reshards from 4 ranks to 2 needs a quarter of each old rank's pieces, not all.
//
// The pieces region: the pieces' bytes one after the other, little-endian as the CPU holds them. Its index, a JSON
// string the checkpoint layer writes into the archive under `hpctrain_pieces` (so it is covered by the archive's
// CRC-32C, checked before anything is read), lists for each piece its dtype, its element count, its byte offset in
// the region and the CRC-32C of each chunk of `chunk_bytes` (1 MiB) of its bytes, counted from its first byte. A read
// of elements [begin, begin + length) reads the chunks they overlap (at most one chunk more on each side) and checks
// each against its CRC before any element is used.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/types.h>

#include <hpctrain/error.hpp>
#include <hpctrain/train/crc32c.hpp>

namespace hpctrain {

namespace detail {
/// The dtypes a piece may hold, by the name the index gives them.
inline const std::vector<std::pair<std::string, torch::ScalarType>>& piece_dtypes() {
  static const std::vector<std::pair<std::string, torch::ScalarType>> dtypes{
      {"float32", torch::kFloat32}, {"float64", torch::kFloat64}, {"bfloat16", torch::kBFloat16},
      {"float16", torch::kFloat16}, {"int64", torch::kInt64},     {"int32", torch::kInt32}};
  return dtypes;
}
}  // namespace detail

/// The save side: a strategy adds its flat tensors and records the ids in its archive.
class PieceWriter {
 public:
  /// Bytes covered by one CRC-32C: what a read of a few elements costs at most beyond them, on each side.
  static constexpr std::int64_t chunk_bytes = std::int64_t{1} << 20;

  /// Appends a copy of `tensor`'s elements, flattened (on a GPU, the device-to-host copy: the snapshot a save takes,
  /// after which training may change the tensor); returns its id in this rank's file.
  std::int64_t add(const torch::Tensor& tensor) {
    const auto host = tensor.detach().reshape({-1}).to(torch::kCPU).contiguous();
    const auto found = std::find_if(detail::piece_dtypes().begin(), detail::piece_dtypes().end(),
                                    [&](const auto& entry) { return entry.second == host.scalar_type(); });
    if (found == detail::piece_dtypes().end())
      throw RuntimeError(errors::runtime_checkpoint,
                         fmt::format("a checkpoint piece of dtype {} cannot be saved (float32, float64, "
                                     "bfloat16, float16, int64 and int32 can)",
                                     c10::toString(host.scalar_type())));
    const auto offset = static_cast<std::int64_t>(bytes_.size());
    const auto size = static_cast<std::int64_t>(host.nbytes());
    bytes_.append(static_cast<const char*>(host.data_ptr()), static_cast<std::size_t>(size));
    nlohmann::json crcs = nlohmann::json::array();
    for (std::int64_t at = 0; at < size; at += chunk_bytes)
      crcs.push_back(
          detail::crc32c(bytes_.data() + offset + at, static_cast<std::size_t>(std::min(chunk_bytes, size - at))));
    pieces_.push_back(
        {{"dtype", found->first}, {"numel", host.numel()}, {"offset", offset}, {"crc32c", std::move(crcs)}});
    return static_cast<std::int64_t>(pieces_.size()) - 1;
  }

  bool empty() const { return pieces_.empty(); }
  /// The region's bytes, written after the archive.
  const std::string& bytes() const { return bytes_; }
  /// Hands the region's bytes over (to the file's writer), leaving the writer empty of them.
  std::string release_bytes() { return std::move(bytes_); }
  /// The index the checkpoint layer writes into the archive.
  nlohmann::json index() const {
    return {{"format", 1}, {"chunk_bytes", chunk_bytes}, {"size", bytes_.size()}, {"pieces", pieces_}};
  }

 private:
  std::string bytes_;
  std::vector<nlohmann::json> pieces_;
};

namespace detail {

/// One piece of a pieces region, as its index describes it (checked).
struct PieceEntry {
  torch::ScalarType dtype = torch::kFloat32;
  std::int64_t numel = 0;
  std::int64_t offset = 0;  ///< bytes from the region's start
  std::vector<std::uint32_t> crcs;
};

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
    PieceIndex index;
    try {
      const auto j = nlohmann::json::parse(text.begin(), text.end());
      if (j.at("format") != 1) throw fail(fmt::format("format {} is not 1", j.at("format").dump()));
      index.chunk_bytes = j.at("chunk_bytes").get<std::int64_t>();
      if (index.chunk_bytes <= 0 || index.chunk_bytes % 8 != 0)
        throw fail(fmt::format("chunk_bytes {}", index.chunk_bytes));
      const auto described = j.at("size").get<std::int64_t>();
      if (described > region_size)
        throw RuntimeError(
            errors::runtime_checkpoint,
            fmt::format("{}: truncated: its pieces region has {} of {} bytes", file, region_size, described));
      if (described != region_size)
        throw fail(fmt::format("it describes {} bytes of pieces, the file holds {}", described, region_size));
      for (const auto& piece : j.at("pieces")) {
        PieceEntry entry;
        const auto dtype = piece.at("dtype").get<std::string>();
        const auto found =
            std::find_if(piece_dtypes().begin(), piece_dtypes().end(), [&](const auto& e) { return e.first == dtype; });
        if (found == piece_dtypes().end()) throw fail(fmt::format("piece {}: dtype '{}'", index.pieces.size(), dtype));
        entry.dtype = found->second;
        entry.numel = piece.at("numel").get<std::int64_t>();
        entry.offset = piece.at("offset").get<std::int64_t>();
        // numel first: beyond the region it could overflow the byte count.
        const bool sane =
            entry.numel >= 0 && entry.numel <= region_size && entry.offset >= 0 && entry.offset <= region_size;
        const auto bytes = sane ? entry.numel * static_cast<std::int64_t>(c10::elementSize(entry.dtype)) : 0;
        if (!sane || bytes > region_size - entry.offset)
          throw fail(fmt::format("piece {}: {} elements at byte {} lie outside the {} bytes of pieces",
                                 index.pieces.size(), entry.numel, entry.offset, region_size));
        entry.crcs = piece.at("crc32c").get<std::vector<std::uint32_t>>();
        if (static_cast<std::int64_t>(entry.crcs.size()) != (bytes + index.chunk_bytes - 1) / index.chunk_bytes)
          throw fail(fmt::format("piece {}: {} CRCs for {} bytes", index.pieces.size(), entry.crcs.size(), bytes));
        index.pieces.push_back(std::move(entry));
      }
    } catch (const nlohmann::json::exception& error) {
      throw fail(error.what());
    }
    return index;
  }
};

/// Reads `size` bytes at `offset` of the region into `into`; throws RuntimeError(errors::runtime_checkpoint) naming the
/// file.
using RegionReader = std::function<void(std::int64_t offset, std::int64_t size, void* into)>;

/// Elements [begin, begin + length) of piece `id` of `index`, read through `read` chunk by chunk, each chunk checked
/// against its CRC-32C; throws RuntimeError(errors::runtime_checkpoint) naming `file`, the piece and the chunk.
inline torch::Tensor read_piece_range(const PieceIndex& index, const RegionReader& read, std::int64_t id,
                                      std::int64_t begin, std::int64_t length, const std::string& file) {
  if (id < 0 || id >= static_cast<std::int64_t>(index.pieces.size()))
    throw RuntimeError(errors::runtime_checkpoint,
                       fmt::format("{}: it holds {} pieces, not piece {}", file, index.pieces.size(), id));
  const auto& piece = index.pieces[static_cast<std::size_t>(id)];
  if (begin < 0 || length < 0 || begin + length > piece.numel)
    throw RuntimeError(errors::runtime_checkpoint, fmt::format("{}: piece {} holds {} elements, not [{}, {})", file, id,
                                                               piece.numel, begin, begin + length));
  const auto element = static_cast<std::int64_t>(c10::elementSize(piece.dtype));
  const auto piece_bytes = piece.numel * element;
  const auto first_chunk = begin * element / index.chunk_bytes;
  const auto end_chunk =
      length == 0 ? first_chunk : ((begin + length) * element + index.chunk_bytes - 1) / index.chunk_bytes;
  const auto from = first_chunk * index.chunk_bytes, to = std::min(end_chunk * index.chunk_bytes, piece_bytes);
  auto bytes = torch::empty({std::max<std::int64_t>(to - from, 0)}, torch::kUInt8);
  if (to > from) read(piece.offset + from, to - from, bytes.data_ptr());
  for (auto chunk = first_chunk; chunk < end_chunk; ++chunk) {
    const auto at = chunk * index.chunk_bytes - from,
               size = std::min(index.chunk_bytes, piece_bytes - chunk * index.chunk_bytes);
    if (crc32c(bytes.data_ptr<std::uint8_t>() + at, static_cast<std::size_t>(size)) !=
        piece.crcs[static_cast<std::size_t>(chunk)])
      throw RuntimeError(errors::runtime_checkpoint,
                         fmt::format("{}: corrupt: piece {}, bytes [{}, {}) of its {}: CRC-32C does not match", file,
                                     id, chunk * index.chunk_bytes, chunk * index.chunk_bytes + size, piece_bytes));
  }
  return bytes.view(piece.dtype).narrow(0, begin - from / element, length);
}

}  // namespace detail
}  // namespace hpctrain
