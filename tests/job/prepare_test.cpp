// The preparation step (Job::prepare) on the real local cluster: it runs once, on one task, before the
// training ranks, leaves its output for them, is skipped by a requeued job, and a failing one fails the
// job before any rank starts.
#include <filesystem>
#include <string>
#include <vector>

#include <hpctrain/job/cli_options.hpp>
#include <hpctrain/job/process.hpp>
#include <hpctrain/job/render.hpp>

#include <catch2/catch.hpp>

#include "job_test_support.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
namespace ht = hpctrain;

namespace {}  // namespace

TEST_CASE("The preparation step renders as its own one-task srun step before the training step", "[prepare]") {
  auto context = job_test::fixed_context();
  context.worker_args = {"--epochs", "2"};
  const auto script =
      ht::render_sbatch(ht::Job("prep").nodes(2).cpus_per_task(2).prepare([](const ht::PrepareContext&) {}), context);
  const auto prepare_at = script.find(
      "  srun --nodes=1 --ntasks=1 --exclusive --kill-on-bad-exit=1 --unbuffered \\\n  --cpus-per-task=2 \\\n"
      "  /home/user/project/build/train --hpctrain-prepare --epochs 2 || prepare_status=$?\n");
  const auto train_at = script.find("/home/user/project/build/train --hpctrain-worker --epochs 2 || status=$?\n");
  REQUIRE(prepare_at != std::string::npos);
  REQUIRE(train_at != std::string::npos);
  CHECK(prepare_at < train_at);
  CHECK(script.find("if [ -e \"$HPCTRAIN_RUN_DIR/prepare.done\" ]; then\n") != std::string::npos);
  CHECK(script.find("  touch \"$HPCTRAIN_RUN_DIR/prepare.done\"\n") != std::string::npos);
  CHECK(ht::render_sbatch(ht::Job("plain"), context).find("hpctrain-prepare") == std::string::npos);
}

TEST_CASE("The CPUs a task gets from the command line reach the #SBATCH line and both srun steps", "[prepare][cli]") {
  auto context = job_test::fixed_context();
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"train", "--dry-run", "--cpus-per-task", "24"},
        std::vector<std::string>{"train", "--dry-run", "--sbatch", "cpus-per-task=24"}}) {
    CAPTURE(args);
    std::vector<char*> argv;
    for (const auto& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    const auto command = ht::parse_login_command(static_cast<int>(argv.size()), argv.data());
    auto job = ht::Job("prep").nodes(2).cpus_per_task(1).prepare([](const ht::PrepareContext&) {});
    ht::apply_overrides(job, command);
    const auto script = ht::render_sbatch(job, context);
    CHECK(script.find("#SBATCH --cpus-per-task=24\n") != std::string::npos);
    std::size_t steps = 0;
    for (auto at = script.find("  --cpus-per-task=24 \\\n"); at != std::string::npos;
         at = script.find("  --cpus-per-task=24 \\\n", at + 1))
      ++steps;
    CHECK(steps == 2);  // the preparation step and the training step
    CHECK(script.find("cpus-per-task=1") == std::string::npos);
  }
  std::vector<std::string> bad = {"train", "--dry-run", "--sbatch", "cpus-per-task=many"};
  std::vector<char*> argv;
  for (auto& arg : bad) argv.push_back(arg.data());
  auto job = ht::Job("prep");
  CHECK_THROWS_WITH(ht::apply_overrides(job, ht::parse_login_command(static_cast<int>(argv.size()), argv.data())),
                    Catch::Matchers::Contains("--sbatch cpus-per-task=many: expected a whole number of CPUs"));
}

TEST_CASE("An empty preparation callable is refused", "[prepare]") {
  CHECK_THROWS_WITH(ht::Job("x").prepare(ht::PrepareFunction{}),
                    "[hpctrain.spec.prepare] prepare = <empty function>: needs a callable");
}

