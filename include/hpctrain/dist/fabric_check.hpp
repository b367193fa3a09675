#pragma once
// `--check-fabric`: instead of training, the job's own ranks time the collectives the strategies run over the same
// binary, geometry, environment and container as the training: all-reduce (Replicated's gradients, HSDP's replica
// reduction), all-gather (ZeRO-3's parameters) and reduce-scatter (its gradients), through the step's own calls
// (dist/shard_collectives.hpp: over Gloo a reduce-scatter is an all-reduce and a slice, as the step gets it). Two
// parts, printed by rank 0 (dist/fabric_report.hpp):
//  1. over the whole world, each collective from 8 B up to a maximum, doubling, as nccl-tests' <kind>_perf prints
//     it (in place, float32; nccl-tests' -b 8 -e MAX -f 2 -w 5 -n 20);
//  2. on more than one node, in HSDP's groups at the largest message, every group at once as the step runs them:
//     within each node and across nodes (a rail: the k-th rank of every node), naming the slowest node against the
//     median node, and the slowest group across nodes against the fabric's figure (job/fabric.hpp), which
//     --check-fabric-min-fraction turns into a failure.
// A time is the mean over a group's ranks of one collective's, of `iterations` issued back to back after `warmup`.
// #wrong counts elements of a separate check collective (rank r contributes r + 1) whose result is wrong, summed
// over ranks.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/types.h>

#include <hpctrain/dist/collectives.hpp>
#include <hpctrain/dist/fabric_report.hpp>
#include <hpctrain/dist/process_group.hpp>
#include <hpctrain/dist/shard_collectives.hpp>
#include <hpctrain/job/fabric.hpp>
#include <hpctrain/slurm/world.hpp>

namespace hpctrain::dist {

/// The sweep's sizes and repetitions.
struct SweepOptions {
  std::int64_t min_bytes = 8;           ///< Default: 8 (two floats), nccl-tests' -b 8
  std::int64_t max_bytes = 64ll << 20;  ///< Default: 64 MiB (default_check_max_bytes picks per backend)
  int warmup = 5;                       ///< untimed collectives per size. Default: 5 (nccl-tests' -w)
  int iterations = 20;                  ///< timed collectives per size. Default: 20 (nccl-tests' -n)
};

/// What the login command asked for (train/worker.hpp reads it from the job's environment).
struct FabricCheckRequest {
  std::int64_t max_bytes = 0;           ///< --check-fabric-max; 0: the backend's default
  FabricBandwidth between_nodes;        ///< the fabric's figure between nodes (the site's, else its preset's)
  std::optional<double> min_fraction;   ///< --check-fabric-min-fraction
  std::vector<std::string> node_names;  ///< Slurm's node list in node order (under srun), else empty
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

using PendingCollective = std::variant<PendingAllReduce, PendingAllGather, PendingReduceScatter>;

/// Starts `kind` in place on `buffer` (a reduce-scatter into `slice`, this rank's share), as the step does.
inline PendingCollective start_collective(ProcessGroup& group, Collective kind, const torch::Tensor& buffer,
                                          const torch::Tensor& slice) {
  if (kind == Collective::all_gather) return start_all_gather_in_place(group, buffer);
  if (kind == Collective::reduce_scatter) return start_reduce_scatter(group, buffer, slice);
  return start_all_reduce_in_place(group, buffer);
}

inline void finish(ProcessGroup& group, PendingCollective& pending) {
  std::visit([&](auto& started) { wait(group, started); }, pending);
}

inline torch::TensorOptions float_on(const ProcessGroup& group) {
  return torch::TensorOptions().dtype(torch::kFloat32).device(group.device());
}

/// Elements whose result is wrong on this rank, of `kind` over `count` elements where rank r contributes r + 1.
inline std::int64_t wrong_elements(ProcessGroup& group, Collective kind, std::int64_t count) {
  const int n = group.world_size(), rank = group.rank();
  const auto slice_count = count / n;
  const float sum = static_cast<float>(n) * static_cast<float>(n + 1) / 2.0f;
  auto buffer = torch::full({count}, static_cast<float>(rank + 1), float_on(group));
  auto slice = torch::zeros({slice_count}, float_on(group));
  if (kind == Collective::all_gather) {
    buffer.zero_();
    buffer.narrow(0, rank * slice_count, slice_count).fill_(static_cast<float>(rank + 1));
  }
  auto pending = start_collective(group, kind, buffer, slice);
  finish(group, pending);
  if (kind == Collective::all_gather)  // slice i holds rank i's i + 1
    return buffer.ne(torch::arange(1, n + 1, float_on(group)).repeat_interleave(slice_count))
        .sum()
        .item<std::int64_t>();
  return (kind == Collective::reduce_scatter ? slice : buffer).ne(sum).sum().item<std::int64_t>();
}

/// Mean seconds of one `kind` on `buffer`, over `iterations` issued back to back (this rank's).
inline double time_back_to_back(ProcessGroup& group, Collective kind, const torch::Tensor& buffer,
                                const torch::Tensor& slice, int iterations) {
  std::vector<PendingCollective> pending;
  dist::barrier(group);
  synchronize_device(group);
  const auto began = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) pending.push_back(start_collective(group, kind, buffer, slice));
  for (auto& started : pending) finish(group, started);
  synchronize_device(group);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count() / iterations;
}

/// One size of one collective over `group`: warm-up, the timed ones (their mean over the group's ranks), the check.
inline CollectiveTiming time_collective(ProcessGroup& group, Collective kind, std::int64_t count,
                                        const SweepOptions& options) {
  const int n = group.world_size();
  // Zeros: the timed sums stay zeros, however many run (rank + 1 would overflow past 2^128).
  auto buffer = torch::zeros({count}, float_on(group));
  auto slice = torch::zeros({count / n}, float_on(group));
  for (int i = 0; i < options.warmup; ++i) {
    auto pending = start_collective(group, kind, buffer, slice);
    finish(group, pending);
  }
  CollectiveTiming row;
  row.count = count;
  row.seconds = all_reduce_sum(group, time_back_to_back(group, kind, buffer, slice, options.iterations)) / n;
  row.wrong = static_cast<std::int64_t>(all_reduce_sum(group, static_cast<double>(wrong_elements(group, kind, count))));
  return row;
}
}  // namespace detail

