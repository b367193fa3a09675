#pragma once
// Checkpoints (docs/seams.md): one directory per step, `checkpoints/step-<10 digits>/`, holding `meta.json`
// (where the run stands — step, epoch, position in the epoch, seed — and who wrote it: world size,
// strategy, the files with their sizes and CRC-32C) and `rank-<5 digits>.hpct` archives: rank 0's alone for
// a replicated strategy, one per rank for a sharded one. The schedule is a pure function of the step and
// the RNG is re-seeded from (seed, rank, step) every step, so step and seed restore both exactly.
//
// An archive file: a 32-byte header — magic "HPCTCKPT", format version (u32), CRC-32C of the payload
// (u32), payload size (u64), step (u64), little-endian — then the payload, a LibTorch archive written by
// the strategy; in format 2 the strategy's pieces follow it (flat tensors read by byte ranges, each chunk
// with its CRC-32C: train/checkpoint/checkpoint_pieces.hpp), so that a rank resharding reads only what overlaps its
// new shards. meta.json's CRC-32C covers the whole file. Atomic per checkpoint: the ranks write into `step-N.tmp/`,
// rank 0 writes `meta.json` last and renames the directory; a crash leaves either the old set or the new one. The
// newest directory whose meta.json parses and whose files pass the size and CRC checks wins; a torn or corrupt one is
// skipped with a warning, and the previous one is used. In a run of several ranks no rank reads every archive to decide
// that: each verifies its share (verify_share: archive i is rank i mod world's, its own at the same world size) and the
// ranks agree (train/checkpoint/checkpointing.hpp).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/serialize/archive.h>

#include <hpctrain/checksums.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/files.hpp>                               // write_file_atomically, remove_tree
#include <hpctrain/train/checkpoint/checkpoint_format.hpp>  // meta.json and the archive header, checked before LibTorch reads
#include <hpctrain/train/checkpoint/checkpoint_pieces.hpp>
#include <hpctrain/train/checkpoint/checkpoint_reader.hpp>
#include <hpctrain/train/strategies/strategy.hpp>  // SavedStrategyState

namespace hpctrain {

namespace detail {
inline std::string checkpoint_dir_name(std::int64_t step) { return fmt::format("step-{:010d}", step); }

/// Step number of a committed checkpoint directory name (`step-<10 digits>`), or nullopt if it is not one.
inline std::optional<std::int64_t> checkpoint_step(const std::filesystem::path& path) {
  const std::string name = path.filename().string();
  if (name.size() != 15 || name.rfind("step-", 0) != 0) return std::nullopt;
  const std::string digits = name.substr(5);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  return std::stoll(digits);
}

/// One rank's checkpoint file in memory, as a save snapshots it: the header's room and the archive, then the pieces
/// region (PieceWriter's host tensors, not copied again: the file is written from them).
struct SerializedCheckpoint {
  std::string framed;  ///< 32 bytes for the header (seal_archive fills them), then the LibTorch archive
  PieceRegion pieces;  ///< the pieces region; empty: a format-1 file
};

/// The archive's bytes behind room for the 32-byte header, which seal_archive fills once its size and CRC are
/// known (no second copy of the archive), and `pieces`' region, whose index goes into the archive first. What a
/// save must do while the tensors hold still: on a GPU this is the device-to-host copy; the rest (seal, write) may
/// run beside the next steps.
inline SerializedCheckpoint serialize_archive(torch::serialize::OutputArchive& archive, PieceWriter pieces = {}) {
  SerializedCheckpoint serialized;
  if (!pieces.empty()) archive.write(checkpoint_pieces_key, c10::IValue(pieces.index().dump()));
  serialized.framed.assign(checkpoint_header_size, '\0');
  archive.save_to([&](const void* data, std::size_t size) {
    serialized.framed.append(static_cast<const char*>(data), size);
    return size;
  });
  serialized.pieces = pieces.release_region();
  return serialized;
}

/// Fills the header of serialize_archive's bytes (payload CRC-32C and size, step; format 2 when pieces follow);
/// returns meta.json's entry (the CRC-32C of the whole file).
inline CheckpointFile seal_archive(SerializedCheckpoint& serialized, std::int64_t step, int rank) {
  auto& bytes = serialized.framed;
  const std::string_view payload(bytes.data() + checkpoint_header_size, bytes.size() - checkpoint_header_size);
  const std::uint32_t crc = crc32c(payload);
  const std::uint64_t size = payload.size();
  const auto step_u = static_cast<std::uint64_t>(step);
  const auto format = serialized.pieces.empty() ? checkpoint_format : checkpoint_format_with_pieces;
  std::memcpy(bytes.data(), checkpoint_magic, 8);
  std::memcpy(bytes.data() + 8, &format, 4);
  std::memcpy(bytes.data() + 12, &crc, 4);
  std::memcpy(bytes.data() + 16, &size, 8);
  std::memcpy(bytes.data() + 24, &step_u, 8);
  const auto& region = serialized.pieces;
  const auto whole = crc32c_combine(crc32c(bytes), region.crc, region.size);
  return {checkpoint_rank_file(rank), bytes.size() + region.size, whole};
}

/// Writes a sealed checkpoint file to `path` atomically (temporary name, fsync, rename).
inline void write_sealed(const std::filesystem::path& path, const SerializedCheckpoint& serialized) {
  std::vector<std::string_view> parts{serialized.framed};
  for (std::size_t k = 0; k < serialized.pieces.pieces.size(); ++k) parts.push_back(serialized.pieces.bytes(k));
  write_file_atomically(path, parts, errors::runtime_checkpoint);
}

inline void fsync_directory(const std::filesystem::path& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}
/// `files` as a strategy's load reads them (SavedCheckpoint::strategy_state), written by `world_size` ranks with
/// `strategy`: its messages name the files.
inline SavedStrategyState saved_strategy_state(std::shared_ptr<CheckpointFiles> files, int world_size,
                                               std::string strategy) {
  SavedStrategyState saved;
  saved.world_size = world_size;
  saved.strategy = std::move(strategy);
  saved.open = [files](int rank) { return files->open(rank); };
  saved.read_piece = [files](int rank, std::int64_t piece, std::int64_t begin, std::int64_t length) {
    return files->read_piece(rank, piece, begin, length);
  };
  saved.file = [files](int rank) { return files->path(rank).string(); };
  return saved;
}
}  // namespace detail

/// A committed checkpoint directory and its meta.json.
struct SavedCheckpoint {
  std::filesystem::path directory;
  CheckpointMeta meta;
  /// Its rank files as a load reads them; what verify_share or verify read of them is kept there, not read again.
  std::shared_ptr<detail::CheckpointFiles> files;

