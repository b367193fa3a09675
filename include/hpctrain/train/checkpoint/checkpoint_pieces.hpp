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
// each against its CRC before any element is used. The read side (the index, checked, and the chunks a range covers)
// is torch-free, in train/checkpoint/checkpoint_pieces_index.hpp, so that tests/fuzz can fuzz it.
#include <algorithm>
#include <array>
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

#include <hpctrain/checksums.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/train/checkpoint/checkpoint_pieces_index.hpp>  // the read side, torch-free

namespace hpctrain {

namespace detail {
/// The LibTorch type of each of piece_dtypes (train/checkpoint/checkpoint_pieces_index.hpp), in its order.
inline constexpr std::array<torch::ScalarType, piece_dtypes.size()> piece_scalar_types{
    torch::kFloat32, torch::kFloat64, torch::kBFloat16, torch::kFloat16, torch::kInt64, torch::kInt32};
}  // namespace detail

/// The save side: a strategy adds its flat tensors and records the ids in its archive.
class PieceWriter {
 public:
  /// Bytes covered by one CRC-32C: what a read of a few elements costs at most beyond them, on each side.
  static constexpr std::int64_t chunk_bytes = std::int64_t{1} << 20;
  static_assert(chunk_bytes <= detail::max_chunk_bytes, "the readers refuse a larger chunk");

  /// Appends a copy of `tensor`'s elements, flattened (on a GPU, the device-to-host copy: the snapshot a save takes,
  /// after which training may change the tensor); returns its id in this rank's file.
  std::int64_t add(const torch::Tensor& tensor) {
    const auto host = tensor.detach().reshape({-1}).to(torch::kCPU).contiguous();
    const auto& types = detail::piece_scalar_types;
    const auto found = std::find(types.begin(), types.end(), host.scalar_type());
    if (found == types.end())
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
        {{"dtype", std::string(detail::piece_dtypes[static_cast<std::size_t>(found - types.begin())].name)},
         {"numel", host.numel()},
         {"offset", offset},
         {"crc32c", std::move(crcs)}});
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

/// Elements [begin, begin + length) of piece `id` of `index`, read through `read` chunk by chunk, each chunk checked
/// against its CRC-32C; throws RuntimeError(errors::runtime_checkpoint) naming `file`, the piece and the chunk.
inline torch::Tensor read_piece_range(const PieceIndex& index, const RegionReader& read, std::int64_t id,
                                      std::int64_t begin, std::int64_t length, const std::string& file) {
  const auto span = piece_span(index, id, begin, length, file);
  const auto& piece = index.pieces[static_cast<std::size_t>(id)];
  auto bytes = torch::empty({span.to - span.from}, torch::kUInt8);
  read_checked_chunks(index, id, span, read, bytes.data_ptr<std::uint8_t>(), file);
  return bytes.view(piece_scalar_types[piece.dtype]).narrow(0, span.skip, length);
}

}  // namespace detail
}  // namespace hpctrain
