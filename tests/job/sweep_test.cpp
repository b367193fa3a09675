// Sweeps on job arrays: the combinations a grid and named configurations make, the checks at construction
// and against the knob table (every combination, before anything is written or queued), the script's
// per-task values (quoted: hostile values reach the worker byte-identical and run nothing), and on the local
// cluster a real sweep whose --results lists every task best first.
#include <filesystem>
#include <string>
#include <vector>

#include <hpctrain/job/cli.hpp>
#include <hpctrain/job/results.hpp>
#include <hpctrain/job/sweep.hpp>

#include <catch2/catch.hpp>

#include "job_test_support.hpp"

namespace fs = std::filesystem;
namespace ht = hpctrain;
using namespace std::chrono_literals;

namespace {
std::vector<std::string> described(const ht::Sweep& sweep) {
  std::vector<std::string> names;
  for (const auto& combination : sweep.combinations())
    names.push_back(fmt::format("{}: {}", combination.task, combination.describe()));
  return names;
}

ht::Knobs probe_knobs() {
  ht::Knobs knobs;
  knobs.declare<double>("lr", 1e-3, "base learning rate", ht::positive())
      .declare<std::int64_t>("batch_size", 64, "examples per step", ht::positive())
      .declare<std::int64_t>("warmup_steps", 100, "steps of linear warm-up", ht::non_negative())
      .declare<std::string>("optimizer", "adamw", "adamw or sgd");
  return knobs;
}

/// Jobs (any user's) whose working directory is `dir`: squeue's %Z.
std::vector<std::string> jobs_in(const fs::path& dir) {
  const auto queued = ht::run_process({"squeue", "--noheader", "--format", "%i %Z"}).out;
  std::vector<std::string> ids;
  std::stringstream lines(queued);
  for (std::string id, where; lines >> id >> where;)
    if (where == dir.string()) ids.push_back(id);
  return ids;
}
}  // namespace

TEST_CASE("A grid is the product of its knobs' values, the first knob varying slowest", "[sweep]") {
  const auto sweep = ht::Sweep().grid("lr", {3e-4, 1e-3}).grid("batch_size", {64, 128});
  CHECK(sweep.size() == 4);
  CHECK(described(sweep) == std::vector<std::string>{"0: lr=0.0003 batch_size=64", "1: lr=0.0003 batch_size=128",
                                                     "2: lr=0.001 batch_size=64", "3: lr=0.001 batch_size=128"});
  CHECK(sweep.array().text == "0-3");
  CHECK(ht::Sweep(sweep).max_parallel(2).array().text == "0-3%2");
}

TEST_CASE("Named configurations are combinations too, crossed with the grid", "[sweep]") {
  const auto sweep = ht::Sweep()
                         .configuration("small", {{"lr", 1e-3}, {"batch_size", 64}})
                         .configuration("large", {{"lr", 3e-4}, {"batch_size", 256}, {"optimizer", "sgd"}})
                         .grid("warmup_steps", {0, 100});
  CHECK(described(sweep) ==
        std::vector<std::string>{"0: small lr=0.001 batch_size=64 warmup_steps=0",
                                 "1: small lr=0.001 batch_size=64 warmup_steps=100",
                                 "2: large lr=0.0003 batch_size=256 optimizer=sgd warmup_steps=0",
                                 "3: large lr=0.0003 batch_size=256 optimizer=sgd warmup_steps=100"});
  CHECK(described(ht::Sweep().configuration("baseline", {}).configuration("fast", {{"lr", 0.01}})) ==
        std::vector<std::string>{"0: baseline", "1: fast lr=0.01"});
}

