// `--run` inside an allocation (issue 20): where it was started, whether the allocation holds the job, the
// script it runs, and the command line around it. The cluster half is tests/job/run_in_allocation_test.sh.
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include <hpctrain/job/allocation.hpp>
#include <hpctrain/job/chain.hpp>
#include <hpctrain/job/cli.hpp>
#include <hpctrain/job/render.hpp>

#include "job_test_support.hpp"

using namespace std::chrono_literals;
namespace ht = hpctrain;

namespace {
ht::slurm::EnvironmentLookup lookup_of(std::map<std::string, std::string> variables) {
  return [variables](const std::string& name) -> std::optional<std::string> {
    const auto found = variables.find(name);
    if (found == variables.end()) return std::nullopt;
    return found->second;
  };
}

ht::Job two_nodes() { return ht::Job("fashion").nodes(2).tasks_per_node(2).cpus_per_task(1).partition("debug"); }
}  // namespace

TEST_CASE("The --run mode tells an allocation's shell from a task of the user's own step and from no allocation",
          "[allocation]") {
  using Place = ht::RunPlace;
  // What salloc -N 2 sets in its shell on Slurm 22.05 (seen on the local cluster), what srun adds for its
  // tasks, and what `srun --pty bash` adds for its interactive shell.
  const std::map<std::string, std::string> salloc = {
      {"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NUM_NODES", "2"}, {"SLURM_JOB_CPUS_PER_NODE", "1(x2)"}};
  auto task = salloc;
  task.insert({{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "2"}});
  auto pty = task;
  pty.insert({"SLURM_PTY_PORT", "40000"});
  auto batch = salloc;
  batch.insert({"SLURM_PROCID", "0"});  // a batch script has SLURM_PROCID but no step id
  CHECK(ht::run_place(lookup_of({})) == Place::no_allocation);
  CHECK(ht::run_place(lookup_of(salloc)) == Place::allocation_shell);
  CHECK(ht::run_place(lookup_of(batch)) == Place::allocation_shell);
  CHECK(ht::run_place(lookup_of(task)) == Place::step_task);
  CHECK(ht::run_place(lookup_of(pty)) == Place::allocation_shell);
}

TEST_CASE("An allocation smaller than the job is refused naming both", "[allocation]") {
  SECTION("too few nodes") {
    const auto allocation = ht::read_allocation(
        lookup_of({{"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NUM_NODES", "1"}, {"SLURM_JOB_CPUS_PER_NODE", "4"}}));
    CHECK(allocation.nodes == 1);
    CHECK_THROWS_WITH(ht::check_allocation_fits(two_nodes(), allocation),
                      "[hpctrain.spec.allocation] allocation 7: has 1 node(s) but the job asks for nodes = 2; allocate "
                      "it with `salloc --nodes=2 --ntasks-per-node=2 --cpus-per-task=1 --partition=debug`");
  }
  SECTION("too few CPUs on a node") {
    const auto allocation = ht::read_allocation(
        lookup_of({{"SLURM_JOB_ID", "8"}, {"SLURM_JOB_NUM_NODES", "2"}, {"SLURM_JOB_CPUS_PER_NODE", "2,1"}}));
    CHECK(allocation.cpus_per_node == std::vector<int>{2, 1});
    CHECK_THROWS_WITH(ht::check_allocation_fits(two_nodes(), allocation),
                      Catch::Contains("allocation 8: has 1 of 2 node(s) with the 2 CPU(s) the job asks for per node "
                                      "(tasks_per_node = 2 x cpus_per_task = 1"));
  }
  SECTION("large enough, also with more nodes than asked for") {
    CHECK_NOTHROW(ht::check_allocation_fits(
        two_nodes(), ht::read_allocation(lookup_of({{"SLURM_JOB_ID", "9"}, {"SLURM_JOB_CPUS_PER_NODE", "2(x3)"}}))));
  }
}