/// Times `kind` from `min_bytes` to `max_bytes`, doubling; collective (every rank of `group` calls it alike).
inline std::vector<CollectiveTiming> collective_sweep(ProcessGroup& group, Collective kind,
                                                      const SweepOptions& options) {
  std::vector<CollectiveTiming> rows;
  if (group.world_size() == 1) return rows;
  for (std::int64_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 2)
    if (const auto count = fabric_elements(kind, bytes, group.world_size()); count > 0)
      rows.push_back(detail::time_collective(group, kind, count, options));
  return rows;
}

namespace detail {
/// The node index of every rank, as every rank learns it (a sum of one-hot slots).
inline std::vector<int> node_of_every_rank(ProcessGroup& world, int node_rank) {
  auto slots = torch::zeros({world.world_size()}, torch::TensorOptions().dtype(torch::kFloat64));
  slots[world.rank()] = static_cast<double>(node_rank);
  all_reduce_sum(world, slots);
  std::vector<int> nodes;
  for (std::int64_t r = 0; r < world.world_size(); ++r) nodes.push_back(static_cast<int>(slots[r].item<double>()));
  return nodes;
}

/// The nodes' names in node order: Slurm's node list (`slurm_nodes`), else this host's name (--local: one node).
inline std::vector<std::string> node_names(std::vector<std::string> slurm_nodes, std::size_t nodes) {
  std::vector<std::string> names = std::move(slurm_nodes);
  if (names.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    names.emplace_back(host);
  }
  while (names.size() < nodes) names.push_back(fmt::format("node {}", names.size()));
  return names;
}

/// Every group of `members` (one list per group) times the three collectives at `bytes` at once; rank 0 gets each
/// group's bus bandwidth (the group's lowest rank reports it) and the wrong elements are added to `wrong`.
inline std::vector<GroupBusbw> time_groups(ProcessGroup& world, const std::vector<std::vector<int>>& members,
                                           std::size_t own, const std::string& tag, std::int64_t bytes,
                                           const SweepOptions& options, std::int64_t& wrong) {
  const auto& ranks = members[own];
  // Every rank makes its subgroup here, in the same order (ProcessGroup::subgroup); a group of all ranks is the world.
  std::shared_ptr<ProcessGroup> subgroup;
  if (static_cast<int>(ranks.size()) < world.world_size())
    subgroup = world.subgroup(ranks, fmt::format("check-fabric/{}/{}", tag, own));
  ProcessGroup& group = subgroup ? *subgroup : world;
  auto figures = torch::zeros({static_cast<std::int64_t>(members.size()), 4}, torch::kFloat64);
  if (ranks.size() > 1) {
    for (std::size_t k = 0; k < fabric_collectives.size(); ++k) {
      const auto kind = fabric_collectives[k];
      const auto count = fabric_elements(kind, bytes, group.world_size());
      if (count == 0) continue;
      const auto row = time_collective(group, kind, count, options);
      if (ranks.front() == world.rank()) {
        figures[static_cast<std::int64_t>(own)][static_cast<std::int64_t>(k)] =
            row.busbw_gbps(kind, group.world_size());
        figures[static_cast<std::int64_t>(own)][3] += static_cast<double>(row.wrong);
      }
    }
  }
  all_reduce_sum(world, figures);
  std::vector<GroupBusbw> busbw(members.size());
  for (std::size_t g = 0; g < members.size(); ++g) {
    for (std::size_t k = 0; k < 3; ++k)
      busbw[g][k] = figures[static_cast<std::int64_t>(g)][static_cast<std::int64_t>(k)].item<double>();
    wrong += static_cast<std::int64_t>(figures[static_cast<std::int64_t>(g)][3].item<double>());
  }
  return busbw;
}
}  // namespace detail

