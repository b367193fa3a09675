// A rank's CPUs: its affinity mask (against nproc, and after binding this thread to one CPU), the rule that
// turns mask, allotment and machine into intra-op threads, and sinfo's CPU counts.
#include <sched.h>

#include <string>

#include <hpctrain/job/process.hpp>
#include <hpctrain/slurm/cpus.hpp>

#include <catch2/catch.hpp>

namespace ht = hpctrain;

TEST_CASE("The affinity mask counts what nproc counts, and one CPU once bound to one", "[cpus]") {
  const auto nproc = ht::run_process({"nproc"});
  REQUIRE(nproc.exit_code == 0);
  REQUIRE(ht::slurm::affinity_cpu_count());
  CHECK(*ht::slurm::affinity_cpu_count() == std::stoi(nproc.out));
  cpu_set_t saved;
  REQUIRE(::sched_getaffinity(0, sizeof saved, &saved) == 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &saved)) {
      CPU_SET(cpu, &one);
      break;
    }
  REQUIRE(::sched_setaffinity(0, sizeof one, &one) == 0);
  const auto bound = ht::slurm::affinity_cpu_count();
  const auto view = ht::slurm::this_process_cpus(2, ht::Environment::of_this_process());
  ::sched_setaffinity(0, sizeof saved, &saved);
  CHECK(bound == 1);
  CHECK(ht::slurm::intra_op_threads(view) == 1);  // bound: its one CPU, whatever the machine has
}

TEST_CASE("Intra-op threads follow a binding mask, else Slurm's allotment, else the machine among local ranks",
          "[cpus]") {
  using V = ht::slurm::CpuView;
  auto [view, threads] = GENERATE(table<V, int>({
      {V{12, 96, std::nullopt, 8}, 12},  // bound by srun --cpu-bind=cores: the mask, not divided again
      {V{12, 96, 4, 8}, 12},             // the mask wins over the allotment
      {V{96, 96, 12, 8}, 12},            // unbound (task/none): Slurm's allotment
      {V{96, 96, std::nullopt, 8}, 12},  // --local 8: the machine shared
      {V{std::nullopt, 6, std::nullopt, 4}, 1},
      {V{1, 1, std::nullopt, 3}, 1},
  }));
  CAPTURE(view.affinity, view.machine, view.slurm_allotted, view.local_ranks);
  CHECK(ht::slurm::intra_op_threads(view) == threads);
}

TEST_CASE("sinfo's CPU counts give the smallest node's", "[cpus]") {
  auto [text, cpus] = GENERATE(table<std::string, std::optional<int>>({
      {"32\n", 32},
      {"32+\n", 32},  // nodes of a partition differ: the smallest first
      {"64\n32\n", 32},
      {"", std::nullopt},
      {"n/a\n", std::nullopt},
  }));
  CAPTURE(text);
  CHECK(ht::slurm::smallest_node_cpus(text) == cpus);
}
