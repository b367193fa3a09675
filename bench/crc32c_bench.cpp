// CRC-32C throughput: the byte table against the CPU's instruction (SSE 4.2 / AArch64 CRC), over one buffer
// the size of a small checkpoint shard, best of five passes. Torch-free.
//   build-bench/bench/hpctrain_crc32c_bench [MiB]      (default 256)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <hpctrain/checksums.hpp>

namespace {
template <class Crc>
double best_gb_per_s(const std::vector<unsigned char>& buffer, Crc crc, std::uint32_t& result) {
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    result = ~crc(buffer.data(), buffer.size(), 0xFFFFFFFFu);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    best = std::max(best, static_cast<double>(buffer.size()) / took.count() / 1e9);
  }
  return best;
}
}  // namespace

int main(int argc, char** argv) {
  const std::size_t mib = argc > 1 ? std::stoul(argv[1]) : 256;
  std::vector<unsigned char> buffer(mib << 20);
  std::uint32_t state = 1;
  for (auto& b : buffer) b = static_cast<unsigned char>((state = state * 1103515245u + 12345u) >> 16);
  std::uint32_t by_table = 0, by_instruction = 0;
  const double table = best_gb_per_s(buffer, hpctrain::detail::crc32c_by_table, by_table);
  const double instruction = best_gb_per_s(buffer, hpctrain::detail::crc32c_by_instruction, by_instruction);
  std::printf("crc32c over %zu MiB: table %.2f GB/s, instruction %.2f GB/s (%s), %.1fx; crc %08x %s\n", mib, table,
              instruction,
              hpctrain::detail::crc32c_instruction_available() ? "available" : "not available: the table again",
              instruction / table, by_instruction, by_table == by_instruction ? "equal" : "DIFFERENT");
  return by_table == by_instruction ? 0 : 1;
}
