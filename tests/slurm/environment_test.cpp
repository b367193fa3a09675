#include <hpctrain/slurm/environment.hpp>
#include <hpctrain/slurm/world.hpp>

#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "test_support.hpp"

namespace {

using Variables = std::map<std::string, std::string>;

hpctrain::slurm::EnvironmentLookup lookup_in(const Variables& variables) {
  return [variables](const std::string& name) -> std::optional<std::string> {
    const auto found = variables.find(name);
    if (found == variables.end() || found->second.empty()) return std::nullopt;
    return found->second;
  };
}

// What srun -N2 -n3 gives the task with SLURM_PROCID=2 (the second node's only task), taken from the local cluster.
Variables third_task_of_three() {
  return {{"SLURM_PROCID", "2"},
          {"SLURM_NTASKS", "3"},
          {"SLURM_STEP_NUM_TASKS", "3"},
          {"SLURM_LOCALID", "0"},
          {"SLURM_NODEID", "1"},
          {"SLURM_STEP_NODELIST", "n[1-2]"},
          {"SLURM_JOB_NODELIST", "n[1-2]"},
          {"SLURM_STEP_TASKS_PER_NODE", "2,1"},
          {"SLURM_TASKS_PER_NODE", "2,1"},
          {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_JOB_ID", "1234"},
          {"SLURM_STEP_ID", "0"},
          {"SLURMD_NODENAME", "n2"}};
}

using hpctrain::test::message_of;

}  // namespace

TEST_CASE("Compressed tasks-per-node lists expand", "[slurm_env]") {
  const auto [text, counts] = GENERATE(table<std::string, std::vector<int>>({
      {"4", {4}},
      {"2(x3),1", {2, 2, 2, 1}},
      {"1,2(x2)", {1, 2, 2}},
      {"8(x1)", {8}},
      {"3,3,2", {3, 3, 2}},
  }));
  CAPTURE(text);
  CHECK(hpctrain::slurm::parse_tasks_per_node(text) == counts);
}

TEST_CASE("Malformed tasks-per-node lists are errors naming the variable", "[slurm_env]") {
  const auto [text, message] = GENERATE(table<std::string, std::string>({
      {"", "SLURM_STEP_TASKS_PER_NODE = \"\": not an integer"},
      {"2(x", "SLURM_STEP_TASKS_PER_NODE = \"2(x\": malformed item \"2(x\" (expected N or N(xM))"},
      {"2(3)", "SLURM_STEP_TASKS_PER_NODE = \"2(3)\": malformed item \"2(3)\" (expected N or N(xM))"},
      {"2(x0)", "SLURM_STEP_TASKS_PER_NODE = \"0\": must be at least 1"},
      {"0,1", "SLURM_STEP_TASKS_PER_NODE = \"0\": must be at least 1"},
      {"a", "SLURM_STEP_TASKS_PER_NODE = \"a\": not an integer"},
      {"1,,2", "SLURM_STEP_TASKS_PER_NODE = \"\": not an integer"},
  }));
  CAPTURE(text);
  CHECK(message_of([&] { hpctrain::slurm::parse_tasks_per_node(text); }) == "[hpctrain.runtime.slurm_env] " + message);
}

TEST_CASE("A step's SLURM variables become a typed environment", "[slurm_env]") {
  auto variables = third_task_of_three();
  variables["SLURM_ARRAY_JOB_ID"] = "1200";
  variables["SLURM_ARRAY_TASK_ID"] = "34";
  variables["SLURM_RESTART_COUNT"] = "2";
  const auto env = hpctrain::slurm::read_slurm_environment(lookup_in(variables));
  CHECK(env.proc_id == 2);
  CHECK(env.num_tasks == 3);
  CHECK(env.local_id == 0);
  CHECK(env.node_id == 1);
  CHECK(env.nodelist == "n[1-2]");
  CHECK(env.nodes == std::vector<std::string>{"n1", "n2"});
  CHECK(env.tasks_per_node == std::vector<int>{2, 1});
  CHECK(env.local_num_tasks() == 1);
  CHECK(env.node() == "n2");
  CHECK(env.job_id == "1234");
  CHECK(env.step_id == 0);
  CHECK(env.array_job_id == "1200");
  CHECK(env.array_task_id == 34);
  CHECK(env.restart_count == 2);
}

TEST_CASE("The step's node list wins over the job's, which is the fallback", "[slurm_env]") {
  auto variables = third_task_of_three();
  variables["SLURM_JOB_NODELIST"] = "n[1-4]";
  CHECK(hpctrain::slurm::read_slurm_environment(lookup_in(variables)).nodes == std::vector<std::string>{"n1", "n2"});
  variables.erase("SLURM_STEP_NODELIST");
  variables["SLURM_JOB_NODELIST"] = "m[3-4]";
  variables["SLURMD_NODENAME"] = "m4";
  CHECK(hpctrain::slurm::read_slurm_environment(lookup_in(variables)).nodes == std::vector<std::string>{"m3", "m4"});
}

TEST_CASE("A step smaller than its job has the step's task count, not the job's (Lightning #20391)", "[slurm_env]") {
  // `sbatch --ntasks=8` then `srun -N2 -n3`: the job's SLURM_NTASKS and SLURM_TASKS_PER_NODE stay in the
  // environment next to the step's; a world of 8 would wait for 5 ranks that never come.
  auto variables = third_task_of_three();
  variables["SLURM_NTASKS"] = "8";
  variables["SLURM_TASKS_PER_NODE"] = "4(x2)";
  const auto env = hpctrain::slurm::read_slurm_environment(lookup_in(variables));
  CHECK(env.num_tasks == 3);
  CHECK(env.tasks_per_node == std::vector<int>{2, 1});
  CHECK(env.local_num_tasks() == 1);
  // Without the step's variables (a launcher that sets only the job's), the job's are the fallback.
  variables.erase("SLURM_STEP_NUM_TASKS");
  variables.erase("SLURM_STEP_TASKS_PER_NODE");
  variables["SLURM_NTASKS"] = "3";
  variables["SLURM_TASKS_PER_NODE"] = "2,1";
  CHECK(hpctrain::slurm::read_slurm_environment(lookup_in(variables)).num_tasks == 3);
}

TEST_CASE("The batch script itself is not taken for rank 0 of the job", "[slurm_env]") {
  // What `sbatch -N2 -n4` gives its batch script on the local cluster: SLURM_PROCID=0 and the job's task count.
  const Variables batch_script{{"SLURM_JOB_ID", "77"},       {"SLURM_JOB_NODELIST", "n[1-2]"},
                               {"SLURM_NODELIST", "n[1-2]"}, {"SLURM_LOCALID", "0"},
                               {"SLURM_NODEID", "0"},        {"SLURM_NTASKS", "4"},
                               {"SLURM_PROCID", "0"},        {"SLURM_TASKS_PER_NODE", "2(x2)"}};
  CHECK(message_of([&] { hpctrain::slurm::world_from_environment(lookup_in(batch_script)); }) ==
        "[hpctrain.runtime.slurm_env] SLURM_PROCID is set but SLURM_STEP_ID is not: this process is a batch script or "
        "an allocation's shell, not a task of an srun step; start it with srun");
}

TEST_CASE("Missing SLURM variables are named together in one error", "[slurm_env]") {
  auto variables = third_task_of_three();
  for (const char* name :
       {"SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_JOB_ID"})
    variables.erase(name);
  CHECK(
      message_of([&] { hpctrain::slurm::read_slurm_environment(lookup_in(variables)); }) ==
      "[hpctrain.runtime.slurm_env] missing SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST), "
      "SLURM_JOB_ID (srun sets them for every task of a step)");
}

TEST_CASE("Contradictory SLURM variables are an error naming both sides", "[slurm_env]") {
  const auto [name, value, message] = GENERATE(table<std::string, std::string, std::string>({
      {"SLURM_PROCID", "3", "SLURM_PROCID = 3 is not below SLURM_STEP_NUM_TASKS = 3"},
      {"SLURM_PROCID", "-1", "SLURM_PROCID = \"-1\": must be at least 0"},
      {"SLURM_NODEID", "2", "SLURM_NODEID = 2 but SLURM_STEP_NODELIST = \"n[1-2]\" has 2 nodes"},
      {"SLURM_LOCALID", "1", "SLURM_LOCALID = 1 is not below the 1 tasks that SLURM_STEP_TASKS_PER_NODE gives node 1"},
      {"SLURM_STEP_TASKS_PER_NODE", "2(x2)",
       "SLURM_STEP_TASKS_PER_NODE = \"2(x2)\" sums to 4 but SLURM_STEP_NUM_TASKS = 3"},
      {"SLURM_STEP_TASKS_PER_NODE", "3",
       "SLURM_STEP_TASKS_PER_NODE = \"3\" lists 1 nodes but SLURM_STEP_NODELIST = \"n[1-2]\" has 2"},
      {"SLURM_STEP_NUM_NODES", "3", "SLURM_STEP_NUM_NODES = 3 but SLURM_STEP_NODELIST = \"n[1-2]\" has 2 nodes"},
      {"SLURMD_NODENAME", "n1", "SLURMD_NODENAME = n1 but SLURM_NODEID = 1 is n2 in SLURM_STEP_NODELIST = \"n[1-2]\""},
      {"SLURM_STEP_NODELIST", "n[2-1]",
       "SLURM_STEP_NODELIST is not a hostlist: [hpctrain.runtime.hostlist] hostlist \"n[2-1]\": descending range 2-1 "
       "at "
       "position 2"},
      {"SLURM_NTASKS", "x", "(no error)"},  // the step's own count wins; SLURM_NTASKS is not read then
      {"SLURM_STEP_NUM_TASKS", "three", "SLURM_STEP_NUM_TASKS = \"three\": not an integer"},
      {"SLURM_RESTART_COUNT", "1x", "SLURM_RESTART_COUNT = \"1x\": not an integer"},
  }));
  CAPTURE(name, value);
  auto variables = third_task_of_three();
  variables[name] = value;
  const std::string expected = message == "(no error)" ? message : "[hpctrain.runtime.slurm_env] " + message;
  CHECK(message_of([&] { hpctrain::slurm::read_slurm_environment(lookup_in(variables)); }) == expected);
}

TEST_CASE("Under srun the world comes from SLURM variables and the port from the job id", "[world]") {
  auto variables = third_task_of_three();
  variables["SLURM_RESTART_COUNT"] = "1";
  const auto world = hpctrain::slurm::world_from_environment(lookup_in(variables));
  CHECK(world.rank == 2);
  CHECK(world.world_size == 3);
  CHECK(world.local_rank == 0);
  CHECK(world.local_world_size == 1);
  CHECK(world.node_rank == 1);
  CHECK(world.master_addr == "n1");
  CHECK(world.master_port == 20000 + 234 * 10 + 1);
  CHECK(world.job_id == "1234");
  CHECK(world.restart_count == 1);
  CHECK(world.under_slurm);
}

TEST_CASE("Derived master ports stay in their documented range and differ between nearby jobs and restarts",
          "[world]") {
  using hpctrain::slurm::derive_master_port;
  std::vector<int> seen;
  for (long job = 5000; job < 6000; ++job)
    for (int restart = 0; restart < 10; ++restart) {
      const int port = derive_master_port(job, restart);
      CAPTURE(job, restart);
      REQUIRE(port >= hpctrain::slurm::master_port_base);
      REQUIRE(port < hpctrain::slurm::master_port_base + hpctrain::slurm::master_port_span);
      seen.push_back(port);
    }
  std::sort(seen.begin(), seen.end());
  CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
}

TEST_CASE("MASTER_ADDR and MASTER_PORT override the derived rendezvous", "[world]") {
  auto variables = third_task_of_three();
  variables["MASTER_ADDR"] = "10.1.2.3";
  variables["MASTER_PORT"] = "23456";
  const auto world = hpctrain::slurm::world_from_environment(lookup_in(variables));
  CHECK(world.master_addr == "10.1.2.3");
  CHECK(world.master_port == 23456);
  for (const char* bad : {"0", "65536", "http", "80x"}) {
    variables["MASTER_PORT"] = bad;
    CAPTURE(bad);
    CHECK(message_of([&] { hpctrain::slurm::world_from_environment(lookup_in(variables)); }) ==
          fmt::format("[hpctrain.runtime.slurm_env] MASTER_PORT = \"{}\": not a port number (1-65535)", bad));
  }
}

TEST_CASE("torchrun-style variables win over SLURM ones", "[world]") {
  auto variables = third_task_of_three();
  variables.insert({{"HPCTRAIN_LOCAL", "1"},
                    {"RANK", "1"},
                    {"WORLD_SIZE", "2"},
                    {"LOCAL_RANK", "1"},
                    {"LOCAL_WORLD_SIZE", "2"},
                    {"MASTER_ADDR", "127.0.0.1"},
                    {"MASTER_PORT", "40001"}});
  const auto world = hpctrain::slurm::world_from_environment(lookup_in(variables));
  CHECK(world.rank == 1);
  CHECK(world.world_size == 2);
  CHECK(world.local_rank == 1);
  CHECK(world.local_world_size == 2);
  CHECK(world.node_rank == 0);
  CHECK(world.master_addr == "127.0.0.1");
  CHECK(world.master_port == 40001);
  CHECK(world.job_id == "1234");
  CHECK_FALSE(world.under_slurm);
}

TEST_CASE("Inconsistent torchrun-style variables are errors naming them", "[world]") {
  const auto [variables, message] = GENERATE(table<Variables, std::string>({
      {{{"HPCTRAIN_LOCAL", "1"}},
       "missing RANK, WORLD_SIZE (HPCTRAIN_LOCAL or RANK says the ranks come from torchrun-style variables)"},
      {{{"RANK", "0"}},
       "missing WORLD_SIZE (HPCTRAIN_LOCAL or RANK says the ranks come from torchrun-style variables)"},
      {{{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "RANK = 2 is not below WORLD_SIZE = 2"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "3"}}, "LOCAL_WORLD_SIZE = 3 exceeds WORLD_SIZE = 2"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}}, "LOCAL_RANK = 2 is not below LOCAL_WORLD_SIZE = 2"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}},
       "WORLD_SIZE = 2 needs MASTER_ADDR and MASTER_PORT for the rendezvous"},
  }));
  CAPTURE(variables);
  CHECK(message_of([&] { hpctrain::slurm::world_from_environment(lookup_in(variables)); }) ==
        "[hpctrain.runtime.slurm_env] " + message);
}

