#pragma once
// The checksums of the files hpctrain writes: CRC-32C (Castagnoli), which TFRecord framing requires and our
// checkpoints carry, and CRC-32 with zlib's polynomial, which W&B's transaction log carries. Checkpoints
// are checksummed whole when written and when read (gigabytes per rank at 8B), so the CRC uses the CPU's
// instruction where it has one — SSE 4.2's `crc32` on x86-64, the CRC extension on AArch64 — chosen at run
// time (the same binary runs on older nodes), and the byte table elsewhere. Measured in bench/crc32c_bench.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>  // _mm_crc32_u64, _mm_crc32_u8 (compiled for SSE 4.2 in the functions below only)
#define HPCTRAIN_CRC32C_X86 1
#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>  // __crc32cd, __crc32cb
#define HPCTRAIN_CRC32C_ARM 1
#endif

namespace hpctrain::detail {

/// The byte table of a reflected CRC-32 polynomial.
constexpr std::array<std::uint32_t, 256> reflected_crc32_table(std::uint32_t polynomial) {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ polynomial : c >> 1;
    t[i] = c;
  }
  return t;
}

inline const std::array<std::uint32_t, 256>& crc32c_table() {
  static constexpr std::array<std::uint32_t, 256> table = reflected_crc32_table(0x82F63B78u);
  return table;
}

/// CRC-32C by the byte table: any CPU. `crc` is the running (inverted) register.
inline std::uint32_t crc32c_by_table(const unsigned char* bytes, std::size_t size, std::uint32_t crc) {
  const auto& table = crc32c_table();
  for (std::size_t i = 0; i < size; ++i) crc = table[(crc ^ bytes[i]) & 0xFFu] ^ (crc >> 8);
  return crc;
}

#if defined(HPCTRAIN_CRC32C_X86)
/// CRC-32C by SSE 4.2's instruction, eight bytes at a time. `crc` is the running (inverted) register.
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_by_instruction(const unsigned char* bytes,
                                                                             std::size_t size, std::uint32_t crc) {
  std::uint64_t c = crc;
  for (; size >= 8; bytes += 8, size -= 8) {
    std::uint64_t word;
    std::memcpy(&word, bytes, 8);  // unaligned load
    c = _mm_crc32_u64(c, word);
  }
  auto c32 = static_cast<std::uint32_t>(c);
  for (; size > 0; ++bytes, --size) c32 = _mm_crc32_u8(c32, *bytes);
  return c32;
}
inline bool crc32c_instruction_available() {
  static const bool available = __builtin_cpu_supports("sse4.2");
  return available;
}
#elif defined(HPCTRAIN_CRC32C_ARM)
inline std::uint32_t crc32c_by_instruction(const unsigned char* bytes, std::size_t size, std::uint32_t crc) {
  for (; size >= 8; bytes += 8, size -= 8) {
    std::uint64_t word;
    std::memcpy(&word, bytes, 8);
    crc = __crc32cd(crc, word);
  }
  for (; size > 0; ++bytes, --size) crc = __crc32cb(crc, *bytes);
  return crc;
}
inline bool crc32c_instruction_available() { return true; }  // compiled for a CPU with the CRC extension
#else
inline std::uint32_t crc32c_by_instruction(const unsigned char* bytes, std::size_t size, std::uint32_t crc) {
  return crc32c_by_table(bytes, size, crc);
}
inline bool crc32c_instruction_available() { return false; }
#endif

/// CRC-32C of `size` bytes, continuing from `crc` (0 to start).
inline std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc = 0) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  return ~(crc32c_instruction_available() ? crc32c_by_instruction(bytes, size, ~crc)
                                          : crc32c_by_table(bytes, size, ~crc));
}

inline std::uint32_t crc32c(std::string_view bytes) { return crc32c(bytes.data(), bytes.size()); }

/// a times b modulo CRC-32C's polynomial, both reflected (bit 31 is x^0): zlib's multmodp.
constexpr std::uint32_t crc32c_multiply_mod(std::uint32_t a, std::uint32_t b) {
  std::uint32_t product = 0;
  for (std::uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) {
      product ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    b = (b & 1u) ? (b >> 1) ^ 0x82F63B78u : b >> 1;
  }
  return product;
}

/// CRC-32C of the bytes a then b from crc32c(a), crc32c(b) and b's length, without reading them: zlib's
/// crc32_combine (crc(a) shifted by x^(8 * b_size) modulo the polynomial, plus crc(b)). A save checksums each piece
/// in chunks as it snapshots it; the file's CRC is combined from those, not read again.
constexpr std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t b_size) {
  std::uint32_t x_power = 1u << 30;  // x^1, squared at each bit of 8 * b_size: x^(2^k)
  std::uint32_t shift = 1u << 31;    // x^0
  for (std::uint64_t bits = b_size * 8; bits != 0; bits >>= 1) {
    if (bits & 1u) shift = crc32c_multiply_mod(x_power, shift);
    x_power = crc32c_multiply_mod(x_power, x_power);
  }
  return crc32c_multiply_mod(shift, crc_a) ^ crc_b;
}

/// TFRecord's masked CRC: a CRC of data that itself contains CRCs is weak, so TensorFlow rotates and offsets it.
inline std::uint32_t masked_crc32c(const void* data, std::size_t size) {
  const std::uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

/// CRC-32 with zlib's (IEEE 802.3) polynomial, what wandb's transaction log checksums with. `crc` continues a
/// running value (0 to start), as zlib.crc32(data, crc) does. Small records only: no instruction path.
inline std::uint32_t crc32_ieee(std::string_view data, std::uint32_t crc = 0) {
  static constexpr std::array<std::uint32_t, 256> table = reflected_crc32_table(0xEDB88320u);
  crc = ~crc;
  for (const char byte : data) crc = table[(crc ^ static_cast<unsigned char>(byte)) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

}  // namespace hpctrain::detail
