#pragma once
// What `--check-fabric` prints and decides, apart from the timing (dist/fabric_check.hpp): nccl-tests' tables of the
// sweeps over the world, HSDP's groups (each node's ranks; a "rail", the ranks with the same index on every node),
// the per-node and per-rail table with the slowest node against the median node, and the verdict of
// --check-fabric-min-fraction against the fabric's figure between nodes. Torch-free: arithmetic on the timings.
//
// As nccl-tests defines them (its PERFORMANCE.md): algbw = size / time, where size is the whole buffer (an
// all-gather's output, a reduce-scatter's input); busbw = algbw · 2(n-1)/n for an all-reduce and algbw · (n-1)/n
// for an all-gather or a reduce-scatter of n ranks: what each rank sends in a ring, comparable across group sizes
// and with the link's speed.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <hpctrain/dist/traffic.hpp>
#include <hpctrain/job/fabric.hpp>

namespace hpctrain::dist {

/// The collectives the strategies run, in the order the check times and prints them.
inline constexpr std::array<Collective, 3> fabric_collectives = {Collective::all_reduce, Collective::all_gather,
                                                                 Collective::reduce_scatter};

/// nccl-tests' bus bandwidth factor of `kind` over `n` ranks.
inline double busbw_factor(Collective kind, int n) {
  const double ring = static_cast<double>(n - 1) / n;
  return kind == Collective::all_reduce ? 2.0 * ring : ring;
}

/// The float32 elements of a buffer of at most `bytes` for `kind` over `n` ranks: an all-gather's and a
/// reduce-scatter's buffer splits into n equal slices, so their count is rounded down to a multiple of n (as
/// nccl-tests rounds it). 0: too small for one element a rank.
inline std::int64_t fabric_elements(Collective kind, std::int64_t bytes, int n) {
  const std::int64_t count = bytes / 4;
  return kind == Collective::all_reduce ? count : count / n * n;
}

/// One collective at one size.
struct CollectiveTiming {
  std::int64_t count = 0;  ///< float32 elements of the whole buffer
  double seconds = 0;      ///< one collective, mean over the group's ranks
  std::int64_t wrong = 0;  ///< elements of the check collective with a wrong result, over the group's ranks
  std::int64_t bytes() const { return count * 4; }
  double algbw_gbps() const { return static_cast<double>(bytes()) / seconds / 1e9; }
  double busbw_gbps(Collective kind, int n) const { return algbw_gbps() * busbw_factor(kind, n); }
};

/// nccl-tests' time column: two decimals below 100 us, one below 10 ms, none above.
inline std::string format_microseconds(double microseconds) {
  if (microseconds >= 10000.0) return fmt::format("{:7.0f}", microseconds);
  if (microseconds >= 100.0) return fmt::format("{:7.1f}", microseconds);
  return fmt::format("{:7.2f}", microseconds);
}

/// One sweep as nccl-tests' <kind>_perf prints its in-place half, then the totals; an all-reduce's peak against the
/// site's figure where the site states one.
inline std::string sweep_table(Collective kind, const std::vector<CollectiveTiming>& rows, int world,
                               std::optional<double> site_busbw_gbps) {
  const auto name = collective_names[static_cast<std::size_t>(kind)];
  std::string s = fmt::format("# {} over the {} ranks\n", name, world);
  s += "#                                                              in-place\n";
  s += fmt::format("#{:>11}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}\n", "size", "count", "type",
                   "redop", "root", "time", "algbw", "busbw", "#wrong");
  s += fmt::format("#{:>11}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}\n", "(B)", "(elements)", "", "",
                   "", "(us)", "(GB/s)", "(GB/s)", "");
  double busbw_total = 0, peak = 0;
  std::int64_t wrong = 0, peak_bytes = 0;
  for (const auto& row : rows) {
    const double busbw = row.busbw_gbps(kind, world);
    s += fmt::format("{:12}  {:12}  {:>8}  {:>6}  {:6}  {}  {:6.2f}  {:6.2f}  {:6}\n", row.bytes(), row.count, "float",
                     kind == Collective::all_gather ? "none" : "sum", -1, format_microseconds(row.seconds * 1e6),
                     row.algbw_gbps(), busbw, row.wrong);
    busbw_total += busbw;
    wrong += row.wrong;
    if (busbw > peak) peak = busbw, peak_bytes = row.bytes();
  }
  s += fmt::format("# Out of bounds values : {} {}\n", wrong, wrong == 0 ? "OK" : "FAILED");
  s += fmt::format("# Avg bus bandwidth    : {:g}\n",
                   rows.empty() ? 0.0 : busbw_total / static_cast<double>(rows.size()));
  if (!rows.empty())
    s += fmt::format("# Peak bus bandwidth   : {:.2f} GB/s at {} B{}\n", peak, peak_bytes,
                     site_busbw_gbps && kind == Collective::all_reduce
                         ? fmt::format("; the site expects {:g} GB/s: {:.0f}% of it", *site_busbw_gbps,
                                       100.0 * peak / *site_busbw_gbps)
                         : "");
  return s;
}

/// HSDP's groups: each node's ranks (a shard group within a node) and each rail (the k-th rank of every node that
/// has one: a replica group across nodes), from the node index of every rank.
struct FabricGroups {
  std::vector<std::vector<int>> nodes;  ///< by node index: its ranks, ascending
  std::vector<std::vector<int>> rails;  ///< by index within a node: the ranks holding it, ascending
  int node_of(int rank) const {
    for (std::size_t n = 0; n < nodes.size(); ++n)
      if (std::find(nodes[n].begin(), nodes[n].end(), rank) != nodes[n].end()) return static_cast<int>(n);
    return -1;
  }
  int rail_of(int rank) const {
    const auto& own = nodes[static_cast<std::size_t>(node_of(rank))];
    return static_cast<int>(std::find(own.begin(), own.end(), rank) - own.begin());
  }
};

inline FabricGroups fabric_groups(const std::vector<int>& node_of_rank) {
  FabricGroups groups;
  for (int rank = 0; rank < static_cast<int>(node_of_rank.size()); ++rank) {
    const auto node = static_cast<std::size_t>(node_of_rank[static_cast<std::size_t>(rank)]);
    if (groups.nodes.size() <= node) groups.nodes.resize(node + 1);
    groups.nodes[node].push_back(rank);
  }
  for (const auto& ranks : groups.nodes)
    for (std::size_t k = 0; k < ranks.size(); ++k) {
      if (groups.rails.size() <= k) groups.rails.resize(k + 1);
      groups.rails[k].push_back(ranks[k]);
    }
  return groups;
}

/// One group's bus bandwidth in GB/s per collective (indexed as fabric_collectives), 0 for a group of one rank.
using GroupBusbw = std::array<double, 3>;

inline double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const auto middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : (values[middle - 1] + values[middle]) / 2.0;
}

