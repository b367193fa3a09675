// Restarts after a failure (Job::max_restarts) and preemption by SIGTERM, on the real local cluster.
#include <filesystem>
#include <thread>

#include <hpctrain/job/process.hpp>
#include <hpctrain/job/render.hpp>

#include <catch2/catch.hpp>

#include "job_test_support.hpp"

namespace fs = std::filesystem;
namespace ht = hpctrain;
using namespace std::chrono_literals;

TEST_CASE("max_restarts and the requeue signal render as the script's failure branch and srun --signal", "[restart]") {
  auto context = job_test::fixed_context();
  const auto script = ht::render_sbatch(ht::Job("r").max_restarts(2), context);
  CHECK(script.find("#SBATCH --requeue\n#SBATCH --open-mode=append\n") != std::string::npos);
  CHECK(script.find("if [ \"$status\" -ne 0 ] && [ \"$status\" -ne 75 ]; then\n") != std::string::npos);
  CHECK(script.find("  if [ \"$failures\" -lt 2 ]; then\n") != std::string::npos);
  // No timeout requeue asked for, yet a preempted run comes back: the exit-75 branch, at most 3 times (issue 20).
  CHECK(script.find("  if [ \"${SLURM_RESTART_COUNT:-0}\" -lt 3 ]; then\n") != std::string::npos);
  CHECK(script.find("--signal=") == std::string::npos);
  const auto signalled = ht::render_sbatch(ht::Job("r").requeue_on_timeout(90s).requeue_signal("SIGURG"), context);
  CHECK(signalled.find("  --signal=URG@90 \\\n") != std::string::npos);
  CHECK(signalled.find("export HPCTRAIN_PREEMPT_SIGNAL=URG\n") != std::string::npos);
  CHECK(ht::render_sbatch(ht::Job("r").requeue_on_timeout(90s), context).find("HPCTRAIN_PREEMPT_SIGNAL") ==
        std::string::npos);
  CHECK_THROWS_WITH(ht::Job("r").requeue_signal("KILL"),
                    "[hpctrain.spec.requeue_signal] requeue_signal = KILL: expected USR2, USR1, URG, ALRM, HUP or INT");
  CHECK_THROWS_WITH(ht::Job("r").max_restarts(-1),
                    "[hpctrain.spec.max_restarts] max_restarts = -1: must be between 0 and 100");
}

TEST_CASE("A rank killed by SIGKILL restarts the job with max_restarts, a rank that always dies gives up after n",
          "[restart][slurm]") {
  const auto dir = job_test::scratch_dir("restart");
  const auto once = job_test::run_probe(dir, {"--submit", "--kill-rank", "1"},
                                        {{"PROBE_NAME", "restart-once"}, {"PROBE_MAX_RESTARTS", "1"}});
  const auto always = job_test::run_probe(dir, {"--submit", "--kill-rank-always", "1"},
                                          {{"PROBE_NAME", "restart-always"}, {"PROBE_MAX_RESTARTS", "1"}});
  CAPTURE(once.err, always.err);
  REQUIRE(once.exit_code == 0);
  REQUIRE(always.exit_code == 0);
  const auto once_id = job_test::submitted_id(once.out);
  const auto always_id = job_test::submitted_id(always.out);

  CHECK(job_test::wait_for_final_state(once_id) == "COMPLETED");
  CHECK(job_test::scontrol_field(once_id, "Restarts") == "1");
  const auto once_log =
      job_test::read_file(dir / "hpctrain-jobs" / "restart-once" / once_id / fmt::format("slurm-{}.out", once_id));
  CAPTURE(once_log);
  CHECK(once_log.find(fmt::format("hpctrain: job {}: the step failed (exit ", once_id)) != std::string::npos);
  CHECK(once_log.find("); requeueing to resume from the last checkpoint (failure restart 1 of 1)\n") !=
        std::string::npos);
  CHECK(once_log.find("probe rank=0 finished restart=1\n") != std::string::npos);
  CHECK(once_log.find("probe rank=1 finished restart=1\n") != std::string::npos);

  CHECK(job_test::wait_for_final_state(always_id) == "FAILED");
  CHECK(job_test::scontrol_field(always_id, "Restarts") == "1");
  const auto always_log = job_test::read_file(dir / "hpctrain-jobs" / "restart-always" / always_id /
                                              fmt::format("slurm-{}.out", always_id));
  CAPTURE(always_log);
  CHECK(always_log.find("(failure restart 1 of 1)\n") != std::string::npos);
  CHECK(always_log.find(fmt::format("hpctrain: job {}: the step failed (exit ", always_id)) != std::string::npos);
  CHECK(always_log.find(") after 1 failure restarts; giving up\n") != std::string::npos);
}