TEST_CASE("A malformed sweep fails where it is built, naming the part", "[sweep]") {
  using Build = std::function<void()>;
  auto [build, message] = GENERATE(table<Build, std::string>({
      {[] { ht::Sweep().grid("lr", {}); }, "[hpctrain.spec.sweep] sweep = lr: a grid needs at least one value"},
      {[] { ht::Sweep().grid("lr", {1}).grid("lr", {2}); }, "[hpctrain.spec.sweep] sweep = lr: is in the grid twice"},
      {[] { ht::Sweep().grid("batch-size", {1}).grid("batch_size", {2}); },
       "[hpctrain.spec.sweep] sweep = batch_size: is in the grid twice"},
      {[] { ht::Sweep().grid("lr rate", {1}); },
       "[hpctrain.spec.sweep] sweep = lr rate: a knob name is one word without '='"},
      {[] {
         ht::Sweep().configuration("a", {{"lr", 1}}).configuration("a", {{"lr", 2}});
       },
       "[hpctrain.spec.sweep] sweep = a: two configurations have this name"},
      {[] {
         ht::Sweep().configuration("a", {{"lr", 1}, {"lr", 2}});
       },
       "[hpctrain.spec.sweep] sweep = a lr: the configuration gives this knob twice"},
      {[] {
         ht::Sweep().configuration("a", {{"lr", 1}}).grid("lr", {2});
       },
       "[hpctrain.spec.sweep] sweep = lr: is both in the grid and in configuration a"},
      {[] { ht::Sweep().max_parallel(0); }, "[hpctrain.spec.sweep] sweep = max_parallel(0): must be at least 1"},
      {[] { ht::Job("j").sweep(ht::Sweep()); },
       "[hpctrain.spec.sweep] sweep = Sweep(): a sweep needs a grid or a configuration"},
  }));
  CHECK_THROWS_WITH(build(), message);
}

TEST_CASE("Every combination is checked with the knob table, naming the combination, knob and value", "[sweep]") {
  const auto knobs = probe_knobs();
  SECTION("good values are spelled as the table spells them") {
    const auto resolved = ht::resolve_sweep(ht::Sweep().grid("lr", {3e-4, "1e-3"}).grid("batch-size", {64}), knobs);
    CHECK(resolved.args ==
          std::vector<std::vector<std::string>>{{"--lr=0.0003", "--batch-size=64"}, {"--lr=0.001", "--batch-size=64"}});
    CHECK(resolved.combinations[1].describe() == "lr=0.001 batch_size=64");
  }
  auto [sweep, message] = GENERATE(table<ht::Sweep, std::string>({
      {ht::Sweep().grid("lr", {0.1, 0.2, 0.3, -1}).grid("batch_size", {64, 128}),
       "[hpctrain.spec.sweep] sweep combination 6 (lr=-1 batch_size=64): --lr = -1: must be positive"},
      {ht::Sweep().grid("batch_size", {64, 0.5}),
       "[hpctrain.spec.sweep] sweep combination 1 (batch_size=0.5): --batch-size = 0.5: expected an integer"},
      {ht::Sweep().configuration("ok", {{"lr", 0.1}}).configuration("broken", {{"warmup_steps", -3}}),
       "[hpctrain.spec.sweep] sweep combination 1 (broken warmup_steps=-3): --warmup-steps = -3: must not be negative"},
      {ht::Sweep().grid("lr", {0.1}).grid("warmup_step", {1, 2}),
       "[hpctrain.spec.sweep] sweep over warmup_step: no such knob (did you mean --warmup-steps?)"},
      {ht::Sweep().grid("dropout", {0.1}), "[hpctrain.spec.sweep] sweep over dropout: no such knob"},
  }));
  CHECK_THROWS_WITH(ht::resolve_sweep(sweep, knobs), message);
}

