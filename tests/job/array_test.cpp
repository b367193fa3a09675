// Job arrays: the spec grammar (Slurm's), the rendered directive and per-task paths, and real arrays on the
// local cluster: per-task logs and run directories, --status counts and lists, --logs/--cancel --task N,
// and a requeue that targets one task, not the whole array.
#include <filesystem>
#include <map>
#include <thread>

#include <hpctrain/job/array.hpp>
#include <hpctrain/job/process.hpp>
#include <hpctrain/job/render.hpp>

#include <catch2/catch.hpp>

#include "job_test_support.hpp"

namespace fs = std::filesystem;
namespace ht = hpctrain;
using namespace std::chrono_literals;

TEST_CASE("Array specs expand to the task ids Slurm would run", "[array]") {
  auto [spec, ids, throttle] = GENERATE(table<std::string, std::vector<int>, int>({
      {"0-3", {0, 1, 2, 3}, 0},
      {"0-15%4", {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, 4},
      {"1,3,5", {1, 3, 5}, 0},
      {"0-30:10", {0, 10, 20, 30}, 0},
      {"1-7:3%2", {1, 4, 7}, 2},
      {"7", {7}, 0},
      {"5,0-2", {0, 1, 2, 5}, 0},
  }));
  CAPTURE(spec);
  const auto parsed = ht::parse_array_spec(spec);
  CHECK(parsed.indices == ids);
  CHECK(parsed.throttle.value_or(0) == throttle);
}

TEST_CASE("Array specs Slurm would refuse fail naming the spec and the part", "[array]") {
  auto [spec, message] = GENERATE(table<std::string, std::string>({
      {"", "[hpctrain.spec.array] array = \"\": expected task ids like 0-15, 1,3,5, 0-30:10 or 0-15%4"},
      {"3-1", "[hpctrain.spec.array] array = 3-1: '3-1': the range ends before it starts"},
      {"0-15%0", "[hpctrain.spec.array] array = 0-15%0: the throttle after % must be a whole number >= 1, got '0'"},
      {"0-15%", "[hpctrain.spec.array] array = 0-15%: the throttle after % must be a whole number >= 1, got ''"},
      {"0-10:0", "[hpctrain.spec.array] array = 0-10:0: '0-10:0': the step after : must be a whole number >= 1"},
      {"4:2", "[hpctrain.spec.array] array = 4:2: '4:2': a step needs a range (0-30:10)"},
      {"1,,2", "[hpctrain.spec.array] array = 1,,2: an empty task id between commas"},
      {"-1", "[hpctrain.spec.array] array = -1: '-1': expected a range of whole numbers N-M"},
      {"a-b", "[hpctrain.spec.array] array = a-b: 'a-b': expected a range of whole numbers N-M"},
      {"0-4000001", "[hpctrain.spec.array] array = 0-4000001: '0-4000001': Slurm's task ids stay below 4000001"},
  }));
  CAPTURE(spec);
  CHECK_THROWS_WITH(ht::Job("a").array(spec), message);
}

TEST_CASE("An array renders its directive, per-task logs and run directories, and requeues one task", "[array]") {
  auto context = job_test::fixed_context();
  const auto script = ht::render_sbatch(ht::Job("sweep").array("0-3%2").requeue_on_timeout(60s), context);
  CHECK(script.find("#SBATCH --array=0-3%2\n") != std::string::npos);
  CHECK(script.find("#SBATCH --output=/home/user/project/hpctrain-jobs/sweep/%A/slurm-%A_%a.out\n") !=
        std::string::npos);
  CHECK(script.find("export HPCTRAIN_RUN_DIR=/home/user/project/hpctrain-jobs/sweep/\"$SLURM_ARRAY_JOB_ID/"
                    "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}\"\nmkdir -p \"$HPCTRAIN_RUN_DIR\"\n") !=
        std::string::npos);
  CHECK(script.find("hpctrain_requeue \"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}\"\n") != std::string::npos);
  CHECK(script.find("hpctrain_requeue \"$SLURM_JOB_ID\"") == std::string::npos);
}

TEST_CASE("The cluster's MaxArraySize bounds the task ids before anything is written", "[array][slurm]") {
  const auto dir = job_test::scratch_dir("array-max");
  const auto max = ht::run_process({"scontrol", "show", "config"}).out;
  const auto at = max.find("MaxArraySize");
  REQUIRE(at != std::string::npos);
  const int max_size = std::stoi(max.substr(max.find('=', at) + 1));
  const auto result = job_test::run_probe(dir, {"--submit", "--array", fmt::format("0-{}", max_size)});
  CHECK(result.exit_code == 2);
  CHECK(result.err == fmt::format("[hpctrain.spec.array] array = 0-{0}: task id {0} is not below this cluster's "
                                  "MaxArraySize ({0}; scontrol show config)\n",
                                  max_size));
  CHECK(fs::is_empty(dir));
  const auto fits = job_test::run_probe(dir, {"--dry-run", "--array", fmt::format("0-{}", max_size - 1)});
  CHECK(fits.exit_code == 0);
}

TEST_CASE(
    "A real array: per-task logs and run directories, status, logs and cancel of one task, and a requeue of "
    "one task only",
    "[array][slurm]") {
  const auto dir = job_test::scratch_dir("array");
  const std::vector<std::pair<std::string, std::string>> env = {
      {"PROBE_NAME", "array"}, {"PROBE_NODES", "1"}, {"PROBE_REQUEUE", "1"}};
  // Task 2 asks for a requeue on its first run; task 3 sleeps until it is cancelled.
  const auto submitted = job_test::run_probe(
      dir, {"--submit", "--array", "0-3%2", "--requeue-task", "2", "--sleep-task", "3", "600"}, env);
  CAPTURE(submitted.err);
  REQUIRE(submitted.exit_code == 0);
  const auto id = job_test::submitted_id(submitted.out);
  const auto job_dir = dir / "hpctrain-jobs" / "array" / id;
  CHECK(submitted.out.find(fmt::format("logs: {}/slurm-{}_%a.out", job_dir.string(), id)) != std::string::npos);

  // A second array to cancel as a whole.
  const std::vector<std::pair<std::string, std::string>> env2 = {{"PROBE_NAME", "array-cancel"}, {"PROBE_NODES", "1"}};
  const auto second = job_test::run_probe(
      dir, {"--submit", "--array", "0-1", "--sleep-task", "0", "600", "--sleep-task", "1", "600"}, env2);
  REQUIRE(second.exit_code == 0);
  const auto second_id = job_test::submitted_id(second.out);
  const auto cancelled_all = job_test::run_probe(dir, {"--cancel"}, env2);
  CHECK(cancelled_all.exit_code == 0);
  CHECK(cancelled_all.out == fmt::format("cancelled array job {} (every task)\n", second_id));

  // Task 3 runs (and sleeps): cancel it alone.
  for (int attempt = 0; attempt < 1200; ++attempt) {
    if (job_test::read_file(job_dir / fmt::format("slurm-{}_3.out", id)).find("array_task=3") != std::string::npos)
      break;
    std::this_thread::sleep_for(500ms);
  }
  const auto cancelled = job_test::run_probe(dir, {"--cancel", "--task", "3"}, env);
  CHECK(cancelled.exit_code == 0);
  CHECK(cancelled.out == fmt::format("cancelled task 3 of array job {}\n", id));

  // Wait for every task to end: task 2 comes back after its requeue (about two minutes).
  std::map<int, std::string> states;
  for (int task = 0; task < 4; ++task) {
    const auto task_id = job_test::scontrol_field(fmt::format("{}_{}", id, task), "JobId");
    states[task] = job_test::wait_for_final_state(task_id.empty() ? fmt::format("{}_{}", id, task) : task_id);
  }
  CHECK(states[0] == "COMPLETED");
  CHECK(states[1] == "COMPLETED");
  CHECK(states[2] == "COMPLETED");
  CHECK(states[3] == "CANCELLED");
  // Only task 2 was requeued.
  CHECK(job_test::scontrol_field(fmt::format("{}_2", id), "Restarts") == "1");
  CHECK(job_test::scontrol_field(fmt::format("{}_0", id), "Restarts") == "0");
  CHECK(job_test::scontrol_field(fmt::format("{}_1", id), "Restarts") == "0");

  for (int task = 0; task < 4; ++task) {
    CAPTURE(task);
    const auto log = job_test::read_file(job_dir / fmt::format("slurm-{}_{}.out", id, task));
    const auto run_dir = job_dir / fmt::format("{}_{}", id, task);
    CHECK(fs::is_directory(run_dir));
    CHECK(log.find(fmt::format("probe rank=0 array_job={} array_task={} job=", id, task)) != std::string::npos);
    CHECK(log.find(fmt::format("run_dir={}\n", run_dir.string())) != std::string::npos);
  }
  CHECK(job_test::read_file(job_dir / fmt::format("slurm-{}_2.out", id))
            .find(fmt::format("hpctrain: job {}_2 checkpointed; requeueing (restart 1 of 2)", id)) !=
        std::string::npos);

  const auto status = job_test::run_probe(dir, {"--status"}, env);
  CAPTURE(status.out, status.err);
  CHECK(status.exit_code == 0);
  CHECK(status.out.starts_with(fmt::format("array job {} (array): 4 tasks (0-3%2): 1 CANCELLED, 3 COMPLETED\n", id)));
  for (int task = 0; task < 3; ++task)
    CHECK(status.out.find(fmt::format("  task {}: COMPLETED (job ", task)) != std::string::npos);
  CHECK(status.out.find("  task 3: CANCELLED (job ") != std::string::npos);

  const auto logs = job_test::run_probe(dir, {"--logs", "--task", "1"}, env);
  CHECK(logs.exit_code == 0);
  CHECK(logs.out == job_test::read_file(job_dir / fmt::format("slurm-{}_1.out", id)));
  const auto no_task = job_test::run_probe(dir, {"--logs"}, env);
  CHECK(no_task.exit_code == 2);
  CHECK(no_task.err ==
        fmt::format("[hpctrain.usage] job {} is an array (0-3%2): say which task's log, --logs --task N\n", id));
  const auto bad_task = job_test::run_probe(dir, {"--logs", "--task", "9"}, env);
  CHECK(bad_task.exit_code == 2);
  CHECK(bad_task.err == "[hpctrain.usage] --task 9: array 0-3%2 has no such task\n");
  for (int task = 0; task < 2; ++task)
    CHECK(job_test::wait_for_final_state(fmt::format("{}_{}", second_id, task)) == "CANCELLED");
}
