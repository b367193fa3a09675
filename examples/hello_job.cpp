// The job half of hpctrain, without LibTorch: a job description whose worker says hello from every rank.
//   ./hello_job --dry-run                 print the sbatch script
//   ./hello_job --submit                  submit it; then --status, --logs [--follow], --cancel
//   ./hello_job --submit --nodes 1 --env GREETING=hi
#include <chrono>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include <hpctrain/job/cli.hpp>
#include <hpctrain/slurm/world.hpp>

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  using namespace hpctrain::literals;
  namespace ht = hpctrain;

  const auto job = ht::Job("hello")
                       .nodes(2)
                       .tasks_per_node(1)
                       .cpus_per_task(1)
                       .memory(512_MiB)
                       .time(5min)
                       .env("GREETING", "hello");

  return ht::run_job(argc, argv, job, [](const std::vector<std::string>& args) {
    // The same identity under srun (SLURM_*) and under --local (RANK, WORLD_SIZE, ...).
    const auto world = ht::slurm::world_from_environment();
    const auto environment = ht::Environment::of_this_process();  // the job's environment reaches every rank
    const auto variable = [&](const char* name) { return environment.get(name); };
    std::cout << fmt::format("{} from rank {} of {} (local rank {}, node {}) on {}, job {}, master {}:{}, args: {}\n",
                             variable("GREETING").value_or("?"), world.rank, world.world_size, world.local_rank,
                             world.node_rank, variable("SLURMD_NODENAME").value_or("local"),
                             world.job_id.empty() ? "-" : world.job_id, world.master_addr, world.master_port,
                             fmt::join(args, " "));
    return 0;
  });
}