/// The slowest node: the lowest ratio, over the three collectives, of a node's bus bandwidth to the median node's.
struct SlowestNode {
  int node = -1;
  double ratio = 1;  ///< of the median node's figure
  Collective kind = Collective::all_reduce;
};

inline std::optional<SlowestNode> slowest_node(const std::vector<GroupBusbw>& nodes) {
  std::optional<SlowestNode> slowest;
  for (std::size_t k = 0; k < fabric_collectives.size(); ++k) {
    std::vector<double> figures;
    for (const auto& node : nodes)
      if (node[k] > 0) figures.push_back(node[k]);
    const double median = median_of(figures);
    if (median <= 0) continue;
    for (std::size_t n = 0; n < nodes.size(); ++n)
      if (nodes[n][k] > 0 && (!slowest || nodes[n][k] / median < slowest->ratio))
        slowest = SlowestNode{static_cast<int>(n), nodes[n][k] / median, fabric_collectives[k]};
  }
  return slowest;
}

/// "0-3" for consecutive ranks, else "0,4,8".
inline std::string rank_list(const std::vector<int>& ranks) {
  bool consecutive = true;
  for (std::size_t i = 1; i < ranks.size(); ++i) consecutive = consecutive && ranks[i] == ranks[i - 1] + 1;
  if (consecutive && ranks.size() > 2) return fmt::format("{}-{}", ranks.front(), ranks.back());
  return fmt::format("{}", fmt::join(ranks, ","));
}