  /// What a strategy's `load` reads: `open(r)` verifies rank r's file (size and CRC against meta.json when read
  /// whole, its own header and the archive's CRC) and returns its archive; `read_piece` reads element ranges of
  /// its pieces, each chunk checked against its CRC. Both throw RuntimeError(errors::runtime_checkpoint) naming the
  /// file.
  SavedStrategyState strategy_state() const {
    return detail::saved_strategy_state(files, meta.world_size, meta.strategy);
  }
};

/// The checkpoints of one run: a directory of `step-<N>/` directories, the newest `keep` kept.
class CheckpointStore {
 public:
  /// `directory` is created on the first save; `keep` >= 1.
  explicit CheckpointStore(std::filesystem::path directory, int keep = 3)
      : directory_(std::move(directory)), keep_(keep) {
    detail::require(keep >= 1, "training.keep_checkpoints", keep, "must be at least 1");
  }

  /// Committed checkpoint directories (valid or not), oldest first.
  std::vector<std::filesystem::path> list() const {
    std::vector<std::pair<std::int64_t, std::filesystem::path>> found;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(directory_, ec))
      if (auto step = detail::checkpoint_step(entry.path())) found.emplace_back(*step, entry.path());
    std::sort(found.begin(), found.end());
    std::vector<std::filesystem::path> paths;
    for (auto& [step, path] : found) paths.push_back(path);
    return paths;
  }

  /// Where the ranks write checkpoint `step` before it is committed.
  std::filesystem::path staging(std::int64_t step) const {
    return directory_ / (detail::checkpoint_dir_name(step) + ".tmp");
  }

  /// Rank 0, before any rank writes: removes what an interrupted earlier attempt left in the staging directory.
  void prepare(std::int64_t step) const {
    detail::remove_tree(staging(step));
    std::filesystem::create_directories(staging(step));
  }

  /// Writes rank `rank`'s archive of checkpoint `step` into the staging directory; returns its entry for meta.json.
  /// `pieces`: the flat tensors written after the archive (DataParallelStrategy::save).
  CheckpointFile write_rank(std::int64_t step, int rank, torch::serialize::OutputArchive& archive,
                            PieceWriter pieces = {}) const {
    return write_serialized(step, rank, detail::serialize_archive(archive, std::move(pieces)));
  }

  /// write_rank from detail::serialize_archive's bytes (sealed here): the part of a save that may run in the
  /// background. Throws RuntimeError(errors::runtime_checkpoint) naming the file and the reason (a full disk, a quota).
  CheckpointFile write_serialized(std::int64_t step, int rank, detail::SerializedCheckpoint serialized) const {
    const auto file = detail::seal_archive(serialized, step, rank);
    std::filesystem::create_directories(staging(step));
    detail::write_sealed(staging(step) / file.name, serialized);
    return file;
  }

