#pragma once
// The cluster's network between nodes, as the site file names it (`fabric = efa | infiniband | ethernet`),
// and what each vendor's recipe sets for NCCL on it. Without these settings NCCL falls back to TCP sockets
// without an error and a multi-node job runs many times slower; the workers check that it did not
// (job/nccl_network.hpp).
//
// EFA follows AWS's "EFA cheatsheet" of the aws-ofi-nccl plugin (doc/efa-env-var.md, 2025): with libfabric >=
// 1.18 and the plugin >= 1.7 nothing is required; FI_PROVIDER=efa (required up to plugin 1.5) and
// FI_EFA_USE_DEVICE_RDMA=1 (required for plugin 1.6 on p4/p5) are harmless later and keep older images right;
// FI_EFA_FORK_SAFE=1 is what recent plugins set themselves (fork safety of data-loader processes on kernels
// < 5.15). NCCL_PROTO=simple is left out: the cheatsheet sets it only for plugin <= 1.5, and it would disable
// NCCL's LL/LL128 protocols on newer ones. The sbatch side (--exclusive, --wait-all-nodes=1) is that of AWS's
// Slurm examples (awsome-distributed-training). InfiniBand follows NCCL's own guide: NCCL_IB_HCA where the
// site names the adapters, NCCL_SOCKET_IFNAME for the bootstrap where it names an interface.
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/job/closest_name.hpp>

namespace hpctrain {

/// The network between nodes (site file key `fabric`).
enum class Fabric {
  efa,         ///< AWS Elastic Fabric Adapter, through libfabric and the aws-ofi-nccl plugin
  infiniband,  ///< InfiniBand (or RoCE), NCCL's own IB transport
  ethernet,    ///< TCP sockets: nothing to check
};

inline constexpr std::array<std::string_view, 3> fabric_names = {"efa", "infiniband", "ethernet"};

inline std::string_view to_string(Fabric fabric) { return fabric_names[static_cast<std::size_t>(fabric)]; }

/// Parses `efa`, `infiniband` or `ethernet`; SpecError `[hpctrain.spec.fabric]` naming the value, the closest
/// name and `where` it came from.
inline Fabric parse_fabric(std::string_view text, std::string_view where = "") {
  for (std::size_t i = 0; i < fabric_names.size(); ++i)
    if (text == fabric_names[i]) return static_cast<Fabric>(i);
  const auto closest = detail::closest_name(text, fabric_names);
  throw SpecError(errors::spec_fabric, fmt::format("fabric = {}", text.empty() ? std::string_view("\"\"") : text),
                  fmt::format("expected efa, infiniband or ethernet{}{}",
                              closest ? fmt::format(" (did you mean {}?)", *closest) : "",
                              where.empty() ? "" : fmt::format(" ({})", where)));
}

/// The site's network and what it knows of it (site file keys in the comments).
struct FabricSettings {
  std::optional<Fabric> fabric;               ///< `fabric`; none: nothing is set or checked
  std::string source;                         ///< `<file>:<line>` of `fabric`
  std::optional<std::string> socket_ifname;   ///< `socket_ifname`: NCCL_SOCKET_IFNAME (bootstrap and sockets)
  std::optional<std::string> ib_hca;          ///< `ib_hca`: NCCL_IB_HCA, the adapters NCCL may use
  std::optional<double> expected_busbw_gbps;  ///< `expected_busbw_gbps`: what --check-fabric compares with
};

/// The bus bandwidth a GPU gets between nodes (nccl-tests' busbw), in GB/s, and where the figure comes from.
struct FabricBandwidth {
  double gbps = 0;
  std::string source;
  bool stated_by_site = false;  ///< the site file's expected_busbw_gbps, not a preset's figure
};

/// The fabric's bus bandwidth between nodes: the site's expected_busbw_gbps when it states one; else the preset's:
/// efa and infiniband 45 GB/s a GPU (400 Gb/s a GPU, as p5 instances and NDR InfiniBand give, at nccl-tests' usual
/// ~90%), ethernet 3 GB/s (a 200 Gb/s node link shared by 8 GPUs); no fabric stated: 45 assumed. `--plan`'s step time
/// and `--check-fabric-min-fraction` both hold the fabric to this figure.
inline FabricBandwidth fabric_bandwidth(std::optional<Fabric> fabric, std::optional<double> expected_busbw_gbps) {
  if (expected_busbw_gbps) return {*expected_busbw_gbps, "the site's expected_busbw_gbps", true};
  if (fabric == Fabric::efa || fabric == Fabric::infiniband)
    return {45, fmt::format("the {} preset: 400 Gb/s a GPU", to_string(*fabric))};
  if (fabric == Fabric::ethernet) return {3, "the ethernet preset: 200 Gb/s a node shared by 8 GPUs"};
  return {45, "no fabric stated: 400 Gb/s a GPU assumed"};
}

/// One variable of a fabric preset and why it is set (a comment in the script).
struct FabricVariable {
  std::string name;
  std::string value;
  std::string why;
};

/// The variables the site's fabric preset sets, in the order the script exports them.
inline std::vector<FabricVariable> fabric_environment(const FabricSettings& site) {
  std::vector<FabricVariable> variables;
  if (!site.fabric) return variables;
  if (*site.fabric == Fabric::efa) {
    variables.push_back({"FI_PROVIDER", "efa", "libfabric's EFA provider, never its TCP one"});
    variables.push_back({"FI_EFA_USE_DEVICE_RDMA", "1", "GPUDirect RDMA on p4/p5 (needed by aws-ofi-nccl 1.6)"});
    variables.push_back({"FI_EFA_FORK_SAFE", "1", "data-loader forks on kernels < 5.15"});
  }
  if (*site.fabric == Fabric::infiniband && site.ib_hca)
    variables.push_back({"NCCL_IB_HCA", *site.ib_hca, "the site's adapters"});
  if (site.socket_ifname)
    variables.push_back({"NCCL_SOCKET_IFNAME", *site.socket_ifname, "the site's interface for NCCL's bootstrap"});
  return variables;
}

/// Whether the fabric's recipe asks for whole nodes (`--exclusive`): a job sharing a node shares its adapters.
inline bool fabric_wants_exclusive(const FabricSettings& site) {
  return site.fabric == Fabric::efa || site.fabric == Fabric::infiniband;
}

/// Whether the fabric's recipe asks Slurm to start the script only once every node has booted
/// (`--wait-all-nodes=1`, AWS's examples: EC2 nodes of a cluster that scales come up one by one).
inline bool fabric_wants_all_nodes_up(const FabricSettings& site) { return site.fabric == Fabric::efa; }

/// Whether the workers check which network NCCL chose: efa and infiniband (ethernet is sockets anyway).
inline bool fabric_needs_check(std::optional<Fabric> fabric) {
  return fabric == Fabric::efa || fabric == Fabric::infiniband;
}

}  // namespace hpctrain
