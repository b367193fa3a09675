#pragma once
// A slow link between the ranks, simulated: what lets a CPU test check --plan's step time (lm/step_time.hpp) against
// a measured one, the links of a real cluster being out of reach. Test-only: it runs only where
// HPCTRAIN_SIMULATED_LINK_GBPS is set (docs/distributed.md, "The step time").
//
// Each rank has one link of that many GB/s of bus bandwidth, which carries its collectives one after another in the
// order they start, as a ring over the collective's group of n ranks moves them (nccl-tests' bus bandwidth, the
// plan's own model): an all-gather or reduce-scatter of a payload of B bytes occupies it for B (n-1)/n / busbw
// seconds, an all-reduce for twice that. A collective counts as done at the later of the real one's end and its
// simulated end; a wait sleeps until then (no core burnt), so the link overlaps with compute exactly as far as the
// strategy's waits let it. The payload is the one the traffic counters count (dist/traffic.hpp): a Gloo
// reduce-scatter that runs as an all-reduce is charged as the reduce-scatter NCCL would run.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include <hpctrain/dist/traffic.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/names.hpp>

namespace hpctrain::dist {

/// The simulated link of this process: a queue of collectives at a fixed bus bandwidth.
class SimulatedLink {
 public:
  using Clock = std::chrono::steady_clock;

  explicit SimulatedLink(double bytes_per_second) : bytes_per_second_(bytes_per_second) {}

  /// The collective `key` of `kind` over a payload of `bytes` across `ranks` ranks starts now: it takes its turn on
  /// the link after those started before it.
  void started(const void* key, Collective kind, std::int64_t bytes, int ranks) {
    if (ranks <= 1) return;
    const double factor = kind == Collective::all_reduce ? 2.0 : 1.0;
    const double seconds = factor * static_cast<double>(bytes) * (ranks - 1.0) / ranks / bytes_per_second_;
    std::lock_guard lock(mutex_);
    const auto begin = std::max(Clock::now(), free_at_);
    free_at_ = begin + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    done_at_[key] = free_at_;
  }

  /// Waits (sleeping) until the collective `key` has crossed the link; call once its real counterpart has ended.
  void wait(const void* key) {
    std::optional<Clock::time_point> done;
    {
      std::lock_guard lock(mutex_);
      if (const auto found = done_at_.find(key); found != done_at_.end()) {
        done = found->second;
        done_at_.erase(found);
      }
    }
    if (done) std::this_thread::sleep_until(*done);
  }

 private:
  double bytes_per_second_;
  std::mutex mutex_;
  Clock::time_point free_at_{};
  std::unordered_map<const void*, Clock::time_point> done_at_;
};

/// A test-only variable's number, above 0, or nothing where it is unset.
inline std::optional<double> positive_number_of(const char* variable, std::string_view unit) {
  return positive_number_from_environment(variable, [&](const std::string& value) {
    throw SpecError(errors::spec_simulated_link, std::string(variable) + "=" + value,
                    fmt::format("a number of {} above 0 is needed", unit));
  });
}

/// The bus bandwidth HPCTRAIN_SIMULATED_LINK_GBPS asks for, in bytes/s, or nothing: read once per process.
inline std::optional<double> simulated_link_busbw() {
  static const std::optional<double> busbw = [] {
    const auto gbps = positive_number_of(env::test_seam::simulated_link, "GB/s");
    return gbps ? std::optional<double>(*gbps * 1e9) : std::nullopt;
  }();
  return busbw;
}

/// This process's simulated link, or nullptr where none is asked for (every real run). Never destroyed: a gradient
/// hook's thread may still start a collective while the process exits.
inline SimulatedLink* simulated_link() {
  static SimulatedLink* link = simulated_link_busbw() ? new SimulatedLink(*simulated_link_busbw()) : nullptr;
  return link;
}

}  // namespace hpctrain::dist