TEST_CASE("A sweep renders its array and hands each task its values, quoted", "[sweep]") {
  auto context = job_test::fixed_context();
  auto job = ht::Job("sweep").sweep(ht::Sweep().grid("lr", {3e-4, 1e-3}).grid("batch_size", {64, 128}).max_parallel(2));
  context.sweep = ht::resolve_sweep(*job.sweep(), probe_knobs());
  const auto script = ht::render_sbatch(job, context);
  CHECK(script.find("#SBATCH --array=0-3%2\n") != std::string::npos);
  CHECK(script.find("#SBATCH --output=/home/user/project/hpctrain-jobs/sweep/%A/slurm-%A_%a.out\n") !=
        std::string::npos);
  CHECK(script.find("case \"$SLURM_ARRAY_TASK_ID\" in\n"
                    "  0) sweep_args=(--lr=0.0003 --batch-size=64) ;;  # lr=0.0003 batch_size=64\n"
                    "  1) sweep_args=(--lr=0.0003 --batch-size=128) ;;  # lr=0.0003 batch_size=128\n"
                    "  2) sweep_args=(--lr=0.001 --batch-size=64) ;;  # lr=0.001 batch_size=64\n"
                    "  3) sweep_args=(--lr=0.001 --batch-size=128) ;;  # lr=0.001 batch_size=128\n"
                    "  *) echo \"hpctrain: array task $SLURM_ARRAY_TASK_ID is no combination of this sweep (0-3)\" "
                    ">&2; exit 2 ;;\n"
                    "esac\n") != std::string::npos);
  CHECK(script.find("/home/user/project/build/train --hpctrain-worker \"${sweep_args[@]}\" || status=$?\n") !=
        std::string::npos);
  SECTION("an explicit array may throttle or pick tasks, but only ids that are combinations") {
    CHECK(ht::render_sbatch(ht::Job(job).array("1,3%1"), context).find("#SBATCH --array=1,3%1\n") != std::string::npos);
    CHECK_THROWS_WITH(ht::render_sbatch(ht::Job(job).array("0-4"), context),
                      "[hpctrain.spec.sweep] sweep = --array=0-4: task 4 has no combination: the sweep has 4 (0-3)");
  }
}

TEST_CASE("Hostile sweep values reach each task's worker byte-identical and run nothing", "[sweep][quoting]") {
  const auto dir = job_test::scratch_dir("sweep-quoting");
  const auto canary = (dir / "CANARY").string();
  const std::vector<std::string> hostile = {"plain",
                                            "two words",
                                            "it's",
                                            "$(touch " + canary + ")",
                                            "`touch " + canary + "`",
                                            "a\"b\\c",
                                            "line\nbreak",
                                            "; touch " + canary,
                                            "${HOME}",
                                            "-- --lr=9",
                                            "' ; touch " + canary + " '",
                                            "*"};
  ht::Sweep sweep;
  for (std::size_t i = 0; i < hostile.size(); ++i)
    sweep.configuration(fmt::format("c{}", i), {{"optimizer", hostile[i]}});
  auto job = ht::Job("sweep-quoting").sweep(sweep);
  auto context = job_test::fixed_context();
  context.program = job_test::probe();
  context.workdir = dir.string();
  context.sweep = ht::resolve_sweep(sweep, probe_knobs());
  const auto script_path = dir / "job.sbatch";
  job_test::write_file(script_path, ht::render_sbatch(job, context));
  for (std::size_t task = 0; task < hostile.size(); ++task) {
    CAPTURE(task, hostile[task]);
    const auto result = ht::run_process(
        {"bash", "-c", "srun() { while [[ $1 == --* ]]; do shift; done; \"$@\"; }; source \"$1\"", "bash",
         script_path.string()},
        {{"SLURM_ARRAY_JOB_ID", "77"}, {"SLURM_ARRAY_TASK_ID", std::to_string(task)}, {"SLURM_JOB_ID", "78"}},
        dir.string());
    CAPTURE(result.err);
    REQUIRE(result.exit_code == 0);
    CHECK(result.out.find("arg0=" + job_test::hex("--optimizer=" + hostile[task]) + "\n") != std::string::npos);
    CHECK(result.out.find(" arg1=") == std::string::npos);
  }
  const auto outside = ht::run_process({"bash", script_path.string()},
                                       {{"SLURM_ARRAY_JOB_ID", "77"}, {"SLURM_ARRAY_TASK_ID", "99"}}, dir.string());
  CHECK(outside.exit_code == 2);
  CHECK(outside.err == "hpctrain: array task 99 is no combination of this sweep (0-11)\n");
  CHECK_FALSE(fs::exists(canary));
}

