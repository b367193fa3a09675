#pragma once
// File operations that must never leave half a file behind (job scripts, job records, checkpoints, token files,
// safetensors), reading a whole file, and a tree removal that is safe in binaries linking LibTorch.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <fcntl.h>  // open/fsync: the data is durable before a rename makes it visible
#include <ftw.h>    // nftw: see remove_tree
#include <unistd.h>

#include <fmt/format.h>

#include <hpctrain/error.hpp>

namespace hpctrain::detail {

/// fsyncs a file or (with O_DIRECTORY) a directory; `what` is the RuntimeError's id on failure.
inline void fsync_path(const std::filesystem::path& path, int flags, ErrorId what = errors::runtime_io) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) throw RuntimeError(what, fmt::format("cannot open {} to fsync", path.string()));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw RuntimeError(what, fmt::format("fsync {} failed", path.string()));
}

/// A file written under a temporary name beside `target` (`.<name>.tmp.<pid>`) and renamed over it by commit(),
/// which also makes it durable (fsync of the file, then of its directory): `target` is the old file or the whole
/// new one, never a mix. Destroyed uncommitted (an error unwound past it), it removes the temporary. Every failure
/// is a RuntimeError(`what`) naming the file and errno's reason: a full disk (ENOSPC), a quota (EDQUOT) or a file
/// size limit (EFBIG) must be told apart from a permission problem (tests/faults/checkpoint_faults_test.sh).
class StagedFile {
 public:
  StagedFile(std::filesystem::path target, ErrorId what) : target_(std::move(target)), what_(what) {
    directory_ = target_.has_parent_path() ? target_.parent_path() : std::filesystem::path(".");
    temporary_ = directory_ / fmt::format(".{}.tmp.{}", target_.filename().string(), ::getpid());
    file_ = std::fopen(temporary_.c_str(), "wb");
    if (file_ == nullptr) fail("cannot write", errno);
    std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
  }
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;
  ~StagedFile() {
    if (file_ == nullptr) return;
    std::fclose(file_);
    std::remove(temporary_.c_str());
  }

  void write(const void* data, std::size_t bytes) {
    if (bytes > 0 && std::fwrite(data, 1, bytes, file_) != bytes) fail("cannot write", errno);
  }
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  /// Writes `bytes` over the file's first bytes (a header completed once the rest is known); later writes follow them.
  void write_at_start(std::string_view bytes) {
    if (std::fseek(file_, 0, SEEK_SET) != 0) fail("cannot seek in", errno);
    write(bytes);
  }

  /// Flush, fsync, close, rename over the target, fsync of the directory.
  void commit() {
    if (std::fflush(file_) != 0 || ::fsync(::fileno(file_)) != 0) fail("cannot write", errno);
    const int closed = std::fclose(file_);
    file_ = nullptr;
    if (closed != 0) {
      const int error_number = errno;
      std::remove(temporary_.c_str());
      fail("cannot write", error_number);
    }
    std::error_code error;
    std::filesystem::rename(temporary_, target_, error);
    if (error) {
      std::remove(temporary_.c_str());
      throw RuntimeError(
          what_, fmt::format("cannot rename {} to {}: {}", temporary_.string(), target_.string(), error.message()));
    }
    fsync_path(directory_, O_RDONLY | O_DIRECTORY, what_);
  }

  const std::filesystem::path& target() const { return target_; }

 private:
  [[noreturn]] void fail(std::string_view doing, int error_number) const {
    throw RuntimeError(what_, fmt::format("{} {}: {}", doing, temporary_.string(),
                                          std::strerror(error_number != 0 ? error_number : EIO)));
  }

  std::filesystem::path target_, directory_, temporary_;
  ErrorId what_;
  std::FILE* file_ = nullptr;
};

/// Writes the concatenation of `parts` to `path` atomically and durably (a StagedFile).
inline void write_file_atomically(const std::filesystem::path& path, std::span<const std::string_view> parts,
                                  ErrorId what = errors::runtime_io) {
  StagedFile file(path, what);
  for (const auto part : parts) file.write(part);
  file.commit();
}
inline void write_file_atomically(const std::filesystem::path& path, std::initializer_list<std::string_view> parts,
                                  ErrorId what = errors::runtime_io) {
  write_file_atomically(path, std::span<const std::string_view>(parts.begin(), parts.size()), what);
}
inline void write_file_atomically(const std::filesystem::path& path, std::string_view content,
                                  ErrorId what = errors::runtime_io) {
  write_file_atomically(path, {content}, what);
}

/// The whole of `file`, or nothing when it does not exist. RuntimeError `what` naming the file and the reason
/// (permission, a directory, an I/O error) when it exists but cannot be read. The one place hpctrain reads a
/// whole file.
inline std::optional<std::string> read_file_if_present(const std::filesystem::path& file,
                                                       ErrorId what = errors::runtime_io) {
  std::FILE* stream = std::fopen(file.c_str(), "rb");
  if (stream == nullptr) {
    if (errno == ENOENT) return std::nullopt;
    throw RuntimeError(what, fmt::format("{}: cannot open: {}", file.string(), std::strerror(errno)));
  }
  std::string content;
  char buffer[1 << 16];
  std::size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof buffer, stream)) > 0) content.append(buffer, got);
  const int error_number = std::ferror(stream) ? (errno != 0 ? errno : EIO) : 0;
  std::fclose(stream);
  if (error_number != 0)
    throw RuntimeError(what, fmt::format("{}: cannot read: {}", file.string(), std::strerror(error_number)));
  return content;
}

/// The whole of `file`; RuntimeError `what` naming the file and the reason when it is missing or unreadable.
inline std::string read_file(const std::filesystem::path& file, ErrorId what = errors::runtime_io) {
  auto content = read_file_if_present(file, what);
  if (!content) throw RuntimeError(what, fmt::format("{}: cannot open: {}", file.string(), std::strerror(ENOENT)));
  return std::move(*content);
}

/// Removes a directory tree; missing is fine. Not std::filesystem::remove_all: the torch wheel's libtorch
/// exports its own copy of it, which crashes (SIGSEGV) when code built by GCC 12 calls it.
inline void remove_tree(const std::filesystem::path& path) noexcept {
  ::nftw(
      path.c_str(),
      [](const char* entry, const struct stat*, int, struct FTW*) {
        std::remove(entry);  // best effort: keep going, what cannot be removed stays
        return 0;
      },
      16, FTW_DEPTH | FTW_PHYS);
}

}  // namespace hpctrain::detail
