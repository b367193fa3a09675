// hpctrain's side of bench/ddp_vs_torchrun: data-parallel SGD steps of an MLP on synthetic
// Fashion-MNIST-shaped data (784 -> 1024 -> 1024 -> 10, per-rank batch 64), driven as the Trainer drives
// it: through the DataParallelStrategy interface of hpctrain::Replicated (GradientSync over Gloo).
// bench/ddp_peer.py is the same training with torch DDP under torchrun. Rank 0 prints one JSON line.
//   hpctrain_ddp_bench [--ranks N] [--steps S] [--warmup W]
// --ranks N > 1 starts N ranks of this binary with hpctrain::launch_local (what `--local N` does).
// HPCTRAIN_BENCH_LAUNCH_TIME (seconds since the epoch, set by the driver just before it starts us) gives
// the launch-to-first-step time.
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/dist/dist.hpp>
#include <hpctrain/slurm/local_launch.hpp>
#include <hpctrain/slurm/world.hpp>
#include <hpctrain/train/strategies/replicated.hpp>

namespace {

double now_since_epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Settings {
  int ranks = 1;
  int steps = 100;
  int warmup = 5;
};

Settings parse(int argc, char** argv) {
  Settings settings;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::stoi(argv[i + 1]);
    if (flag == "--ranks") settings.ranks = value;
    else if (flag == "--steps") settings.steps = value;
    else if (flag == "--warmup") settings.warmup = value;
    else throw std::invalid_argument("unknown flag " + flag);
  }
  return settings;
}

}  // namespace

int main(int argc, char** argv) try {
  const auto settings = parse(argc, argv);
  if (settings.ranks > 1 && std::getenv("RANK") == nullptr) {
    return hpctrain::launch_local(
        settings.ranks, "/proc/self/exe",
        {"--steps", std::to_string(settings.steps), "--warmup", std::to_string(settings.warmup)});
  }
  torch::set_num_threads(1);  // one core per rank: world 1 and world 2 do the same work per rank
  auto group = hpctrain::dist::init_process_group(hpctrain::slurm::world_from_environment());

  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(784, 1024), torch::nn::ReLU(), torch::nn::Linear(1024, 1024),
                              torch::nn::ReLU(), torch::nn::Linear(1024, 10));
  std::unique_ptr<hpctrain::DataParallelStrategy> strategy = std::make_unique<hpctrain::Replicated>();
  strategy->setup(
      {group, model.ptr(), [](const hpctrain::NamedParameters& named) -> std::unique_ptr<torch::optim::Optimizer> {
         std::vector<torch::Tensor> parameters;
         for (const auto& [name, tensor] : named) parameters.push_back(tensor);
         return std::make_unique<torch::optim::SGD>(parameters, torch::optim::SGDOptions(0.01).momentum(0.9));
       }});
  torch::manual_seed(100 + group->rank());
  const auto inputs = torch::randn({64, 784});
  const auto targets = torch::randint(0, 10, {64});

  auto step = [&] {
    strategy->zero_grad();
    strategy->set_sync(true);
    torch::nn::functional::cross_entropy(model->forward(inputs), targets).backward();
    strategy->finish_gradients();
    strategy->step();
  };
  step();
  const double first_step_done = now_since_epoch();
  for (int i = 1; i < settings.warmup; ++i) step();
  hpctrain::dist::barrier(*group);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < settings.steps; ++i) step();
  hpctrain::dist::barrier(*group);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  if (group->rank() == 0) {
    const char* launched = std::getenv("HPCTRAIN_BENCH_LAUNCH_TIME");
    const double launch_to_first_step = launched ? first_step_done - std::stod(launched) : -1.0;
    std::cout << fmt::format(
                     R"({{"side": "hpctrain", "world": {}, "steps_per_s": {:.3f}, "launch_to_first_step_s": {:.3f}}})",
                     group->world_size(), settings.steps / seconds, launch_to_first_step)
              << std::endl;
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << e.what() << "\n";
  return 1;
}