/// The whole check on one rank: rendezvous, the world's sweeps, HSDP's groups on more than one node; rank 0 prints.
/// Returns 0, or 1 when a result was wrong or the fabric fell below --check-fabric-min-fraction.
inline int check_fabric(const slurm::World& world, const Options& options, const FabricCheckRequest& request) {
  auto group = init_process_group(world, options);
  SweepOptions sweep;
  sweep.max_bytes = request.max_bytes > 0 ? request.max_bytes : default_check_max_bytes(*group);
  if (sweep.max_bytes < sweep.min_bytes)
    throw SpecError(errors::spec_check_fabric_max, fmt::format("--check-fabric-max {}", sweep.max_bytes),
                    fmt::format("below the smallest message, {} B", sweep.min_bytes));
  const auto groups = fabric_groups(detail::node_of_every_rank(*group, world.node_rank));
  const auto print = [&](const std::string& text) {
    if (world.rank != 0) return;
    fmt::print("{}", text);
    std::fflush(stdout);
  };
  print(
      fmt::format("# hpctrain --check-fabric: all_reduce, all_gather and reduce_scatter over {} rank(s) on {} "
                  "node(s), {} on {}\n",
                  world.world_size, groups.nodes.size(), group->backend_name(), group->device().str()));
  print(fmt::format("# minBytes {} maxBytes {} step: 2(factor) warmup iters: {} iters: {} validation: 1\n",
                    sweep.min_bytes, sweep.max_bytes, sweep.warmup, sweep.iterations));
  if (world.world_size == 1) print("# one rank: no collective to time (--local N, or more tasks)\n");
  std::int64_t wrong = 0;
  const auto site = request.between_nodes.stated_by_site ? std::optional(request.between_nodes.gbps) : std::nullopt;
  for (const auto kind : fabric_collectives) {
    const auto rows = collective_sweep(*group, kind, sweep);
    for (const auto& row : rows) wrong += row.wrong;
    if (world.world_size > 1) print(sweep_table(kind, rows, world.world_size, site));
  }
  bool slow = false;
  if (groups.nodes.size() > 1) {
    const auto node = static_cast<std::size_t>(groups.node_of(world.rank));
    const auto rail = static_cast<std::size_t>(groups.rail_of(world.rank));
    const auto nodes = detail::time_groups(*group, groups.nodes, node, "node", sweep.max_bytes, sweep, wrong);
    const auto rails = detail::time_groups(*group, groups.rails, rail, "rail", sweep.max_bytes, sweep, wrong);
    print(groups_table(groups, detail::node_names(request.node_names, groups.nodes.size()), nodes, rails,
                       sweep.max_bytes));
    const auto verdict = between_nodes_verdict(rails, request.between_nodes, request.min_fraction);
    print(verdict.text);
    slow = verdict.failed;
  } else if (request.min_fraction) {
    print(between_nodes_verdict({}, request.between_nodes, request.min_fraction).text);
  }
  return wrong == 0 && !slow ? 0 : 1;
}

}  // namespace hpctrain::dist
