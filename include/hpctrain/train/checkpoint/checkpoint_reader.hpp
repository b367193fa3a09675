#pragma once
// Reading a checkpoint's rank files back (the layout: train/checkpoint/checkpoint.hpp). A file is checked before
// LibTorch or a strategy sees any of it: its size and CRC-32C against meta.json when it is read whole, else its header
// and the archive's own CRC-32C (format 2: the header, the archive and the file's size; the pieces region after it is
// read by byte ranges, each chunk checked against the CRC its index lists: train/checkpoint/checkpoint_pieces.hpp).
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <torch/serialize/archive.h>

#include <hpctrain/checksums.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/files.hpp>
#include <hpctrain/train/checkpoint/checkpoint_format.hpp>
#include <hpctrain/train/checkpoint/checkpoint_pieces.hpp>

namespace hpctrain::detail {

inline std::string checkpoint_rank_file(int rank) { return fmt::format("rank-{:05d}.hpct", rank); }
/// The archive key of a format-2 file's pieces index (train/checkpoint/checkpoint_pieces.hpp).
inline constexpr const char* checkpoint_pieces_key = "hpctrain_pieces";

/// Checks the `bytes` read from `path` against meta.json's entry (size, CRC-32C); throws
/// RuntimeError(errors::runtime_checkpoint) naming the file and the defect.
inline void check_against_meta(const std::filesystem::path& path, std::string_view bytes,
                               const CheckpointFile& expected) {
  if (bytes.size() != expected.size)
    throw RuntimeError(errors::runtime_checkpoint, fmt::format("{}: truncated: {} of {} bytes (meta.json)",
                                                               path.string(), bytes.size(), expected.size));
  if (crc32c(bytes) != expected.crc)
    throw RuntimeError(errors::runtime_checkpoint,
                       fmt::format("{}: corrupt: CRC-32C does not match meta.json", path.string()));
}

/// Reads `path` and checks it against meta.json's entry; returns the bytes.
inline std::string read_verified_file(const std::filesystem::path& path, const CheckpointFile& expected) {
  auto bytes = read_file(path, errors::runtime_checkpoint);
  check_against_meta(path, bytes, expected);
  return bytes;
}

/// An open file, closed on scope exit; pread()s byte ranges. Throws RuntimeError(errors::runtime_checkpoint) naming the
/// file.
class CheckpointFileHandle {
 public:
  explicit CheckpointFileHandle(const std::filesystem::path& path)
      : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) throw RuntimeError(errors::runtime_checkpoint, fmt::format("{}: cannot open", path.string()));
  }
  CheckpointFileHandle(const CheckpointFileHandle&) = delete;
  CheckpointFileHandle& operator=(const CheckpointFileHandle&) = delete;
  ~CheckpointFileHandle() { ::close(fd_); }

  std::uint64_t size() const {
    struct stat status {};
    if (::fstat(fd_, &status) != 0)
      throw RuntimeError(errors::runtime_checkpoint,
                         fmt::format("{}: cannot stat: {}", path_.string(), std::strerror(errno)));
    return static_cast<std::uint64_t>(status.st_size);
  }

  /// `size` bytes at `offset` into `into`; a file that ends before them is truncated.
  void read(std::uint64_t offset, std::uint64_t size, void* into) const {
    auto* to = static_cast<char*>(into);
    for (std::uint64_t done = 0; done < size;) {
      const auto got = ::pread(fd_, to + done, size - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0)
        throw RuntimeError(errors::runtime_checkpoint,
                           fmt::format("{}: cannot read: {}", path_.string(), std::strerror(errno)));
      if (got == 0)
        throw RuntimeError(errors::runtime_checkpoint, fmt::format("{}: truncated: it ends at byte {}, before byte {}",
                                                                   path_.string(), offset + done, offset + size));
      done += static_cast<std::uint64_t>(got);
    }
  }

 private:
  std::filesystem::path path_;
  int fd_;
};

/// The header and the archive of the checkpoint file `path`, checked: format 1 is read whole (and against meta.json's
/// `expected` entry, when there is one); format 2 only up to the end of its archive, the file's size checked against
/// `expected`. Returns those bytes and the file's size.
inline std::pair<std::string, std::uint64_t> read_checked_archive(const std::filesystem::path& path,
                                                                  const CheckpointFile* expected) {
  const CheckpointFileHandle file(path);
  const auto size = file.size();
  std::string bytes(std::min<std::uint64_t>(size, checkpoint_header_size), '\0');
  file.read(0, bytes.size(), bytes.data());
  const auto header = CheckpointHeader::parse(bytes, path);
  if (header.format == checkpoint_format) {
    bytes = read_file(path, errors::runtime_checkpoint);
    if (expected != nullptr) check_against_meta(path, bytes, *expected);
  } else {
    if (expected != nullptr && size != expected->size)
      throw RuntimeError(errors::runtime_checkpoint,
                         fmt::format("{}: truncated: {} of {} bytes (meta.json)", path.string(), size, expected->size));
    if (header.payload_size > size - checkpoint_header_size)
      throw RuntimeError(errors::runtime_checkpoint,
                         fmt::format("{}: truncated: payload has {} of {} bytes", path.string(),
                                     size - checkpoint_header_size, header.payload_size));
    bytes.resize(checkpoint_header_size + header.payload_size);
    file.read(checkpoint_header_size, header.payload_size, bytes.data() + checkpoint_header_size);
  }
  verify_checkpoint(bytes, path);  // the payload's CRC-32C
  return {std::move(bytes), size};
}

