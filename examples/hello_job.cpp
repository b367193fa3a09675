// The job half of hpctrain, without LibTorch: a job description whose worker says hello from every rank.
//   ./hello_job --dry-run                 print the sbatch script
//   ./hello_job --submit                  submit it; then --status, --logs [--follow], --cancel
//   ./hello_job --submit --nodes 1 --env GREETING=hi
#include <chrono>
#include <cstdlib>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include <hpctrain/job/cli.hpp>

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
    const auto get = [](const char* name) { return std::getenv(name) ? std::getenv(name) : "?"; };
    std::cout << fmt::format("{} from rank {} of {} on {} (job {}), args: {}\n", get("GREETING"), get("SLURM_PROCID"),
                             get("SLURM_NTASKS"), get("SLURMD_NODENAME"), get("SLURM_JOB_ID"), fmt::join(args, " "));
    return 0;
  });
}
