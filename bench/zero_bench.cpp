// hpctrain's side of bench/zero_vs_torch: memory per rank and steps/s of Replicated (GradientSync + the
// optimizer on the whole model), ZeRO-1, ZeRO-2 and ZeRO-3 on a stack of Linear layers with AdamW, Gloo on
// CPU. Each Linear + ReLU is a block (hpctrain::ListsBlocks): ZeRO-3's unit; the head is outside the blocks.
// bench/zero_peer.py is the same training with torch DDP, ZeroRedundancyOptimizer and FSDP2 under torchrun.
//   hpctrain_zero_bench --strategy replicated|zero1|zero2|zero3 [--ranks N] [--steps S] [--width W] [--layers L]
// --ranks N > 1 starts N ranks of this binary with hpctrain::launch_local (what `--local N` does). Rank 0
// prints one JSON line with the largest figure over the ranks:
//   optimizer_state_bytes   tensors of the optimizer state this rank holds
//   param_grad_bytes        parameters + gradients (full, or the shard) + fp32 masters held between steps
//   peak_param_grad_bytes   the same plus, for ZeRO-3, the most gathered blocks held at once (measured)
//   max_rss_mb              the rank's peak resident set (getrusage), everything included
#include <sys/resource.h>

#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/dist/dist.hpp>
#include <hpctrain/models/blocks.hpp>
#include <hpctrain/slurm/local_launch.hpp>
#include <hpctrain/slurm/world.hpp>
#include <hpctrain/train/strategies/sharded.hpp>

namespace {

struct Settings {
  std::string strategy = "zero2";
  int ranks = 1;
  int steps = 20;
  int warmup = 3;
  int width = 1024;
  int layers = 8;
};

Settings parse(int argc, char** argv) {
  Settings settings;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--strategy") settings.strategy = value;
    else if (flag == "--ranks") settings.ranks = std::stoi(value);
    else if (flag == "--steps") settings.steps = std::stoi(value);
    else if (flag == "--warmup") settings.warmup = std::stoi(value);
    else if (flag == "--width") settings.width = std::stoi(value);
    else if (flag == "--layers") settings.layers = std::stoi(value);
    else throw std::invalid_argument("unknown flag " + flag);
  }
  return settings;
}

/// L x (Linear(W, W) + ReLU) blocks, then Linear(W, 10).
struct StackImpl : torch::nn::Module, hpctrain::ListsBlocks {
  explicit StackImpl(const Settings& settings) {
    for (int i = 0; i < settings.layers; ++i)
      layers.push_back(register_module(std::to_string(i), torch::nn::Linear(settings.width, settings.width)));
    head = register_module("head", torch::nn::Linear(settings.width, 10));
  }
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override {
    std::vector<std::shared_ptr<torch::nn::Module>> out;
    for (auto& layer : layers) out.push_back(layer.ptr());
    return out;
  }
  torch::Tensor forward(torch::Tensor x) {
    for (std::size_t i = 0; i < layers.size(); ++i)
      x = run_block(
          i, [layer = layers[i]](const torch::Tensor& in) mutable { return torch::relu(layer(in)); }, x);
    return head(x);
  }
  std::vector<torch::nn::Linear> layers;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Stack);

Stack make_model(const Settings& settings) { return Stack(settings); }

std::unique_ptr<torch::optim::Optimizer> make_adamw(const hpctrain::NamedParameters& named) {
  std::vector<torch::Tensor> tensors;
  for (const auto& item : named) tensors.push_back(item.second);
  return std::make_unique<torch::optim::AdamW>(tensors, torch::optim::AdamWOptions(1e-4).weight_decay(0.01));
}

std::size_t state_bytes(const torch::optim::Optimizer& optimizer) {
  std::size_t bytes = 0;
  for (const auto& [key, state] : optimizer.state()) bytes += hpctrain::detail::state_tensor_bytes(*state);
  return bytes;
}

double max_over_ranks(hpctrain::dist::ProcessGroup& group, double value) {
  if (group.world_size() == 1) return value;
  std::vector<torch::Tensor> buffer{torch::full({1}, value, torch::kFloat64)};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  group.backend()->allreduce(buffer, options)->wait();
  return buffer[0].item<double>();
}

}  // namespace