/// LibTorch's archive of a checked payload (deserialised eagerly: the bytes may go after this).
inline torch::serialize::InputArchive load_archive(std::string_view payload) {
  torch::serialize::InputArchive archive;
  archive.load_from(payload.data(), payload.size());
  return archive;
}

/// The rank files of one checkpoint directory as a strategy's load reads them: `open(r)` for rank r's archive,
/// `read_piece` for element ranges of its pieces. `listed`: meta.json's entries (null: no meta.json, the header's
/// checks alone). What verify_share or verify read of a file is kept (`keep`) and not read again.
class CheckpointFiles {
 public:
  CheckpointFiles(std::filesystem::path directory, std::optional<std::vector<CheckpointFile>> listed)
      : directory_(std::move(directory)), listed_(std::move(listed)) {}

  /// The first bytes of file `name` (of `file_size` in all), already checked: the whole file against meta.json, or
  /// its header and archive (read_checked_archive), whose pieces are then read from the file and checked by chunk.
  void keep(const std::string& name, std::string bytes, std::uint64_t file_size) {
    kept_[name] = Kept{std::move(bytes), file_size};
  }
  void keep(const std::string& name, std::string bytes) {
    const auto size = bytes.size();
    keep(name, std::move(bytes), size);
  }

  /// Rank `rank`'s file.
  std::filesystem::path path(int rank) const { return directory_ / checkpoint_rank_file(rank); }

  /// Rank `rank`'s archive, checked; throws RuntimeError(errors::runtime_checkpoint) naming the file and the defect.
  torch::serialize::InputArchive open(int rank) {
    const auto name = checkpoint_rank_file(rank);
    const auto path = this->path(rank);
    const CheckpointFile* expected = nullptr;
    if (listed_) {
      const auto found =
          std::find_if(listed_->begin(), listed_->end(), [&](const CheckpointFile& f) { return f.name == name; });
      if (found == listed_->end())
        throw RuntimeError(errors::runtime_checkpoint,
                           fmt::format("{}: meta.json lists no archive of rank {}", directory_.string(), rank));
      expected = &*found;
    }
    std::string read;
    std::uint64_t file_size = 0;
    const auto kept = kept_.find(name);
    if (kept == kept_.end()) std::tie(read, file_size) = read_checked_archive(path, expected);
    else file_size = kept->second.file_size;
    const std::string_view bytes = kept == kept_.end() ? std::string_view(read) : std::string_view(kept->second.bytes);
    const auto checked = verify_checkpoint(bytes, path);
    auto archive = load_archive(checked.payload);
    Opened opened;
    opened.region_offset = checkpoint_header_size + checked.payload.size();
    if (checked.format == checkpoint_format_with_pieces) {
      c10::IValue index;
      if (!archive.try_read(checkpoint_pieces_key, index) || !index.isString())
        throw RuntimeError(errors::runtime_checkpoint, fmt::format("{}: format 2 without the index of its pieces ({})",
                                                                   path.string(), checkpoint_pieces_key));
      opened.index = PieceIndex::parse(index.toStringRef(), static_cast<std::int64_t>(file_size - opened.region_offset),
                                       path.string());
    }
    opened_[rank] = std::move(opened);
    return archive;
  }

  /// Elements [begin, begin + length) of piece `id` of rank `rank`'s file (its archive opened first if it was not).
  torch::Tensor read_piece(int rank, std::int64_t id, std::int64_t begin, std::int64_t length) {
    if (opened_.find(rank) == opened_.end()) open(rank);
    const auto& opened = opened_.at(rank);
    const auto name = checkpoint_rank_file(rank);
    const auto path = directory_ / name;
    const auto kept = kept_.find(name);
    const bool whole = kept != kept_.end() && kept->second.bytes.size() == kept->second.file_size;
    std::optional<CheckpointFileHandle> file;
    if (!whole) file.emplace(path);
    const RegionReader read = [&](std::int64_t offset, std::int64_t size, void* into) {
      const auto at = opened.region_offset + static_cast<std::uint64_t>(offset);
      if (file) file->read(at, static_cast<std::uint64_t>(size), into);
      else std::memcpy(into, kept->second.bytes.data() + at, static_cast<std::size_t>(size));  // parse bounded it
    };
    return read_piece_range(opened.index, read, id, begin, length, path.string());
  }

 private:
  struct Opened {
    std::uint64_t region_offset = 0;
    PieceIndex index;  // empty for a format-1 file
  };
  std::filesystem::path directory_;
  std::optional<std::vector<CheckpointFile>> listed_;
  struct Kept {
    std::string bytes;  ///< the file's first bytes: all of them, or its header and archive
    std::uint64_t file_size = 0;
  };
  std::map<std::string, Kept> kept_;
  std::map<int, Opened> opened_;
};

}  // namespace hpctrain::detail
