#pragma once
// Checkpoints (docs/seams.md): one directory per step, `checkpoints/step-<10 digits>/`, holding `meta.json`
// (where the run stands — step, epoch, position in the epoch, seed — and who wrote it: world size,
// strategy, the files with their sizes and CRC-32C) and `rank-<5 digits>.hpct` archives: rank 0's alone for
// a replicated strategy, one per rank for a sharded one. The schedule is a pure function of the step and
// the RNG is re-seeded from (seed, rank, step) every step, so step and seed restore both exactly.
//
// An archive file: a 32-byte header — magic "HPCTCKPT", format version (u32), CRC-32C of the payload
// (u32), payload size (u64), step (u64), little-endian — then the payload, a LibTorch archive written by
// the strategy. Atomic per checkpoint: the ranks write into `step-N.tmp/`, rank 0 writes `meta.json` last
// and renames the directory; a crash leaves either the old set or the new one. The newest directory whose
// meta.json parses and whose files pass the size and CRC checks wins; a torn or corrupt one is skipped
// with a warning, and the previous one is used. In a run of several ranks no rank reads every archive to
// decide that: each verifies its share (verify_share: archive i is rank i mod world's, its own at the same
// world size) and the ranks agree (train/checkpointing.hpp).
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

#include <hpctrain/error.hpp>
#include <hpctrain/job/files.hpp>  // write_file_atomically, remove_tree
#include <hpctrain/train/checkpoint_format.hpp>  // meta.json and the archive header, checked before LibTorch reads
#include <hpctrain/train/crc32c.hpp>
#include <hpctrain/train/strategy.hpp>  // SavedStrategyState

namespace hpctrain {

namespace detail {
inline std::string checkpoint_dir_name(std::int64_t step) { return fmt::format("step-{:010d}", step); }
inline std::string checkpoint_rank_file(int rank) { return fmt::format("rank-{:05d}.hpct", rank); }

/// Step number of a committed checkpoint directory name (`step-<10 digits>`), or nullopt if it is not one.
inline std::optional<std::int64_t> checkpoint_step(const std::filesystem::path& path) {
  const std::string name = path.filename().string();
  if (name.size() != 15 || name.rfind("step-", 0) != 0) return std::nullopt;
  const std::string digits = name.substr(5);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  return std::stoll(digits);
}

/// The archive's bytes behind room for the 32-byte header, which seal_archive fills once its size and CRC are
/// known (no second copy of the archive). What a save must do while the tensors hold still: on a GPU this is
/// the device-to-host copy; the rest (seal, write) may run beside the next steps.
inline std::string serialize_archive(torch::serialize::OutputArchive& archive) {
  std::string bytes(checkpoint_header_size, '\0');
  archive.save_to([&](const void* data, std::size_t size) {
    bytes.append(static_cast<const char*>(data), size);
    return size;
  });
  return bytes;
}

/// Fills the header of serialize_archive's `bytes` (payload CRC-32C and size, step); returns meta.json's entry.
inline CheckpointFile seal_archive(std::string& bytes, std::int64_t step, int rank) {
  const std::string_view payload(bytes.data() + checkpoint_header_size, bytes.size() - checkpoint_header_size);
  const std::uint32_t crc = crc32c(payload);
  const std::uint64_t size = payload.size();
  const auto step_u = static_cast<std::uint64_t>(step);
  std::memcpy(bytes.data(), checkpoint_magic, 8);
  std::memcpy(bytes.data() + 8, &checkpoint_format, 4);
  std::memcpy(bytes.data() + 12, &crc, 4);
  std::memcpy(bytes.data() + 16, &size, 8);
  std::memcpy(bytes.data() + 24, &step_u, 8);
  return {checkpoint_rank_file(rank), bytes.size(), crc32c(bytes)};
}

/// Checks the `bytes` read from `path` against meta.json's entry (size, CRC-32C); throws RuntimeError("checkpoint")
/// naming the file and the defect.
inline void check_against_meta(const std::filesystem::path& path, std::string_view bytes, const CheckpointFile& expected) {
  if (bytes.size() != expected.size)
    throw RuntimeError("checkpoint", fmt::format("{}: truncated: {} of {} bytes (meta.json)", path.string(), bytes.size(), expected.size));
  if (crc32c(bytes) != expected.crc) throw RuntimeError("checkpoint", fmt::format("{}: corrupt: CRC-32C does not match meta.json", path.string()));
}

/// Reads `path` and checks it against meta.json's entry; returns the bytes.
inline std::string read_verified_file(const std::filesystem::path& path, const CheckpointFile& expected) {
  auto bytes = hpctrain::detail::read_file(path, errors::runtime_checkpoint);
  check_against_meta(path, bytes, expected);
  return bytes;
}

/// Verifies a framed archive read from `path` against its header and meta.json's entry; returns the archive.
inline torch::serialize::InputArchive unframe_archive(const std::filesystem::path& path, const std::string& bytes,
                                                      const CheckpointFile& expected) {
  check_against_meta(path, bytes, expected);
  // The header: checkpoint_format.hpp (torch-free, fuzzed by tests/fuzz/checkpoint_header_fuzz.cpp).
  const std::string_view payload = verify_checkpoint(bytes, path).payload;
  torch::serialize::InputArchive archive;
  archive.load_from(payload.data(), payload.size());  // deserialises eagerly: `bytes` may go after this
  return archive;
}

inline void fsync_directory(const std::filesystem::path& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}
}  // namespace detail

/// A committed checkpoint directory and its meta.json.
struct SavedCheckpoint {
  std::filesystem::path directory;
  CheckpointMeta meta;
  /// Archives already read and verified (verify_share keeps the one its rank opens next): opened from
  /// memory once, not read from the file system a second time.
  std::shared_ptr<std::map<std::string, std::string>> verified = std::make_shared<std::map<std::string, std::string>>();

