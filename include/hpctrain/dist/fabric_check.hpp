#pragma once
// `--check-fabric`: instead of training, the job's own ranks time all-reduces of 8 B up to a maximum, doubling,
// and rank 0 prints them as nccl-tests' all_reduce_perf does (in place, float32, sum), with the fabric's expected
// bus bandwidth where the site file states one. The same binary, geometry, environment and container as the
// training: what it measures is what the training's gradient all-reduces will get.
//
// As nccl-tests defines them: algbw = size / time; busbw = algbw * 2(n-1)/n for an all-reduce of n ranks (each
// rank sends and receives 2(n-1)/n of the buffer in a ring), comparable across world sizes and with the link's
// speed. The time is the mean over ranks of one all-reduce's time, of `iterations` issued back to back after
// `warmup` (nccl-tests' -n 20 -w 5). #wrong counts elements of a separate check all-reduce (rank r contributes
// r + 1) that differ from n(n+1)/2, summed over ranks.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/types.h>

#include <hpctrain/dist/collectives.hpp>
#include <hpctrain/dist/process_group.hpp>

namespace hpctrain::dist {

/// The sweep's sizes and repetitions.
struct AllReduceSweepOptions {
  std::int64_t min_bytes = 8;           ///< Default: 8 (two floats), nccl-tests' -b 8
  std::int64_t max_bytes = 64ll << 20;  ///< Default: 64 MiB (default_check_max_bytes picks per backend)
  int warmup = 5;                       ///< untimed all-reduces per size. Default: 5 (nccl-tests' -w)
  int iterations = 20;                  ///< timed all-reduces per size. Default: 20 (nccl-tests' -n)
};

/// One size of the sweep.
struct AllReduceTiming {
  std::int64_t bytes = 0;
  std::int64_t count = 0;  ///< float32 elements
  double seconds = 0;      ///< one all-reduce, mean over ranks
  std::int64_t wrong = 0;  ///< elements of the check all-reduce with a wrong sum, over all ranks
  double algbw_gbps() const { return static_cast<double>(bytes) / seconds / 1e9; }
  double busbw_gbps(int world) const { return algbw_gbps() * 2.0 * (world - 1) / world; }
};

/// The default largest message: 1 GiB over NCCL (nccl-tests' usual -e 1G), 64 MiB over Gloo, whose CPU
/// all-reduce of 1 GiB takes seconds per iteration and as much memory again per rank.
inline std::int64_t default_check_max_bytes(const ProcessGroup& group) {
  return group.backend_name() == "nccl" ? (1ll << 30) : (64ll << 20);
}

namespace detail {
inline void synchronize_device(const ProcessGroup& group) {
  if (group.device().is_cuda()) torch::cuda::synchronize(group.device().index());
}

/// Elements of a check all-reduce whose sum is wrong on this rank.
inline std::int64_t wrong_elements(ProcessGroup& group, std::int64_t count) {
  auto check = torch::full({count}, static_cast<float>(group.rank() + 1),
                           torch::TensorOptions().dtype(torch::kFloat32).device(group.device()));
  all_reduce_sum(group, check);
  const float expected = static_cast<float>(group.world_size()) * static_cast<float>(group.world_size() + 1) / 2.0f;
  return check.ne(expected).sum().item<std::int64_t>();
}

/// Mean seconds of one all-reduce of `buffer`, over `iterations` issued back to back (this rank's).
inline double time_all_reduces(ProcessGroup& group, torch::Tensor buffer, int iterations) {
  std::vector<torch::Tensor> tensors{buffer};
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  dist::barrier(group);
  synchronize_device(group);
  const auto began = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i)
    works.push_back(start(group, "all_reduce", [&] { return group.backend()->allreduce(tensors); }));
  for (auto& work : works) wait_for(group, work, "all_reduce");
  synchronize_device(group);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count() / iterations;
}
}  // namespace detail

/// Times all-reduces from `min_bytes` to `max_bytes`, doubling; collective (every rank calls it alike).
inline std::vector<AllReduceTiming> all_reduce_sweep(ProcessGroup& group, const AllReduceSweepOptions& options) {
  std::vector<AllReduceTiming> rows;
  if (group.world_size() == 1) return rows;
  for (std::int64_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 2) {
    AllReduceTiming row;
    row.bytes = bytes;
    row.count = bytes / static_cast<std::int64_t>(sizeof(float));
    // Zeros: the timed sums stay zeros, however many iterations run (rank + 1 would overflow past 2^128).
    auto buffer = torch::zeros({row.count}, torch::TensorOptions().dtype(torch::kFloat32).device(group.device()));
    for (int i = 0; i < options.warmup; ++i) all_reduce_sum(group, buffer);
    const double seconds = detail::time_all_reduces(group, buffer, options.iterations);
    row.seconds = all_reduce_sum(group, seconds) / group.world_size();
    row.wrong =
        static_cast<std::int64_t>(all_reduce_sum(group, static_cast<double>(detail::wrong_elements(group, row.count))));
    rows.push_back(row);
  }
  return rows;
}

