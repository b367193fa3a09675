// Start-up at scale: N ranks rendezvous, run one all-reduce, and shut down cleanly — nothing else.
//   hpctrain_startup_bench --local N     launches N ranks on this machine (like torchrun --standalone)
//   srun hpctrain_startup_bench          one rank per Slurm task (bench/startup --slurm NODESxTASKS)
// bench/startup runs it beside torchrun + bench/startup_peer.py and prints both. The launcher is given
// HPCTRAIN_BENCH_LAUNCH_TIME (seconds since the epoch) by bench/startup; each rank measures from it to the
// end of its first all-reduce, and a second all-reduce takes the slowest rank's figure (what a job waits
// for). Rank 0 prints one JSON line; shutdown is measured by bench/startup, from that line to the exit.
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>

#include <fmt/format.h>
#include <torch/torch.h>

#include <hpctrain/dist/dist.hpp>
#include <hpctrain/slurm/local_launch.hpp>
#include <hpctrain/slurm/world.hpp>

namespace {
double seconds_since_launch() {
  const char* launch = std::getenv("HPCTRAIN_BENCH_LAUNCH_TIME");
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return launch ? now - std::stod(launch) : 0.0;
}

int rank_main() {
  const auto world = hpctrain::slurm::world_from_environment();
  double sum = 0;
  {
    hpctrain::dist::ProcessGroup group(world, hpctrain::dist::Options{});
    const double rendezvous = seconds_since_launch();
    sum = hpctrain::dist::all_reduce_sum(group, 1.0);
    const double first_collective = seconds_since_launch();
    // The slowest rank's figures (what a job waits for): each rank fills its own slots, a sum gathers them.
    auto times = torch::zeros({2 * world.world_size}, torch::kFloat64);
    times[world.rank] = rendezvous;
    times[world.world_size + world.rank] = first_collective;
    times = hpctrain::dist::all_reduce_sum(group, times);
    if (world.rank == 0) {
      const double wall = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      std::cout
          << fmt::format(
                 R"({{"ranks": {}, "all_reduce_sum": {}, "rendezvous_s": {:.3f}, "first_collective_s": {:.3f}, "collective_done_at": {:.6f}}})",
                 world.world_size, sum, times.slice(0, 0, world.world_size).max().item<double>(),
                 times.slice(0, world.world_size).max().item<double>(), wall)
          << std::endl;
    }
  }  // ~ProcessGroup: the orderly shutdown that bench/startup measures
  return sum == world.world_size ? 0 : 1;
}
}  // namespace

int main(int argc, char** argv) {
  if (std::getenv("HPCTRAIN_LOCAL") != nullptr) return rank_main();
  // Under srun (bench/startup --slurm): every task is a rank; the world comes from SLURM_* variables.
  if (argc == 1 && std::getenv("SLURM_PROCID") != nullptr) return rank_main();
  if (argc != 3 || std::string(argv[1]) != "--local") {
    std::cerr << "usage: hpctrain_startup_bench --local N\n";
    return 2;
  }
  return hpctrain::launch_local(std::stoi(argv[2]), "/proc/self/exe", {});
}