TEST_CASE("A job preempted by a higher-priority partition gets SIGTERM, checkpoints, is requeued once and completes",
          "[preempt][slurm]") {
  // scripts/slurm-local adds the partitions preemptable and urgent (PreemptType=preempt/partition_prio).
  if (ht::run_process({"scontrol", "show", "partition", "preemptable"}).exit_code != 0) {
    WARN("the local cluster has no preemptable partition (scripts/slurm-local up adds it); skipped");
    return;
  }
  // With requeue_on_timeout (max 2 restarts), and without (issue 20: a preempted job comes back too, at most
  // default_preemption_restarts = 3 times).
  const bool timeout_requeue = GENERATE(true, false);
  CAPTURE(timeout_requeue);
  const int max_restarts = timeout_requeue ? 2 : ht::default_preemption_restarts;
  const auto dir = job_test::scratch_dir(timeout_requeue ? "preempt" : "preempt-without-timeout-requeue");
  std::vector<std::pair<std::string, std::string>> env = {{"PROBE_NAME", "preempted"}};
  if (timeout_requeue) env.emplace_back("PROBE_REQUEUE", "1");
  const auto submitted =
      job_test::run_probe(dir, {"--submit", "--partition", "preemptable", "--wait-for-preemption"}, env);
  CAPTURE(submitted.err);
  REQUIRE(submitted.exit_code == 0);
  const auto id = job_test::submitted_id(submitted.out);
  const auto log_path = dir / "hpctrain-jobs" / "preempted" / id / fmt::format("slurm-{}.out", id);
  for (int attempt = 0; attempt < 1200; ++attempt) {
    if (job_test::read_file(log_path).find("probe rank=1 waiting for preemption") != std::string::npos) break;
    std::this_thread::sleep_for(500ms);
  }
  // Both nodes, whole: Slurm preempts the low-priority job to start this one.
  const auto urgent = ht::run_process({"sbatch", "--parsable", "--partition", "urgent", "--nodes", "2", "--exclusive",
                                       "--job-name", "urgent", "--output", "/dev/null", "--wrap", "sleep 5"});
  REQUIRE(urgent.exit_code == 0);
  const auto state = job_test::wait_for_final_state(id);
  const auto log = job_test::read_file(log_path);
  CAPTURE(log);
  CHECK(state == "COMPLETED");
  for (const auto* rank : {"0", "1"}) {
    CHECK(log.find(fmt::format("probe rank={} preempted: checkpointing\n", rank)) != std::string::npos);
    CHECK(log.find(fmt::format("probe rank={} resumed restart=", rank)) != std::string::npos);
  }
  CHECK(job_test::wait_for_final_state(ht::detail::trim(urgent.out)) == "COMPLETED");
  // Requeued once: by the script, within the partition's GraceTime; Slurm's own preemption requeue (PreemptMode=
  // REQUEUE) finds the job gone and does not add a second restart.
  CHECK(job_test::scontrol_field(id, "Restarts") == "1");
  const auto requeued = fmt::format("hpctrain: job {} checkpointed; requeueing (restart 1 of {})\n", id, max_restarts);
  CHECK(log.find(requeued) != std::string::npos);
  CHECK(log.find(requeued, log.find(requeued) + 1) == std::string::npos);
  CHECK(log.find(fmt::format("checkpointed; requeueing (restart 2 of {})", max_restarts)) == std::string::npos);
}