/// nccl-tests' time column: two decimals below 100 us, one below 10 ms, none above.
inline std::string format_microseconds(double microseconds) {
  if (microseconds >= 10000.0) return fmt::format("{:7.0f}", microseconds);
  if (microseconds >= 100.0) return fmt::format("{:7.1f}", microseconds);
  return fmt::format("{:7.2f}", microseconds);
}

/// The table as all_reduce_perf prints its in-place half, then the totals (and the site's expectation).
inline std::string all_reduce_table(const std::vector<AllReduceTiming>& rows, int world,
                                    std::optional<double> expected_busbw_gbps) {
  std::string s;
  s += "#                                                              in-place\n";
  s += fmt::format("#{:>11}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}\n", "size", "count", "type",
                   "redop", "root", "time", "algbw", "busbw", "#wrong");
  s += fmt::format("#{:>11}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}\n", "(B)", "(elements)", "", "",
                   "", "(us)", "(GB/s)", "(GB/s)", "");
  double busbw_total = 0, peak = 0;
  std::int64_t wrong = 0, peak_bytes = 0;
  for (const auto& row : rows) {
    s += fmt::format("{:12}  {:12}  {:>8}  {:>6}  {:6}  {}  {:6.2f}  {:6.2f}  {:6}\n", row.bytes, row.count, "float",
                     "sum", -1, format_microseconds(row.seconds * 1e6), row.algbw_gbps(), row.busbw_gbps(world),
                     row.wrong);
    busbw_total += row.busbw_gbps(world);
    wrong += row.wrong;
    if (row.busbw_gbps(world) > peak) peak = row.busbw_gbps(world), peak_bytes = row.bytes;
  }
  s += fmt::format("# Out of bounds values : {} {}\n", wrong, wrong == 0 ? "OK" : "FAILED");
  s += fmt::format("# Avg bus bandwidth    : {:g}\n",
                   rows.empty() ? 0.0 : busbw_total / static_cast<double>(rows.size()));
  if (!rows.empty())
    s += fmt::format("# Peak bus bandwidth   : {:.2f} GB/s at {} B{}\n", peak, peak_bytes,
                     expected_busbw_gbps ? fmt::format("; the site expects {:g} GB/s: {:.0f}% of it",
                                                       *expected_busbw_gbps, 100.0 * peak / *expected_busbw_gbps)
                                         : "");
  return s;
}

/// The whole check on one rank: rendezvous, sweep, rank 0 prints. Returns 0, or 1 when a sum was wrong.
inline int check_fabric(const slurm::World& world, const Options& options, std::int64_t max_bytes,
                        std::optional<double> expected_busbw_gbps) {
  auto group = init_process_group(world, options);
  AllReduceSweepOptions sweep;
  sweep.max_bytes = max_bytes > 0 ? max_bytes : default_check_max_bytes(*group);
  if (sweep.max_bytes < sweep.min_bytes)
    throw SpecError(errors::spec_check_fabric_max, fmt::format("--check-fabric-max {}", sweep.max_bytes),
                    fmt::format("below the smallest message, {} B", sweep.min_bytes));
  const int nodes = world.world_size / std::max(1, world.local_world_size);
  if (world.rank == 0) {
    fmt::print("# hpctrain --check-fabric: all_reduce over {} rank(s) on {} node(s), {} on {}\n", world.world_size,
               nodes, group->backend_name(), group->device().str());
    fmt::print("# minBytes {} maxBytes {} step: 2(factor) warmup iters: {} iters: {} validation: 1\n", sweep.min_bytes,
               sweep.max_bytes, sweep.warmup, sweep.iterations);
    if (world.world_size == 1) fmt::print("# one rank: no all-reduce to time (--local N, or more tasks)\n");
    std::fflush(stdout);
  }
  const auto rows = all_reduce_sweep(*group, sweep);
  std::int64_t wrong = 0;
  for (const auto& row : rows) wrong += row.wrong;
  if (world.rank == 0 && world.world_size > 1) {
    fmt::print("{}", all_reduce_table(rows, world.world_size, expected_busbw_gbps));
    std::fflush(stdout);
  }
  return wrong == 0 ? 0 : 1;
}

}  // namespace hpctrain::dist
