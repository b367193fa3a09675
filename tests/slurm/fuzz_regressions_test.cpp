// Regression tests for what the fuzz targets of tests/fuzz found in the Slurm layer; each test is named
// after what broke, and its input also lives in the target's corpus (tests/fuzz/corpus/<target>/).
#include <string>

#include <catch2/catch.hpp>

#include <hpctrain/slurm/environment.hpp>
#include <hpctrain/slurm/hostlist.hpp>

using Catch::Matchers::Contains;

TEST_CASE("A tasks-per-node repeat count larger than any cluster is refused before it is allocated",
          "[fuzz_regression]") {
  // fuzz_tasks_per_node: `8(x444444444)` allocated 1.7 GB, `1(x2000000000)` 8 GB, before any check.
  CHECK_THROWS_WITH(hpctrain::slurm::parse_tasks_per_node("1(x2000000000)", "SLURM_TASKS_PER_NODE"),
                    Contains("[hpctrain.runtime.slurm_env]") && Contains("SLURM_TASKS_PER_NODE") &&
                        Contains("more than 1048576 nodes"));
  CHECK_THROWS_WITH(hpctrain::slurm::parse_tasks_per_node("2(x1048576),1"), Contains("more than 1048576 nodes"));
  CHECK(hpctrain::slurm::parse_tasks_per_node("2(x1048576)").size() == 1048576);
}

TEST_CASE("A hostlist whose items together expand to more hosts than any cluster has is refused", "[fuzz_regression]") {
  // fuzz_hostlist: each item was bounded, the list was not; a few hundred bytes of `n[0-65535],...` expanded
  // to tens of millions of names.
  std::string expression = "n[0-65535]";
  for (int i = 1; i < 17; ++i) expression += fmt::format(",m{}[0-65535]", i);
  CHECK_THROWS_AS(hpctrain::slurm::expand_hostlist(expression), hpctrain::slurm::HostlistError);
  CHECK_THROWS_WITH(hpctrain::slurm::expand_hostlist(expression), Contains("expands to more than 1048576 hosts"));
  CHECK(hpctrain::slurm::expand_hostlist("n[0-65535],m[0-65535]").size() == 2 * 65536);
}