int main(int argc, char** argv) try {
  const auto settings = parse(argc, argv);
  if (settings.ranks > 1 && std::getenv("RANK") == nullptr) {
    std::vector<std::string> forwarded;
    for (int i = 1; i < argc; ++i) forwarded.push_back(argv[i]);
    return hpctrain::launch_local(settings.ranks, "/proc/self/exe", forwarded);
  }
  torch::set_num_threads(1);  // one core per rank
  auto group = hpctrain::dist::init_process_group(hpctrain::slurm::world_from_environment());
  torch::manual_seed(0);
  auto model = make_model(settings);
  torch::manual_seed(100 + group->rank());
  const auto inputs = torch::randn({32, settings.width});
  const auto targets = torch::randint(0, 10, {32});
  auto loss = [&] { return torch::nn::functional::cross_entropy(model->forward(inputs), targets); };

  std::function<void()> step;
  std::function<std::size_t()> optimizer_bytes, param_grad_bytes, peak_param_grad_bytes;
  std::unique_ptr<hpctrain::dist::GradientSync> sync;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<hpctrain::DataParallelStrategy> sharded;
  std::size_t parameter_bytes = 0;
  for (const auto& parameter : model->parameters()) parameter_bytes += parameter.nbytes();
  if (settings.strategy == "replicated") {
    sync = std::make_unique<hpctrain::dist::GradientSync>(group, *model);
    hpctrain::NamedParameters named;
    for (const auto& item : model->named_parameters()) named.emplace_back(item.key(), item.value());
    optimizer = make_adamw(named);
    step = [&] {
      optimizer->zero_grad();
      loss().backward();
      sync->finish();
      optimizer->step();
    };
    optimizer_bytes = [&] { return state_bytes(*optimizer); };
    param_grad_bytes = [&] { return 2 * parameter_bytes; };
  } else {
    const auto stage = hpctrain::zero_stage_from_name(settings.strategy);
    if (!stage || *stage == hpctrain::no_sharding) throw std::invalid_argument("unknown strategy " + settings.strategy);
    sharded = hpctrain::make_zero_strategy(*stage);
    sharded->setup({group, model.ptr(), make_adamw});
    step = [&] {
      sharded->zero_grad();
      sharded->set_sync(true);
      loss().backward();
      sharded->finish_gradients();
      sharded->step();
    };
    if (auto* zero = dynamic_cast<hpctrain::ZeroStrategy*>(sharded.get())) {
      optimizer_bytes = [zero] { return zero->optimizer_state_bytes(); };
      param_grad_bytes = [zero, parameter_bytes] {
        return parameter_bytes + zero->gradient_bytes() + zero->master_bytes();
      };
    } else {
      auto* full = dynamic_cast<hpctrain::FullyShardedStrategy*>(sharded.get());
      optimizer_bytes = [full] { return full->optimizer_state_bytes(); };
      param_grad_bytes = [full] {
        return full->resident_parameter_bytes() + full->gradient_bytes() + full->master_bytes();
      };
      peak_param_grad_bytes = [full, param_grad_bytes] { return param_grad_bytes() + full->peak_gathered_bytes(); };
    }
  }
  if (!peak_param_grad_bytes) peak_param_grad_bytes = param_grad_bytes;

  for (int i = 0; i < settings.warmup; ++i) step();
  hpctrain::dist::barrier(*group);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < settings.steps; ++i) step();
  hpctrain::dist::barrier(*group);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  const double optimizer_max = max_over_ranks(*group, static_cast<double>(optimizer_bytes()));
  const double param_grad_max = max_over_ranks(*group, static_cast<double>(param_grad_bytes()));
  const double peak_max = max_over_ranks(*group, static_cast<double>(peak_param_grad_bytes()));
  const double rss_max = max_over_ranks(*group, usage.ru_maxrss / 1024.0);
  if (group->rank() == 0) {
    std::cout << fmt::format(
                     R"({{"side": "hpctrain", "strategy": "{}", "world": {}, "parameters": {}, )"
                     R"("optimizer_state_bytes": {:.0f}, "param_grad_bytes": {:.0f}, "peak_param_grad_bytes": {:.0f}, )"
                     R"("max_rss_mb": {:.1f}, )"
                     R"("steps_per_s": {:.3f}}})",
                     settings.strategy, group->world_size(), parameter_bytes / 4, optimizer_max, param_grad_max,
                     peak_max, rss_max, settings.steps / seconds)
              << std::endl;
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << e.what() << "\n";
  return 1;
}
