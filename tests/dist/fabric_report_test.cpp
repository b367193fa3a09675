// --check-fabric's arithmetic apart from the timing (dist/fabric_report.hpp): HSDP's groups from the ranks' nodes,
// nccl-tests' sizes and bus bandwidth factors, the slowest node against the median node, the verdict between nodes.
// The timing itself runs on the local Slurm cluster (tests/job/check_fabric_test.sh).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <hpctrain/dist/fabric_report.hpp>

namespace dist = hpctrain::dist;
using dist::Collective;

TEST_CASE(
    "The fabric check (--check-fabric) groups the ranks as HSDP does: a node's ranks, and a rail of the k-th rank of "
    "every node",
    "[fabric]") {
  // 3 nodes; the middle one runs 1 rank (uneven tasks per node, as Slurm may place them).
  const auto groups = dist::fabric_groups({0, 0, 1, 2, 2});
  REQUIRE(groups.nodes == std::vector<std::vector<int>>{{0, 1}, {2}, {3, 4}});
  REQUIRE(groups.rails == std::vector<std::vector<int>>{{0, 2, 3}, {1, 4}});
  CHECK(groups.node_of(3) == 2);
  CHECK(groups.rail_of(4) == 1);
  CHECK(groups.rail_of(2) == 0);
  CHECK(dist::rank_list({0, 1, 2, 3}) == "0-3");
  CHECK(dist::rank_list({0, 4, 8}) == "0,4,8");
  CHECK(dist::rank_list({1, 4}) == "1,4");
}

TEST_CASE("The fabric check's sizes and bus bandwidth are nccl-tests': a slice per rank, 2(n-1)/n or (n-1)/n",
          "[fabric]") {
  CHECK(dist::fabric_elements(Collective::all_reduce, 8, 3) == 2);
  CHECK(dist::fabric_elements(Collective::all_gather, 8, 3) == 0);  // too small for a float a rank
  CHECK(dist::fabric_elements(Collective::reduce_scatter, 16, 3) == 3);
  CHECK(dist::fabric_elements(Collective::all_gather, 1 << 20, 4) == (1 << 18));
  CHECK(dist::busbw_factor(Collective::all_reduce, 4) == Approx(1.5));
  CHECK(dist::busbw_factor(Collective::all_gather, 4) == Approx(0.75));
  const dist::CollectiveTiming row{1 << 18, 1e-3, 0};  // 1 MiB in 1 ms
  CHECK(row.algbw_gbps() == Approx(1.048576));
  CHECK(row.busbw_gbps(Collective::reduce_scatter, 2) == Approx(0.524288));
  const auto table = dist::sweep_table(Collective::all_gather, {row}, 2, 10.0);
  CHECK_THAT(table, Catch::Contains("# all_gather over the 2 ranks"));
  CHECK_THAT(table, Catch::Contains("     1048576        262144     float    none      -1   1000.0    1.05    0.52"));
  CHECK_THAT(table, !Catch::Contains("site expects"));  // the site's figure is an all-reduce's
  CHECK_THAT(dist::sweep_table(Collective::all_reduce, {row}, 2, 10.0),
             Catch::Contains("# Peak bus bandwidth   : 1.05 GB/s at 1048576 B; the site expects 10 GB/s: 10% of it"));
}

TEST_CASE("The fabric check names the slowest node by its lowest ratio to the median node over the three collectives",
          "[fabric]") {
  // 4 nodes: node 2's reduce-scatter is half the median's; its all-reduce is level.
  const std::vector<dist::GroupBusbw> nodes = {{100, 80, 80}, {110, 84, 80}, {104, 80, 40}, {96, 76, 84}};
  const auto slowest = dist::slowest_node(nodes);
  REQUIRE(slowest);
  CHECK(slowest->node == 2);
  CHECK(slowest->kind == Collective::reduce_scatter);
  CHECK(slowest->ratio == Approx(0.5));  // median of 80, 80, 40, 84: 80
  CHECK(dist::median_of({3, 1, 2}) == 2);
  CHECK_FALSE(dist::slowest_node({{0, 0, 0}, {0, 0, 0}}));  // one rank a node: nothing within a node
  const hpctrain::dist::FabricGroups groups = dist::fabric_groups({0, 0, 1, 1, 2, 2, 3, 3});
  const auto table = dist::groups_table(groups, {"a1", "a2", "a3", "a4"}, nodes, {{10, 5, 5}, {0, 0, 0}}, 1 << 20);
  CHECK_THAT(table, Catch::Contains("# slowest node: a3, 0.50x the median node's reduce_scatter within a node"));
  CHECK_THAT(table,
             Catch::Contains("  a3                          4,5          104.00           80.00           40.00"));
  CHECK_THAT(table,
             Catch::Contains("  rank 1 of each node     1,3,5,7               -               -               -"));
}

TEST_CASE(
    "The fabric check with --check-fabric-min-fraction fails a fabric below its share of the site's or the preset's "
    "figure",
    "[fabric]") {
  const auto site = hpctrain::fabric_bandwidth(hpctrain::Fabric::ethernet, 10.0);
  const auto preset = hpctrain::fabric_bandwidth(hpctrain::Fabric::infiniband, std::nullopt);
  CHECK(preset.gbps == 45);
  CHECK_FALSE(preset.stated_by_site);
  const std::vector<dist::GroupBusbw> rails = {{8, 4, 4}, {6, 3, 3}};  // the slowest rail's all-reduce: 6 GB/s
  const auto below = dist::between_nodes_verdict(rails, site, 0.8);
  CHECK(below.failed);
  CHECK_THAT(below.text, Catch::Contains("reaches 6.00 GB/s, 60% of 10 GB/s (the site's expected_busbw_gbps): FAILED, "
                                         "--check-fabric-min-fraction 0.8 asks for 80%"));
  CHECK_FALSE(dist::between_nodes_verdict(rails, site, 0.5).failed);
  const auto unasked = dist::between_nodes_verdict(rails, preset, std::nullopt);
  CHECK_FALSE(unasked.failed);
  CHECK_THAT(unasked.text, Catch::Contains("13% of 45 GB/s (the infiniband preset: 400 Gb/s a GPU)\n"));
  const auto one_node = dist::between_nodes_verdict({}, site, 0.8);
  CHECK_FALSE(one_node.failed);
  CHECK_THAT(one_node.text, Catch::Contains("one node"));
}
