#pragma once
// A slow link between the ranks, simulated: what lets a CPU test check --plan's step time (lm/step_time.hpp) against
// a measured one, the links of a real cluster being out of reach. Test-only: it runs only where the worker's
// environment sets HPCTRAIN_SIMULATED_LINK_GBPS (a test seam, docs/seams.md; docs/distributed.md, "The step time"):
// its process group holds it (dist::Options::simulated_link) and its collectives cross it (dist/collectives.hpp).
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
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>

#include <hpctrain/dist/traffic.hpp>
#include <hpctrain/job/plan_request.hpp>  // test_seam_number
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

/// The bus bandwidth `environment`'s HPCTRAIN_SIMULATED_LINK_GBPS asks for, in bytes/s, or nothing.
inline std::optional<double> simulated_link_busbw(const Environment& environment) {
  const auto gbps = test_seam_number(environment, env::test_seam::simulated_link, "GB/s");
  return gbps ? std::optional<double>(*gbps * 1e9) : std::nullopt;
}

/// The simulated link `environment` asks for, or none (every real run). Shared by the process group and its
/// subgroups, which hold it as long as a collective can start.
inline std::shared_ptr<SimulatedLink> simulated_link_of(const Environment& environment) {
  const auto busbw = simulated_link_busbw(environment);
  return busbw ? std::make_shared<SimulatedLink>(*busbw) : nullptr;
}

}  // namespace hpctrain::dist