  /// Rank 0, after every rank has written: writes meta.json last, renames the staging directory to
  /// `step-<N>/` (replacing an invalid one of that step), then keeps only the newest `keep`; returns its path.
  std::filesystem::path commit(const CheckpointMeta& meta) const {
    const auto staged = staging(meta.state.step);
    detail::write_file_atomically(staged / "meta.json", meta.to_json().dump(2) + "\n", errors::runtime_checkpoint);
    const auto final_path = directory_ / detail::checkpoint_dir_name(meta.state.step);
    detail::remove_tree(final_path);
    std::error_code ec;
    std::filesystem::rename(staged, final_path, ec);
    if (ec)
      throw RuntimeError(errors::runtime_checkpoint,
                         fmt::format("cannot rename {} to {}: {}", staged.string(), final_path.string(), ec.message()));
    detail::fsync_directory(directory_);
    prune();
    return final_path;
  }

  /// Reads and verifies checkpoint `directory`: meta.json and every file it lists, whole (size, CRC-32C).
  /// Throws RuntimeError(errors::runtime_checkpoint) naming the file and the defect.
  SavedCheckpoint verify(const std::filesystem::path& directory) const {
    auto saved = read(directory);
    for (const auto& file : saved.meta.files) {
      auto bytes = detail::read_verified_file(saved.directory / file.name, file);
      if (file.name == detail::checkpoint_rank_file(0)) saved.files->keep(file.name, std::move(bytes));
    }
    return saved;
  }

  /// Rank `rank`'s share of verifying `saved` in a world of `world` ranks: the archives listed i-th with
  /// i mod world == rank; every archive is someone's, once. Each is checked without its pieces region: its size
  /// against meta.json, its header and its archive's CRC-32C (a format-1 file, which has no such region, whole against
  /// meta.json); each piece's chunks are checked by the rank that reads them, as it reads them into the load's
  /// staging (no copy of the file in memory beside it). At the same world size a rank's share is its own file, whose
  /// archive is kept for the load that follows.
  /// Throws RuntimeError(errors::runtime_checkpoint) naming the file and the defect.
  SavedCheckpoint verify_share(SavedCheckpoint saved, int rank, int world) const {
    const auto own = detail::checkpoint_rank_file(rank);
    for (std::size_t i = static_cast<std::size_t>(rank); i < saved.meta.files.size();
         i += static_cast<std::size_t>(world)) {
      const auto& file = saved.meta.files[i];
      auto [bytes, size] = detail::read_checked_archive(saved.directory / file.name, &file);
      if (file.name == own && world == saved.meta.world_size) saved.files->keep(file.name, std::move(bytes), size);
    }
    return saved;
  }

  /// Reads checkpoint `directory`'s meta.json only (its files are verified when opened).
  SavedCheckpoint read(const std::filesystem::path& directory) const {
    const auto meta_path = directory / "meta.json";
    const auto text = hpctrain::detail::read_file_if_present(meta_path, errors::runtime_checkpoint);
    if (!text)
      throw RuntimeError(errors::runtime_checkpoint,
                         fmt::format("{}: missing (the checkpoint was not committed)", meta_path.string()));
    SavedCheckpoint saved{directory, detail::parse_checkpoint_meta(*text, meta_path), nullptr};
    saved.files = std::make_shared<detail::CheckpointFiles>(directory, saved.meta.files);
    return saved;
  }

  /// The newest valid checkpoint; each invalid newer one is skipped with a message to `warn`. nullopt when
  /// there is none (a fresh run).
  std::optional<SavedCheckpoint> latest(const std::function<void(const std::string&)>& warn) const {
    auto all = list();
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      try {
        return verify(*it);
      } catch (const RuntimeError& error) {
        warn(fmt::format("warning: skipping checkpoint: {}", error.what()));
      }
    }
    return std::nullopt;
  }

  /// The directory holding the checkpoints.
  const std::filesystem::path& directory() const { return directory_; }

 private:
  /// Keeps the newest `keep` committed checkpoints; removes staging directories that interrupted saves left.
  void prune() const {
    auto all = list();
    for (std::size_t i = 0; i + static_cast<std::size_t>(keep_) < all.size(); ++i) detail::remove_tree(all[i]);
    std::vector<std::filesystem::path> leftovers;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(directory_, ec))
      if (entry.path().extension() == ".tmp") leftovers.push_back(entry.path());
    for (const auto& path : leftovers) detail::remove_tree(path);
  }

  std::filesystem::path directory_;
  int keep_;
};

}  // namespace hpctrain