/// The table of HSDP's groups at `bytes`: a row per node (within it) and per rail (across nodes), the slowest node.
inline std::string groups_table(const FabricGroups& groups, const std::vector<std::string>& node_names,
                                const std::vector<GroupBusbw>& nodes, const std::vector<GroupBusbw>& rails,
                                std::int64_t bytes) {
  std::string s = fmt::format(
      "# HSDP's groups at {} B, every group at once as the step runs them: busbw (GB/s), - for a group of one rank\n",
      bytes);
  const auto row = [&](const std::string& name, const std::vector<int>& ranks, const GroupBusbw& busbw) {
    std::string line = fmt::format("  {:<20} {:>10}", name, rank_list(ranks));
    for (const double figure : busbw)
      line += figure > 0 ? fmt::format("  {:14.2f}", figure) : fmt::format("  {:>14}", "-");
    return line + "\n";
  };
  s += fmt::format("# {:<20} {:>10}  {:>14}  {:>14}  {:>14}\n", "within a node", "ranks", "all_reduce", "all_gather",
                   "reduce_scatter");
  for (std::size_t n = 0; n < nodes.size(); ++n) s += row(node_names.at(n), groups.nodes[n], nodes[n]);
  if (const auto slowest = slowest_node(nodes))
    s += fmt::format("# slowest node: {}, {:.2f}x the median node's {} within a node\n",
                     node_names.at(static_cast<std::size_t>(slowest->node)), slowest->ratio,
                     collective_names[static_cast<std::size_t>(slowest->kind)]);
  else s += "# slowest node: none to tell, every node runs one rank\n";
  s += fmt::format("# {:<20} {:>10}  {:>14}  {:>14}  {:>14}\n", "across nodes", "ranks", "all_reduce", "all_gather",
                   "reduce_scatter");
  for (std::size_t k = 0; k < rails.size(); ++k)
    s += row(fmt::format("rank {} of each node", k), groups.rails[k], rails[k]);
  return s;
}

/// Between nodes: the slowest group across nodes (its all-reduce, HSDP's replica reduction) against the fabric's
/// figure; `failed` when --check-fabric-min-fraction asks for more.
struct FabricVerdict {
  std::string text;
  bool failed = false;
};

inline FabricVerdict between_nodes_verdict(const std::vector<GroupBusbw>& rails, const FabricBandwidth& fabric,
                                           std::optional<double> min_fraction) {
  const std::size_t all_reduce = 0;  // fabric_collectives' first
  std::optional<double> slowest;
  for (const auto& rail : rails)
    if (rail[all_reduce] > 0) slowest = std::min(slowest.value_or(rail[all_reduce]), rail[all_reduce]);
  if (!slowest)
    return {
        min_fraction ? "# between nodes: one node, no link between nodes to hold to --check-fabric-min-fraction\n" : "",
        false};
  const double share = *slowest / fabric.gbps;
  FabricVerdict verdict;
  verdict.failed = min_fraction && share < *min_fraction;
  verdict.text =
      fmt::format("# between nodes: the slowest group's all_reduce reaches {:.2f} GB/s, {:.0f}% of {:g} GB/s ({}){}\n",
                  *slowest, 100.0 * share, fabric.gbps, fabric.source,
                  !min_fraction    ? ""
                  : verdict.failed ? fmt::format(": FAILED, --check-fabric-min-fraction {:g} asks for {:.0f}%",
                                                 *min_fraction, 100.0 * *min_fraction)
                                   : fmt::format(": OK, --check-fabric-min-fraction {:g}", *min_fraction));
  return verdict;
}

}  // namespace hpctrain::dist
