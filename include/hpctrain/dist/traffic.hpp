#pragma once
// What this process puts on the fabric, counted where each collective starts (detail::note_started in
// dist/collectives.hpp, called there and by dist/shard_collectives.hpp and dist/gradient_sync.hpp): per kind, the
// calls and their payload — the whole buffer the collective works on (an all-gather's gathered flat, a
// reduce-scatter's input, an all-reduce's or a broadcast's tensor). That is the size FSDP2's per-parameter figures
// count (2 + 2 + 4 bytes a parameter a step: bf16 all-gathers in forward and backward, an fp32 reduce-scatter); a
// ring sends (W-1)/W of an all-gather's or a reduce-scatter's payload from each rank and 2(W-1)/W of an
// all-reduce's. Torch-free; the Trainer prints the steps' share (docs/distributed.md, "Bytes on the fabric").
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace hpctrain::dist {

enum class Collective { all_gather, reduce_scatter, all_reduce, broadcast };
inline constexpr std::array<std::string_view, 4> collective_names = {"all_gather", "reduce_scatter", "all_reduce",
                                                                     "broadcast"};

/// Calls and payload bytes per kind of collective (indexed by Collective).
struct TrafficCount {
  std::array<std::int64_t, 4> calls{};
  std::array<std::int64_t, 4> bytes{};

  TrafficCount operator-(const TrafficCount& earlier) const {
    TrafficCount since;
    for (std::size_t k = 0; k < calls.size(); ++k) {
      since.calls[k] = calls[k] - earlier.calls[k];
      since.bytes[k] = bytes[k] - earlier.bytes[k];
    }
    return since;
  }
};

namespace detail {
struct TrafficCounters {
  std::array<std::atomic<std::int64_t>, 4> calls{};
  std::array<std::atomic<std::int64_t>, 4> bytes{};
};
inline TrafficCounters& traffic_counters() {
  static TrafficCounters counters;
  return counters;
}
}  // namespace detail

/// Counts one collective of `kind` over a payload of `bytes` (from any thread: the gradient hooks start some).
inline void count_collective(Collective kind, std::int64_t bytes) {
  auto& counters = detail::traffic_counters();
  const auto k = static_cast<std::size_t>(kind);
  counters.calls[k].fetch_add(1, std::memory_order_relaxed);
  counters.bytes[k].fetch_add(bytes, std::memory_order_relaxed);
}

/// This process's collectives so far.
inline TrafficCount traffic_so_far() {
  auto& counters = detail::traffic_counters();
  TrafficCount count;
  for (std::size_t k = 0; k < count.calls.size(); ++k) {
    count.calls[k] = counters.calls[k].load(std::memory_order_relaxed);
    count.bytes[k] = counters.bytes[k].load(std::memory_order_relaxed);
  }
  return count;
}

}  // namespace hpctrain::dist
