// World under real srun steps of the local cluster: print_world (tests/slurm/programs) prints each task's
// World as JSON; we check it against the step's shape.
#include <hpctrain/slurm/world.hpp>

#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "test_support.hpp"

namespace {

std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string word; in >> word;) out.push_back(word);
  return out;
}

}  // namespace

TEST_CASE("Every task of an srun step sees its own rank, its node's local ranks and one rendezvous", "[slurm][world]") {
  // launcher: how the step is started; tasks: the step's tasks per node, in step node order (what Slurm's
  // distribution gives); nodes: the step's nodes.
  const auto [launcher, tasks_on, step_nodes] =
      GENERATE(table<std::string, std::map<std::string, int>, std::vector<std::string>>({
          {"srun -N2 -n4", {{"n1", 2}, {"n2", 2}}, {"n1", "n2"}},
          {"srun -N2 -n3", {{"n1", 2}, {"n2", 1}}, {"n1", "n2"}},
          {"srun -N2 -n3 -m cyclic", {{"n1", 2}, {"n2", 1}}, {"n1", "n2"}},
          {"srun -N1 -n2 -w n2", {{"n2", 2}}, {"n2"}},
          // A step on part of the job's nodes: MASTER_ADDR is the step's first node, not the job's.
          {"salloc -N2 -n4 srun -N1 -n2 -w n2", {{"n2", 2}}, {"n2"}},
      }));
  CAPTURE(launcher);
  auto command = words(launcher);
  command.push_back(hpctrain::test::print_world_program());
  const auto result = hpctrain::test::run_command(command);
  CAPTURE(result.err);
  REQUIRE(result.exit_code == 0);
  const auto tasks = json_lines(result.out);
  int world_size = 0;
  for (const auto& [node, count] : tasks_on) world_size += count;
  REQUIRE(static_cast<int>(tasks.size()) == world_size);

  std::set<int> ranks;
  std::map<std::string, std::set<int>> local_ranks;
  const auto& first = tasks.front();
  for (const auto& task : tasks) {
    CAPTURE(task.dump());
    ranks.insert(task["rank"].get<int>());
    const auto node = task["node"].get<std::string>();
    local_ranks[node].insert(task["local_rank"].get<int>());
    CHECK(task["world_size"] == world_size);
    CHECK(task["local_world_size"] == tasks_on.at(node));
    CHECK(step_nodes.at(task["node_rank"].get<std::size_t>()) == node);
    CHECK(task["master_addr"] == step_nodes.front());
    CHECK(task["master_port"] == first["master_port"]);
    CHECK(task["job_id"] == first["job_id"]);
    CHECK(task["restart_count"] == 0);
    CHECK(task["under_slurm"] == true);
  }
  CHECK(static_cast<int>(ranks.size()) == world_size);
  CHECK(*ranks.rbegin() == world_size - 1);
  for (const auto& [node, count] : tasks_on) {
    CAPTURE(node);
    std::set<int> expected;
    for (int i = 0; i < count; ++i) expected.insert(i);
    CHECK(local_ranks[node] == expected);
  }
  CHECK(first["master_port"] == hpctrain::slurm::derive_master_port(std::stol(first["job_id"].get<std::string>()), 0));
}

TEST_CASE("MASTER_PORT exported to an srun step overrides the derived port", "[slurm][world]") {
  const auto result = hpctrain::test::run_command(
      {"srun", "-N2", "-n2", "--export=ALL,MASTER_PORT=23456", hpctrain::test::print_world_program()});
  CAPTURE(result.err);
  REQUIRE(result.exit_code == 0);
  const auto tasks = json_lines(result.out);
  REQUIRE(tasks.size() == 2);
  for (const auto& task : tasks) CHECK(task["master_port"] == 23456);
}