TEST_CASE("The results table reads each task's last train loss and last evaluation from metrics.jsonl",
          "[sweep][results]") {
  const auto dir = job_test::scratch_dir("results-metrics");
  job_test::write_file(dir / "metrics.jsonl",
                       "{\"step\": 10, \"epoch\": 0, \"loss\": 2.5, \"lr\": 0.1}\n"
                       "{\"step\": 10, \"eval_loss\": 2.0, \"eval_accuracy\": 0.5, \"eval_examples\": 100}\n"
                       "{\"step\": 20, \"epoch\": 0, \"loss\": 1.5, \"lr\": 0.1}\n"
                       "{\"step\": 20, \"eval_loss\": 1.25, \"eval_accuracy\": 0.75, \"eval_examples\": 100}\n"
                       "{\"step\": 30, \"epoch\": 1, \"loss\": 1.0, \"lr\"");  // torn: a task still writing
  const auto [step, metrics] = ht::read_final_metrics(dir / "metrics.jsonl");
  CHECK(step == 20);
  CHECK(metrics == std::map<std::string, double>{{"loss", 1.5}, {"eval_loss", 1.25}, {"eval_accuracy", 0.75}});
  const auto [no_step, none] = ht::read_final_metrics(dir / "absent.jsonl");
  CHECK_FALSE(no_step);
  CHECK(none.empty());
}

TEST_CASE("The results table ranks by the validation loss, or by accuracy higher first, or as --sort-by says",
          "[sweep][results]") {
  std::vector<ht::TaskResult> rows(3);
  rows[0] = {0, "", {{"lr", "0.1"}}, "COMPLETED", 20, {{"loss", 0.5}, {"eval_loss", 0.9}, {"eval_accuracy", 0.7}}};
  rows[1] = {1, "", {{"lr", "0.2"}}, "FAILED", 10, {{"loss", 0.7}}};
  rows[2] = {2, "", {{"lr", "0.3"}}, "COMPLETED", 20, {{"loss", 0.6}, {"eval_loss", 0.8}, {"eval_accuracy", 0.6}}};
  const auto order_of = [&](std::optional<std::string> sort_by) {
    auto sorted = rows;
    ht::sort_results(sorted, ht::result_order(sort_by, sorted));
    std::vector<int> tasks;
    for (const auto& row : sorted) tasks.push_back(row.task);
    return tasks;
  };
  CHECK(order_of(std::nullopt) == std::vector<int>{2, 0, 1});
  CHECK(order_of("accuracy") == std::vector<int>{0, 2, 1});
  CHECK(order_of("eval_accuracy:min") == std::vector<int>{2, 0, 1});
  CHECK(order_of("loss") == std::vector<int>{0, 2, 1});
  CHECK_THROWS_WITH(
      order_of("bleu"),
      "[hpctrain.usage] --sort-by bleu: no task has this metric; they have: eval_accuracy, eval_loss, loss");
  ht::SubmittedJob job{"41", "sweep", "/tmp", "", ""};
  auto sorted = rows;
  const auto order = ht::result_order(std::nullopt, sorted);
  ht::sort_results(sorted, order);
  CHECK(ht::format_results(job, sorted, order) ==
        "job 41 (sweep): 3 tasks (2 COMPLETED, 1 FAILED); best first by eval_loss (lower is better)\n"
        "task  lr   state      step  loss  eval_loss  eval_accuracy\n"
        "2     0.3  COMPLETED  20    0.6   0.8        0.6\n"
        "0     0.1  COMPLETED  20    0.5   0.9        0.7\n"
        "1     0.2  FAILED     10    0.7   -          -\n");
}