TEST_CASE("Outside Slurm and any launcher the world is a single local process", "[world]") {
  const auto world = hpctrain::slurm::world_from_environment(lookup_in({}));
  CHECK(world.rank == 0);
  CHECK(world.world_size == 1);
  CHECK(world.local_world_size == 1);
  CHECK(world.master_addr == "127.0.0.1");
  CHECK(world.master_port == hpctrain::slurm::default_master_port);
  CHECK(world.job_id == "local");
  CHECK_FALSE(world.under_slurm);
}

TEST_CASE("Host names resolve to numeric addresses, unknown ones to an error naming them", "[world]") {
  CHECK(hpctrain::slurm::resolve_address("127.0.0.1") == "127.0.0.1");
  CHECK(hpctrain::slurm::resolve_address("localhost") == "127.0.0.1");
  const std::string message = message_of([] { hpctrain::slurm::resolve_address("no-such-host.invalid"); });
  CHECK_THAT(message, Catch::StartsWith("[hpctrain.runtime.resolve] cannot resolve host \"no-such-host.invalid\": "));
}

#include <hpctrain/slurm/devices.hpp>

TEST_CASE("The CUDA device follows CUDA_VISIBLE_DEVICES, never the node's GPUs by local rank", "[devices]") {
  // {local rank, devices the process sees, device index}. submitit #1704, Lightning #16828: with --gpus-per-task=1
  // or --gpu-bind each task sees one GPU, renumbered 0, and cuda:<local rank> does not exist.
  const auto [local_rank, visible, expected] = GENERATE(table<int, int, int>({
      {3, 4, 3},  // --gpus-per-node=4, 4 tasks: every rank sees every GPU
      {0, 4, 0},
      {3, 1, 0},  // --gpus-per-task=1: one visible GPU each
      {1, 1, 0},
      {3, 2, 1},  // --gpus-per-task=2 with 4 tasks: an index among its own two
      {2, 2, 0},
  }));
  CAPTURE(local_rank, visible);
  CHECK(hpctrain::slurm::cuda_device_for(local_rank, visible) == expected);
  CHECK(hpctrain::slurm::cuda_device_for(local_rank, visible) < visible);
}

TEST_CASE("A rank that sees no CUDA device is an error naming it", "[devices]") {
  CHECK_THROWS_WITH(hpctrain::slurm::cuda_device_for(2, 0),
                    Catch::StartsWith("[hpctrain.runtime.cuda_device] local rank 2 sees no CUDA device"));
}