  /// What a strategy's `load` reads: `open(r)` verifies rank r's file (size and CRC against meta.json, then
  /// its own header) and returns its archive; throws RuntimeError("checkpoint") naming the file.
  SavedStrategyState strategy_state() const {
    SavedStrategyState saved;
    saved.world_size = meta.world_size;
    saved.strategy = meta.strategy;
    saved.open = [directory = directory, files = meta.files, verified = verified](int rank) {
      const auto name = detail::checkpoint_rank_file(rank);
      const auto found = std::find_if(files.begin(), files.end(), [&](const CheckpointFile& f) { return f.name == name; });
      if (found == files.end())
        throw RuntimeError("checkpoint", fmt::format("{}: meta.json lists no archive of rank {}", directory.string(), rank));
      const auto path = directory / name;
      std::string bytes;
      if (const auto kept = verified->find(name); kept != verified->end()) {
        bytes = std::move(kept->second);  // the memory goes with the archive, as a fresh read's would
        verified->erase(kept);
      } else {
        bytes = hpctrain::detail::read_file(path, errors::runtime_checkpoint);
      }
      return detail::unframe_archive(path, bytes, *found);
    };
    return saved;
  }
};

/// The checkpoints of one run: a directory of `step-<N>/` directories, the newest `keep` kept.
class CheckpointStore {
 public:
  /// `directory` is created on the first save; `keep` >= 1.
  explicit CheckpointStore(std::filesystem::path directory, int keep = 3) : directory_(std::move(directory)), keep_(keep) {
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
  std::filesystem::path staging(std::int64_t step) const { return directory_ / (detail::checkpoint_dir_name(step) + ".tmp"); }

  /// Rank 0, before any rank writes: removes what an interrupted earlier attempt left in the staging directory.
  void prepare(std::int64_t step) const {
    detail::remove_tree(staging(step));
    std::filesystem::create_directories(staging(step));
  }

  /// Writes rank `rank`'s archive of checkpoint `step` into the staging directory; returns its entry for meta.json.
  CheckpointFile write_rank(std::int64_t step, int rank, torch::serialize::OutputArchive& archive) const {
    return write_serialized(step, rank, detail::serialize_archive(archive));
  }

  /// write_rank from detail::serialize_archive's bytes (sealed here): the part of a save that may run in the
  /// background. Throws RuntimeError("checkpoint") naming the file and the reason (a full disk, a quota).
  CheckpointFile write_serialized(std::int64_t step, int rank, std::string bytes) const {
    const auto file = detail::seal_archive(bytes, step, rank);
    std::filesystem::create_directories(staging(step));
    detail::write_file_atomically(staging(step) / file.name, bytes, "checkpoint");
    return file;
  }

  /// Rank 0, after every rank has written: writes meta.json last, renames the staging directory to
  /// `step-<N>/` (replacing an invalid one of that step), then keeps only the newest `keep`; returns its path.
  std::filesystem::path commit(const CheckpointMeta& meta) const {
    const auto staged = staging(meta.state.step);
    detail::write_file_atomically(staged / "meta.json", meta.to_json().dump(2) + "\n", "checkpoint");
    const auto final_path = directory_ / detail::checkpoint_dir_name(meta.state.step);
    detail::remove_tree(final_path);
    std::error_code ec;
    std::filesystem::rename(staged, final_path, ec);
    if (ec) throw RuntimeError("checkpoint", fmt::format("cannot rename {} to {}: {}", staged.string(), final_path.string(), ec.message()));
    detail::fsync_directory(directory_);
    prune();
    return final_path;
  }

  /// Reads and verifies checkpoint `directory`: meta.json and every file it lists (size, CRC-32C).
  /// Throws RuntimeError("checkpoint") naming the file and the defect.
  SavedCheckpoint verify(const std::filesystem::path& directory) const { return verify_share(read(directory), 0, 1); }

  /// Rank `rank`'s share of verifying `saved` in a world of `world` ranks: the archives listed i-th with
  /// i mod world == rank (its own archive `rank-<rank>`, at the same world size), size and CRC-32C against
  /// meta.json; every archive is someone's, once. Its own archive's bytes are kept for the load that follows.
  /// Throws RuntimeError("checkpoint") naming the file and the defect.
  SavedCheckpoint verify_share(SavedCheckpoint saved, int rank, int world) const {
    const auto own = detail::checkpoint_rank_file(rank);
    for (std::size_t i = static_cast<std::size_t>(rank); i < saved.meta.files.size(); i += static_cast<std::size_t>(world)) {
      const auto& file = saved.meta.files[i];
      auto bytes = detail::read_verified_file(saved.directory / file.name, file);
      if (file.name == own) (*saved.verified)[file.name] = std::move(bytes);
    }
    return saved;
  }

  /// Reads checkpoint `directory`'s meta.json only (its files are verified when opened).
  SavedCheckpoint read(const std::filesystem::path& directory) const {
    const auto meta_path = directory / "meta.json";
    const auto text = hpctrain::detail::read_file_if_present(meta_path, errors::runtime_checkpoint);
    if (!text) throw RuntimeError("checkpoint", fmt::format("{}: missing (the checkpoint was not committed)", meta_path.string()));
    return {directory, detail::parse_checkpoint_meta(*text, meta_path)};
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