TEST_CASE("A bad sweep at --submit exits 2 naming the combination or the knob, writing and queueing nothing",
          "[sweep][slurm]") {
  const auto dir = job_test::scratch_dir("sweep-refused");
  auto [kind, message] = GENERATE(table<std::string, std::string>({
      {"bad", "[hpctrain.spec.sweep] sweep combination 6 (lr=-0.5 warmup_steps=0): --lr = -0.5: must be positive\n"},
      {"undeclared", "[hpctrain.spec.sweep] sweep over warmup_step: no such knob (did you mean --warmup-steps?)\n"},
  }));
  CAPTURE(kind);
  const auto before = jobs_in(dir);
  const auto result = job_test::run_probe(dir, {"--submit"}, {{"PROBE_KNOBS", "1"}, {"PROBE_SWEEP", kind}});
  CHECK(result.exit_code == 2);
  CHECK(result.err == message);
  CHECK(fs::is_empty(dir));
  CHECK(jobs_in(dir) == before);
  const auto dry = job_test::run_probe(dir, {"--dry-run"}, {{"PROBE_KNOBS", "1"}, {"PROBE_SWEEP", kind}});
  CHECK(dry.exit_code == 2);
  CHECK(dry.err == message);
}

TEST_CASE("A sweep runs one array task per combination and --results lists them best first", "[sweep][slurm]") {
  const auto dir = job_test::scratch_dir("sweep-results");
  const std::vector<std::pair<std::string, std::string>> env = {
      {"PROBE_KNOBS", "1"}, {"PROBE_SWEEP", "good"}, {"PROBE_NODES", "1"}, {"PROBE_SLEEP", "4"}};
  const auto swept_too = job_test::run_probe(dir, {"--submit", "--lr", "0.5"}, env);
  CHECK(swept_too.exit_code == 2);
  CHECK(swept_too.err == "[hpctrain.usage] --lr is swept (lr); leave it off the command line or out of the sweep\n");
  CHECK(fs::is_empty(dir));

  const auto submitted = job_test::run_probe(dir, {"--submit", "--compile"}, env);
  REQUIRE(submitted.exit_code == 0);
  const auto id = job_test::submitted_id(submitted.out);
  REQUIRE(!id.empty());
  // Right after the submission no task can have finished (each sleeps): a clear message, exit 2.
  const auto early = job_test::run_probe(dir, {"--results"}, env);
  CHECK(early.exit_code == 2);
  CHECK(early.err.starts_with(fmt::format("[hpctrain.usage] --results: no task of job {} has finished yet (", id)));

  for (int task = 0; task < 4; ++task) job_test::wait_for_final_state(fmt::format("{}_{}", id, task));
  const auto results = job_test::run_probe(dir, {"--results"}, env);
  CAPTURE(results.err);
  REQUIRE(results.exit_code == 0);
  CHECK(results.out == fmt::format("job {} (probe): 4 tasks (4 COMPLETED); best first by eval_loss (lower is better)\n"
                                   "task  lr     warmup_steps  state      step  loss  eval_loss  eval_accuracy\n"
                                   "2     0.001  0             COMPLETED  5     2     1          0.9\n"
                                   "3     0.001  10            COMPLETED  5     2     1.1        0.89\n"
                                   "0     0.002  0             COMPLETED  5     4     2          0.8\n"
                                   "1     0.002  10            COMPLETED  5     4     2.1        0.79\n",
                                   id));
  const auto by_accuracy = job_test::run_probe(dir, {"--results", "--sort-by", "accuracy"}, env);
  CHECK(by_accuracy.out.find("best first by eval_accuracy (higher is better)\n") != std::string::npos);
  // Each task's log shows the combination's values reached its worker, with the command line's --compile.
  const auto log = job_test::read_file(dir / "hpctrain-jobs/probe" / id / fmt::format("slurm-{}_3.out", id));
  CHECK(log.find("probe rank=0 lr=0.001 warmup_steps=10 compile=true") != std::string::npos);
}