TEST_CASE("The --run mode's script runs the batch script's step with the job's geometry and forwards an interrupt",
          "[allocation]") {
  auto job = two_nodes().env("NCCL_DEBUG", "WARN").requeue_on_timeout(1min).time(30min);
  auto context = job_test::fixed_context();
  context.worker_args = {"--max-steps=5"};
  const auto script = ht::render_allocation_script(job, context);
  CAPTURE(script);
  CHECK(script.find("#SBATCH") == std::string::npos);
  CHECK(script.find("export NCCL_DEBUG=WARN\n") != std::string::npos);
  CHECK(script.find("export HPCTRAIN_RUN_DIR=/home/user/project/hpctrain-jobs/fashion/\"$SLURM_JOB_ID\"\n") !=
        std::string::npos);
  CHECK(script.find("srun --kill-on-bad-exit=1 --unbuffered \\\n  --nodes=2 \\\n  --ntasks=4 \\\n  "
                    "--ntasks-per-node=2 \\\n  --cpus-per-task=1 \\\n  --cpu-bind=cores \\\n  --signal=USR2@60 \\\n  "
                    "/home/user/project/build/train --hpctrain-worker --max-steps=5 &\n") != std::string::npos);
  // No requeue: an allocation's shell is not requeued; the ranks' checkpoint is resumed by the next --run.
  CHECK(script.find("scontrol requeue") == std::string::npos);
  CHECK(script.find("trap '") != std::string::npos);
  CHECK(script.find("kill -s \"${HPCTRAIN_PREEMPT_SIGNAL:-USR2}\" \"$hpctrain_step\"") != std::string::npos);
  CHECK(script.find("if [ \"$hpctrain_interrupted\" -ne 0 ]; then exit 130; fi\nexit \"$status\"\n") !=
        std::string::npos);
  SECTION("the preparation step runs first, as in the batch script") {
    job.prepare([](const ht::PrepareContext&) { return 0; });
    const auto prepared = ht::render_allocation_script(job, context);
    CHECK(prepared.find("--hpctrain-prepare") < prepared.find("--hpctrain-worker"));
  }
}

TEST_CASE("The --run mode parses as a mode of its own and --after goes with --submit", "[allocation][cli]") {
  const auto parse = [](std::vector<std::string> words) {
    words.insert(words.begin(), "train");
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    return ht::parse_login_command(static_cast<int>(argv.size()), argv.data());
  };
  CHECK(parse({"--run", "--max-steps", "5"}).mode == ht::LoginCommand::Mode::run);
  CHECK_THROWS_WITH(parse({"--run", "--submit"}), Catch::Contains("choose one of"));
  CHECK(parse({"--submit", "--after", "41", "--after", "42"}).after == std::vector<std::string>{"41", "42"});
  CHECK_THROWS_WITH(parse({"--status", "--after", "41"}), Catch::Contains("--after goes with --submit or --dry-run"));
}

TEST_CASE("The --run mode outside an allocation exits 2 and says how to get one", "[allocation][cli]") {
  auto context = job_test::fixed_context();
  context.environment = {};  // no SLURM_* variables: not inside an allocation
  ht::LoginCommand command;
  command.mode = ht::LoginCommand::Mode::run;
  std::ostringstream out, err;
  CHECK(ht::run_login_command(two_nodes(), command, context, out, err) == ht::exit_usage);
  CHECK_THAT(err.str(), Catch::Contains("--run trains on the allocation this shell is in, and there is none here") &&
                            Catch::Contains("salloc --nodes=2 --ntasks-per-node=2"));
}

TEST_CASE("A --submit with --after JOB renders --dependency=afterok:JOB", "[allocation][cli]") {
  ht::LoginCommand command;
  command.mode = ht::LoginCommand::Mode::dry_run;
  command.after = {"41"};
  std::ostringstream out, err;
  REQUIRE(ht::run_login_command(two_nodes(), command, job_test::fixed_context(), out, err) == ht::exit_ok);
  CHECK_THAT(out.str(), Catch::Contains("#SBATCH --dependency=afterok:41\n"));
  command.after = {"not-a-job"};
  CHECK(ht::run_login_command(two_nodes(), command, job_test::fixed_context(), out, err) == ht::exit_usage);
  CHECK_THAT(err.str(), Catch::Contains("[hpctrain.spec.dependency] dependency = not-a-job"));
}

TEST_CASE("A chain's stages need names of their own", "[chain]") {
  CHECK_THROWS_WITH(ht::Job("train").then(ht::Job("train")),
                    Catch::StartsWith("[hpctrain.spec.then] then = train: every stage of a chain needs a name"));
  CHECK_THROWS_WITH(ht::Job("train").then(ht::Job("eval")).then(ht::Job("eval")),
                    Catch::StartsWith("[hpctrain.spec.then] then = eval"));
}