TEST_CASE("Local mode runs the preparation once before the ranks", "[prepare]") {
  const auto dir = job_test::scratch_dir("prepare-local");
  const std::vector<std::pair<std::string, std::string>> env = {{"PROBE_PREPARE", "ok"}};
  const auto first = job_test::run_probe(dir, {"--local", "2"}, env);
  CAPTURE(first.err);
  REQUIRE(first.exit_code == 0);
  CHECK(ht::test::count_occurrences(first.out, "probe prepare job=local") == 1);
  CHECK(first.out.find("probe prepare") < first.out.find("probe rank="));
  // Under --local the preparation's run directory is hpctrain-jobs/<name>/local.
  CHECK(job_test::read_file(dir / "hpctrain-jobs" / "probe" / "local" / "prepare" / "data.txt") ==
        "job local restart 0\n");
  const auto second = job_test::run_probe(dir, {"--local", "2"}, env);
  CHECK(second.exit_code == 0);
  CHECK(ht::test::count_occurrences(second.out, "probe prepare") == 0);
  CHECK(second.err.find("hpctrain: preparation already done") != std::string::npos);

  const auto failing =
      job_test::run_probe(job_test::scratch_dir("prepare-local-fail"), {"--local", "2"}, {{"PROBE_PREPARE", "fail"}});
  CHECK(failing.exit_code == 1);
  CHECK(failing.err.find("hpctrain: preparation failed: [hpctrain.runtime.probe] the corpus is missing\n") !=
        std::string::npos);
  CHECK(failing.out.find("probe rank=") == std::string::npos);
}

TEST_CASE(
    "On two nodes the preparation runs once before the ranks, is skipped after a requeue, and a failing one "
    "fails the job before any rank starts",
    "[prepare][slurm]") {
  const auto dir = job_test::scratch_dir("prepare-slurm");
  // Both jobs go in at once: the requeued one waits about two minutes (BeginTime) before its second run.
  const auto ok = job_test::run_probe(dir, {"--submit", "--exit-first-run", "75"},
                                      {{"PROBE_NAME", "prep-ok"}, {"PROBE_PREPARE", "ok"}, {"PROBE_REQUEUE", "1"}});
  const auto bad = job_test::run_probe(dir, {"--submit"}, {{"PROBE_NAME", "prep-fail"}, {"PROBE_PREPARE", "fail"}});
  CAPTURE(ok.err, bad.err);
  REQUIRE(ok.exit_code == 0);
  REQUIRE(bad.exit_code == 0);
  const auto ok_id = job_test::submitted_id(ok.out);
  const auto bad_id = job_test::submitted_id(bad.out);

  const auto bad_state = job_test::wait_for_end(bad_id);
  const auto bad_log =
      job_test::read_file(dir / "hpctrain-jobs" / "prep-fail" / bad_id / fmt::format("slurm-{}.out", bad_id));
  CAPTURE(bad_log);
  CHECK(bad_state.state == "FAILED");
  CHECK(bad_log.find("hpctrain: preparation failed: [hpctrain.runtime.probe] the corpus is missing\n") !=
        std::string::npos);
  CHECK(bad_log.find("hpctrain: the preparation step failed (exit 1); no training rank started\n") !=
        std::string::npos);
  CHECK(bad_log.find("probe rank=") == std::string::npos);
  CHECK_FALSE(fs::exists(dir / "hpctrain-jobs" / "prep-fail" / bad_id / "prepare.done"));

  // The first run prepares and exits 75 (requeue); the second skips the preparation and completes.
  const auto ok_dir = dir / "hpctrain-jobs" / "prep-ok" / ok_id;
  const auto ok_log_path = ok_dir / fmt::format("slurm-{}.out", ok_id);
  const auto ok_state = job_test::wait_for_final_state(ok_id);
  const auto ok_log = job_test::read_file(ok_log_path);
  CAPTURE(ok_log);
  CHECK(ok_state == "COMPLETED");
  CHECK(job_test::scontrol_field(ok_id, "Restarts") == "1");
  CHECK(ht::test::count_occurrences(ok_log, "probe prepare ") == 1);
  CHECK(ok_log.find(fmt::format("probe prepare job={} node=n1 step_tasks=1 restart=0 args=2 run_dir={}\n", ok_id,
                                ok_dir.string())) != std::string::npos);
  CHECK(ok_log.find("probe prepare ") < ok_log.find("probe rank=0"));
  CHECK(ht::test::count_occurrences(
            ok_log,
            fmt::format("hpctrain: preparation already done ({}/prepare.done); skipping it\n", ok_dir.string())) == 1);
  // Both ranks of both runs read what the preparation left.
  for (const auto* rank : {"0", "1"})
    CHECK(ht::test::count_occurrences(ok_log, fmt::format("probe rank={} prepared=job {} restart 0\n", rank, ok_id)) ==
          2);
  CHECK(fs::exists(ok_dir / "prepare.done"));
}
