#pragma once
// CRC-32C (Castagnoli), the checksum TFRecord framing requires and the one our checkpoints carry.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace hpctrain::detail {

inline const std::array<std::uint32_t, 256>& crc32c_table() {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected polynomial
      t[i] = c;
    }
    return t;
  }();
  return table;
}

/// CRC-32C of `size` bytes, continuing from `crc` (0 to start).
inline std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc = 0) {
  const auto& table = crc32c_table();
  const auto* bytes = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (std::size_t i = 0; i < size; ++i) crc = table[(crc ^ bytes[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

inline std::uint32_t crc32c(std::string_view bytes) { return crc32c(bytes.data(), bytes.size()); }

/// TFRecord's masked CRC: a CRC of data that itself contains CRCs is weak, so TensorFlow rotates and offsets it.
inline std::uint32_t masked_crc32c(const void* data, std::size_t size) {
  const std::uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

}  // namespace hpctrain::detail