TEST_CASE("A chain's dry run shows every stage with its own resources and its HPCTRAIN_STAGE", "[chain]") {
  const auto job = ht::Job("pretrain").nodes(2).time(2h).then(ht::Job("sft").nodes(1).time(30min));
  REQUIRE(job.stages().size() == 1);
  const auto text = ht::render_chain(job, job_test::fixed_context());
  CAPTURE(text);
  const auto second =
      text.find("# ---- stage 2 of 2: sft, submitted with --dependency=afterok:<job id of pretrain> ----\n");
  REQUIRE(second != std::string::npos);
  CHECK(text.starts_with("# ---- stage 1 of 2: pretrain ----\n#!/bin/bash\n"));
  CHECK(text.find("#SBATCH --nodes=2\n") < second);
  CHECK(text.find("#SBATCH --nodes=1\n", second) != std::string::npos);
  CHECK(text.find("export HPCTRAIN_STAGE=pretrain\n") < second);
  CHECK(text.find("export HPCTRAIN_STAGE=sft\n", second) != std::string::npos);
}

TEST_CASE("A chain's --resume is its first stage's: the later stages run again, and a run of a later stage is refused",
          "[chain][runs]") {
  const auto job = ht::Job("sft").time(1h).then(ht::Job("dpo").time(1h));
  const auto dir = job_test::scratch_dir("chain-resume");
  auto context = job_test::fixed_context();
  context.workdir = dir.string();
  const auto sft_run = dir / "hpctrain-jobs" / "sft" / "41", dpo_run = dir / "hpctrain-jobs" / "dpo" / "42";
  for (const auto& run : {sft_run, dpo_run})
    std::filesystem::create_directories(run / "checkpoints" / "step-0000000010");
  ht::LoginCommand command;
  command.mode = ht::LoginCommand::Mode::dry_run;
  command.resume = sft_run.string();
  context.worker_args = {"--lr", "0.5"};
  const auto text = ht::render_chain(job, ht::detail::worker_context_for(job, command, context, nullptr));
  CAPTURE(text);
  const auto second = text.find("# ---- stage 2 of 2: dpo");
  REQUIRE(second != std::string::npos);
  CHECK(text.find(fmt::format("--hpctrain-worker --resume {} --lr 0.5", sft_run.string())) < second);
  CHECK(text.find("--resume", second) == std::string::npos);
  CHECK(text.find("--hpctrain-worker --lr 0.5", second) != std::string::npos);
  // The newest run with checkpoints is looked for among the first stage's.
  command.resume = "";
  CHECK(ht::detail::worker_context_for(job, command, context, nullptr).worker_args[1] == sft_run.string());
  command.resume = dpo_run.string();
  CHECK_THROWS_WITH(ht::detail::worker_context_for(job, command, context, nullptr),
                    Catch::StartsWith("[hpctrain.spec.resume]") &&
                        Catch::Contains(fmt::format("{} is a run of stage dpo; a chain resumes its first stage (sft) "
                                                    "from one of its runs, and runs the later stages again on its "
                                                    "results",
                                                    dpo_run.string())));
}

TEST_CASE("A --status of a chain says why a stage never starts", "[chain]") {
  const std::vector<ht::ChainStage> stages = {{"41", "pretrain"}, {"42", "sft"}, {"43", "eval"}};
  const std::vector<ht::JobState> states = {
      {"41", "FAILED", "scontrol", "exit code 3:0", ""},
      {"42", "PENDING", "squeue", "elapsed 0:00, limit 30:00, 1 node(s), (DependencyNeverSatisfied)", ""},
      {"43", "PENDING", "squeue", "elapsed 0:00, limit 30:00, 1 node(s), (Dependency)", ""}};
  CHECK(ht::format_chain_status(stages, states) ==
        "chain of 3 stages (each starts when the one before completed successfully):\n"
        "  stage 1 pretrain (job 41): FAILED (exit code 3:0; from scontrol)\n"
        "  stage 2 sft (job 42): PENDING (elapsed 0:00, limit 30:00, 1 node(s), (DependencyNeverSatisfied); from "
        "squeue)\n"
        "    never starts: stage 1 (pretrain, job 41) did not complete successfully; `--cancel` removes the chain's "
        "jobs\n"
        "  stage 3 eval (job 43): PENDING (elapsed 0:00, limit 30:00, 1 node(s), (Dependency); from squeue)\n"
        "    never starts: stage 1 (pretrain, job 41) did not complete successfully; `--cancel` removes the chain's "
        "jobs\n");
  const std::vector<ht::JobState> waiting = {{"41", "RUNNING", "squeue", "", ""},
                                             {"42", "PENDING", "squeue", "(Dependency)", ""},
                                             {"43", "PENDING", "squeue", "(Dependency)", ""}};
  CHECK_THAT(ht::format_chain_status(stages, waiting),
             Catch::Contains("  stage 2 sft (job 42): PENDING ((Dependency); from squeue)\n"
                             "    waits for stage 1 (pretrain, job 41) to complete\n") &&
                 Catch::Contains("    waits for stage 2 (sft, job 42) to complete\n"));
}
