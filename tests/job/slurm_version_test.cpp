// Flags that changed between Slurm releases (issue 20, item 4), and what a job submitted from inside another
// job must not inherit (submitit #1782).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <hpctrain/job/render.hpp>
#include <hpctrain/job/slurm_version.hpp>
#include <hpctrain/job/submit.hpp>

#include "job_test_support.hpp"

namespace ht = hpctrain;

TEST_CASE("sbatch --version is parsed for every release's spelling", "[slurm_version]") {
  const auto [text, major, minor, patch] = GENERATE(table<std::string, int, int, int>({
      {"slurm-wlm 22.05.8\n", 22, 5, 8},  // Debian
      {"slurm 23.11.4\n", 23, 11, 4},
      {"slurm 24.11.0-0rc1\n", 24, 11, 0},
      {"slurm 25.05\n", 25, 5, 0},
  }));
  CAPTURE(text);
  const auto version = ht::parse_slurm_version(text);
  REQUIRE(version);
  CHECK(*version == ht::SlurmVersion{major, minor, patch});
  CHECK_FALSE(ht::parse_slurm_version("sbatch: command not found"));
  CHECK_FALSE(ht::parse_slurm_version(""));
}

TEST_CASE("The real cluster's sbatch reports a release hpctrain parses", "[slurm_version][slurm]") {
  const auto version = ht::cluster_slurm_version();
  REQUIRE(version);
  CAPTURE(version->str());
  CHECK(*version >= ht::SlurmVersion{22, 5, 0});
}

TEST_CASE("The --gpus-per-task option gets a task count from 23.11 on, and not on 22.05", "[slurm_version]") {
  const auto job = ht::Job("gpt").nodes(2).tasks_per_node(4).gpus_per_node(4).sbatch_option("gpus-per-task", "1");
  auto context = job_test::fixed_context();
  const auto [major, minor, with_ntasks] =
      GENERATE(table<int, int, bool>({{22, 5, false}, {23, 11, true}, {24, 11, true}}));
  context.slurm_version = ht::SlurmVersion{major, minor, 0};
  CAPTURE(major, minor);
  const auto script = ht::render_sbatch(job, context);
  CHECK((script.find("#SBATCH --ntasks=8\n") != std::string::npos) == with_ntasks);
  CHECK(script.find("#SBATCH --gpus-per-task=1\n") != std::string::npos);
  // Without --gpus-per-task nothing changes, whatever the release (the golden scripts hold).
  CHECK(ht::render_sbatch(ht::Job("gpt").nodes(2).gpus_per_node(4), context).find("--ntasks=") == std::string::npos);
  // A task count the user gave is kept, never doubled.
  auto given = job;
  given.sbatch_option("ntasks", "8");
  const auto kept = ht::render_sbatch(given, context);
  CHECK(kept.find("#SBATCH --ntasks=8\n") == kept.rfind("#SBATCH --ntasks=8\n"));
}

TEST_CASE("A submission from inside a job leaves the parent's SLURM variables out of sbatch's environment",
          "[submit]") {
  ht::Environment environment;
  environment.set("SLURM_JOB_ID", "7")
      .set("SLURM_NTASKS", "8")
      .set("SLURM_CPUS_PER_TASK", "4")
      .set("SLURM_STEP_NUM_TASKS", "2")
      .set("SLURM_CONF", "/etc/slurm/slurm.conf")
      .set("SLURM_CLUSTERS", "a")
      .set("SBATCH_ACCOUNT", "proj")
      .set("HOME", "/root")
      .set("MY_SLURM_X", "1");
  CHECK(ht::detail::inherited_slurm_variables(environment) ==
        std::vector<std::string>{"SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_CPUS_PER_TASK", "SLURM_STEP_NUM_TASKS"});
}

TEST_CASE("run_process removes the variables it is told to", "[submit]") {
  ::setenv("HPCTRAIN_TEST_REMOVED", "parent", 1);
  const auto result =
      ht::run_process({"sh", "-c", "echo \"${HPCTRAIN_TEST_REMOVED:-unset}\""}, {}, "", {"HPCTRAIN_TEST_REMOVED"});
  ::unsetenv("HPCTRAIN_TEST_REMOVED");
  CHECK(result.out == "unset\n");
}
