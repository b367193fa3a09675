// The C++ half of scripts/gpu-check (docs/gpu.md): the checks that only hpctrain's own code can make, one group
// per run, each row a JSON line on stdout (gpu_suite/report.hpp). gpu-check runs the groups, adds the GPT-2
// throughput rows (bench/model_bench.cpp, bench/model_peer.py) and prints the table.
//   hpctrain_gpu_suite dist|llama|llama8b|float8|packed|switches [--device cuda|cpu] [--rows ID,...] [--seq N]
// Exit status: 0 when every row passed, 1 when one failed or a check threw, 2 for bad usage. --device cpu
// hides the GPUs (CUDA_VISIBLE_DEVICES=""), so that the process group picks Gloo as it does on a CPU node.
#include <algorithm>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <hpctrain/dist/dist.hpp>
#include <hpctrain/slurm/local_launch.hpp>
#include <hpctrain/slurm/world.hpp>

#include "gpu_suite/dist_rows.hpp"
#include "gpu_suite/float8_rows.hpp"
#include "gpu_suite/llama8b_rows.hpp"
#include "gpu_suite/llama_rows.hpp"
#include "gpu_suite/packed_rows.hpp"
#include "gpu_suite/switch_rows.hpp"

namespace suite = hpctrain_gpu_suite;

namespace {

/// Group "dist" as started by gpu-check: the world-1 collectives here, then the strategy rows, at world 2
/// (ranks of this binary) when there are two devices to put them on.
int run_dist(const torch::Device& device, const std::string& device_name) {
  int failures = 0;
  try {
    const auto row = suite::dist_rows::collectives_row(device);
    suite::print(row);
    failures += row.status == suite::Status::fail;
  } catch (const std::exception& e) {
    suite::print(suite::failed_row("dist.collectives", "collectives at world 1", e.what()));
    ++failures;
  }
  // NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): one GPU means world 1.
  const int world = device.is_cuda() ? std::min<int>(2, static_cast<int>(torch::cuda::device_count())) : 2;
  if (world > 1) {
    const int code = hpctrain::launch_local(world, "/proc/self/exe", {"dist", "--device", device_name});
    return failures + (code != 0);
  }
  return failures +
         suite::run_strategy_rows(hpctrain::dist::init_process_group(hpctrain::slurm::World{}), device.is_cuda());
}

/// A rank of run_dist's world (launch_local set RANK).
int run_dist_rank(bool cuda) {
  if (!cuda) torch::set_num_threads(1);  // one core per rank
  return suite::run_strategy_rows(hpctrain::dist::init_process_group(hpctrain::slurm::world_from_environment()), cuda);
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"hpctrain's GPU suite: one group of rows per run, JSON lines on stdout (scripts/gpu-check runs it)"};
  std::string group, device_name = "cuda";
  std::vector<std::string> rows;
  std::int64_t sequence = 0;
  app.add_option("group", group, "dist, llama, llama8b, float8, packed or switches")
      ->required()
      ->check(CLI::IsMember({"dist", "llama", "llama8b", "float8", "packed", "switches"}));
  app.add_option("--device", device_name, "cuda (default) or cpu")->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_option("--rows", rows,
                 "llama, llama8b: only these rows (ids, comma-separated), for a short call on a lent GPU")
      ->delimiter(',');
  app.add_option("--seq", sequence, "llama8b: packed rows of this many tokens (as many rows as keep a step's tokens)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  // Before anything initialises CUDA: with the GPUs hidden, the process group and the models see a CPU node.
  if (device_name == "cpu") ::setenv("CUDA_VISIBLE_DEVICES", "", 1);
  if (device_name == "cuda" && !torch::cuda::is_available()) {
    std::cerr << "hpctrain_gpu_suite: --device cuda, but CUDA is not available here (use --device cpu)\n";
    return 2;
  }
  const torch::Device device(device_name == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU));
  int failures = 0;
  if (group == "dist") {
    failures = std::getenv("RANK") != nullptr ? run_dist_rank(device.is_cuda()) : run_dist(device, device_name);
  } else if (group == "llama") {
    failures =
        suite::run_llama_rows(hpctrain::dist::init_process_group(hpctrain::slurm::World{}), device.is_cuda(), rows);
  } else if (group == "llama8b") {
    failures = suite::run_llama8b_rows(hpctrain::dist::init_process_group(hpctrain::slurm::World{}), device.is_cuda(),
                                       rows, sequence);
  } else if (group == "float8") {
    failures = suite::run_float8_rows(hpctrain::dist::init_process_group(hpctrain::slurm::World{}), device.is_cuda());
  } else if (group == "packed") {
    failures = suite::run_packed_rows(device);
  } else {
    failures = suite::run_switch_rows(device);
  }
  return failures == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::cerr << "hpctrain_gpu_suite: " << e.what() << '\n';
  return 1;
}
