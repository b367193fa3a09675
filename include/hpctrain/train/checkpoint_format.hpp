#pragma once
// The 32-byte header of an hpctrain checkpoint archive, checked without LibTorch so that tests/fuzz can
// fuzz it: magic "HPCTCKPT", format version (u32), CRC-32C of the payload (u32), payload size (u64),
// step (u64), little-endian; the payload (a LibTorch archive) follows. Nothing reaches LibTorch's reader
// unless the size and the CRC match.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/train/crc32c.hpp>

namespace hpctrain {
namespace detail {
inline constexpr char checkpoint_magic[8] = {'H', 'P', 'C', 'T', 'C', 'K', 'P', 'T'};
inline constexpr std::uint32_t checkpoint_format = 1;
inline constexpr std::size_t checkpoint_header_size = 32;

template <class T>
T read_le(const char* p) {
  T value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

/// A checked archive: the payload (a view into the bytes given) and the step its header records.
struct CheckpointPayload {
  std::string_view payload;
  std::uint64_t step = 0;
};

/// Checks the header of a whole checkpoint file's `bytes`; throws RuntimeError("checkpoint") naming `path`
/// and the defect (truncated, bad magic, other format version, size or CRC mismatch).
inline CheckpointPayload verify_checkpoint(std::string_view bytes, const std::filesystem::path& path) {
  auto fail = [&](const std::string& why) { return RuntimeError("checkpoint", fmt::format("{}: {}", path.string(), why)); };
  if (bytes.size() < checkpoint_header_size)
    throw fail(fmt::format("truncated: {} bytes, shorter than the {}-byte header", bytes.size(), checkpoint_header_size));
  if (std::memcmp(bytes.data(), checkpoint_magic, 8) != 0) throw fail("not an hpctrain checkpoint (bad magic)");
  const auto format = read_le<std::uint32_t>(bytes.data() + 8);
  if (format != checkpoint_format) throw fail(fmt::format("format version {} is not {}", format, checkpoint_format));
  const auto crc = read_le<std::uint32_t>(bytes.data() + 12);
  const auto size = read_le<std::uint64_t>(bytes.data() + 16);
  if (bytes.size() - checkpoint_header_size != size)
    throw fail(fmt::format("truncated: payload has {} of {} bytes", bytes.size() - checkpoint_header_size, size));
  const std::string_view payload = bytes.substr(checkpoint_header_size);
  if (crc32c(payload.data(), payload.size()) != crc) throw fail("corrupt: CRC-32C of the payload does not match");
  return {payload, read_le<std::uint64_t>(bytes.data() + 24)};
}
}  // namespace detail
}  // namespace hpctrain
