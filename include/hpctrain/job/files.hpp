#pragma once
// File operations that must never leave half a file behind (job scripts, job records, checkpoints), and a
// tree removal that is safe in binaries linking LibTorch.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include <fcntl.h>   // open/fsync: the data is durable before a rename makes it visible
#include <ftw.h>     // nftw: see remove_tree
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

/// Writes the concatenation of `parts` to `path` atomically and durably: a temporary beside it, fsync,
/// rename, fsync of the directory. A crash leaves either the old file or the new one, never a mix;
/// `what` is the RuntimeError id on failure.
inline void write_file_atomically(const std::filesystem::path& path, std::initializer_list<std::string_view> parts,
                                  ErrorId what = errors::runtime_io) {
  const auto directory = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  const auto temporary = directory / fmt::format(".{}.tmp.{}", path.filename().string(), ::getpid());
  std::FILE* file = std::fopen(temporary.c_str(), "wb");
  if (file == nullptr) throw RuntimeError(what, fmt::format("cannot write {}", temporary.string()));
  // The first failure's errno goes into the message: a full disk (ENOSPC), a quota (EDQUOT) or a file size
  // limit (EFBIG) must be told apart from a permission problem (tests/faults/checkpoint_faults_test.sh).
  int error_number = 0;
  const auto check = [&](bool step_ok) {
    if (!step_ok && error_number == 0) error_number = errno != 0 ? errno : EIO;
    return step_ok;
  };
  bool ok = true;
  for (const auto part : parts) ok = ok && check(std::fwrite(part.data(), 1, part.size(), file) == part.size());
  ok = check(std::fflush(file) == 0) && ok && check(::fsync(::fileno(file)) == 0);
  ok = check(std::fclose(file) == 0) && ok;
  if (!ok) {
    std::remove(temporary.c_str());
    throw RuntimeError(what, fmt::format("cannot write {}: {}", temporary.string(), std::strerror(error_number)));
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::remove(temporary.c_str());
    throw RuntimeError(what, fmt::format("cannot rename {} to {}: {}", temporary.string(), path.string(), error.message()));
  }
  fsync_path(directory, O_RDONLY | O_DIRECTORY, what);
}

/// Completes a file written through `file` under the name `temporary`: flush, fsync, close, and rename it to
/// `target`, so that `target` is either absent or whole. On failure the temporary is removed and RuntimeError(`what`)
/// names the target. `file` is closed (null) either way.
inline void commit_written_file(std::FILE*& file, const std::filesystem::path& temporary, const std::filesystem::path& target,
                                ErrorId what) {
  bool ok = std::fflush(file) == 0 && ::fsync(::fileno(file)) == 0;
  ok = (std::fclose(file) == 0) && ok;
  file = nullptr;
  std::error_code error;
  if (ok) std::filesystem::rename(temporary, target, error);
  if (!ok || error) {
    std::remove(temporary.c_str());
    throw RuntimeError(what, fmt::format("cannot write {}", target.string()));
  }
}

/// Writes `content` to `path` atomically and durably (see above).
inline void write_file_atomically(const std::filesystem::path& path, std::string_view content,
                                  ErrorId what = errors::runtime_io) {
  write_file_atomically(path, {content}, what);
}

/// The whole of `file`, or nothing when it does not exist. RuntimeError `what` naming the file and the reason
/// (permission, a directory, an I/O error) when it exists but cannot be read. The one place hpctrain reads a
/// whole file.
inline std::optional<std::string> read_file_if_present(const std::filesystem::path& file, ErrorId what = errors::runtime_io) {
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
  if (error_number != 0) throw RuntimeError(what, fmt::format("{}: cannot read: {}", file.string(), std::strerror(error_number)));
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
