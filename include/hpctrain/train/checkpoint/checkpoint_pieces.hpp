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

/// The pieces region of one rank's file as a save holds it until the file is written: each piece's elements in host
/// memory, flat and contiguous, in the region's order, with the region's size and CRC-32C.
struct PieceRegion {
  std::vector<torch::Tensor> pieces;
  std::uint64_t size = 0;
  std::uint32_t crc = 0;  ///< of the region's bytes, combined from the pieces' chunk CRCs (not read again)

  bool empty() const { return pieces.empty(); }
  /// The bytes of piece `k`, as the file holds them.
  std::string_view bytes(std::size_t k) const {
    return {static_cast<const char*>(pieces[k].data_ptr()), pieces[k].nbytes()};
  }
};

/// The save side: a strategy adds its flat tensors and records the ids in its archive. No piece is appended to a
/// growing buffer: each is held as a host tensor until the file is written from it, and checksummed chunk by chunk
/// as it is taken (the copy and the CRC of a chunk while it is in cache).
class PieceWriter {
 public:
  /// Bytes covered by one CRC-32C: what a read of a few elements costs at most beyond them, on each side.
  static constexpr std::int64_t chunk_bytes = std::int64_t{1} << 20;
  static_assert(chunk_bytes <= detail::max_chunk_bytes, "the readers refuse a larger chunk");

  /// How add() holds a tensor in host memory until the file is written. `copy`: a snapshot (an asynchronous save,
  /// whose steps go on and change the tensors). `reference`: the tensor itself, no copy (a synchronous save, which
  /// writes the file before training changes anything). A GPU tensor is copied either way, into pinned host
  /// memory (at the link's speed; LibTorch's caching host allocator reuses those buffers from one save to the next).
  enum class Hold { copy, reference };

  PieceWriter() = default;
  explicit PieceWriter(Hold hold) : hold_(hold) {}

  /// Takes `tensor`'s elements, flattened, as Hold says; returns its id in this rank's file.
  std::int64_t add(const torch::Tensor& tensor) {
    const auto flat = tensor.detach().reshape({-1});
    const auto& types = detail::piece_scalar_types;
    const auto found = std::find(types.begin(), types.end(), flat.scalar_type());
    if (found == types.end())
      throw RuntimeError(errors::runtime_checkpoint,
                         fmt::format("a checkpoint piece of dtype {} cannot be saved (float32, float64, "
                                     "bfloat16, float16, int64 and int32 can)",
                                     c10::toString(flat.scalar_type())));
    auto [host, crcs] = take(flat);
    const auto offset = static_cast<std::int64_t>(region_.size);
    pieces_.push_back(
        {{"dtype", std::string(detail::piece_dtypes[static_cast<std::size_t>(found - types.begin())].name)},
         {"numel", host.numel()},
         {"offset", offset},
         {"crc32c", std::move(crcs)}});
    region_.pieces.push_back(host);
    region_.size += host.nbytes();
    return static_cast<std::int64_t>(pieces_.size()) - 1;
  }

  bool empty() const { return pieces_.empty(); }
  /// The region as it stands.
  const PieceRegion& region() const { return region_; }
  /// Hands the region over (to the file's writer), leaving the writer empty of it.
  PieceRegion release_region() { return std::exchange(region_, {}); }
  /// The index the checkpoint layer writes into the archive.
  nlohmann::json index() const {
    return {{"format", 1}, {"chunk_bytes", chunk_bytes}, {"size", region_.size}, {"pieces", pieces_}};
  }

 private:
  /// `flat`'s elements in host memory as Hold says, and the CRC-32C of each chunk of their bytes (folded into the
  /// region's CRC).
  std::pair<torch::Tensor, nlohmann::json> take(const torch::Tensor& flat) {
    torch::Tensor host;
    bool copy_here = false;  // a snapshot of a CPU tensor: copied below, chunk by chunk beside its CRC
    if (flat.is_cuda()) {
      host = torch::empty({flat.numel()}, flat.options().device(torch::kCPU).pinned_memory(true));
      host.copy_(flat);
    } else if (!flat.is_cpu()) {
      host = flat.to(torch::kCPU);
    } else if (hold_ == Hold::reference || !flat.is_contiguous()) {
      host = flat.contiguous();  // the tensor itself; a copy only where it was not contiguous
    } else {
      host = torch::empty({flat.numel()}, flat.options());
      copy_here = true;
    }
    const auto* from = static_cast<const char*>(flat.data_ptr());
    auto* to = static_cast<char*>(host.data_ptr());
    const auto size = static_cast<std::int64_t>(host.nbytes());
    nlohmann::json crcs = nlohmann::json::array();
    for (std::int64_t at = 0; at < size; at += chunk_bytes) {
      const auto length = static_cast<std::size_t>(std::min(chunk_bytes, size - at));
      if (copy_here) std::memcpy(to + at, from + at, length);
      const auto crc = detail::crc32c(to + at, length);
      crcs.push_back(crc);
      region_.crc = detail::crc32c_combine(region_.crc, crc, length);
    }
    return {host, std::move(crcs)};
  }

  Hold hold_ = Hold::copy;
  PieceRegion region_;
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
