// A training through the real Trainer (`hpctrain::run`) whose loss curve does not depend on the world size:
// no dropout, no batch norm, a global batch that 3 and 4 ranks split evenly (96 = 4 x 2 x 12 = 3 x 2 x 16).
// tests/dist/reshard_training_test.sh checkpoints it at `--local 4` and resumes it at `--local 3 --resume DIR`.
// The MLP lists its two hidden layers as blocks, so every `--sharding` stage runs it (zero3 by default).
#include <hpctrain/hpctrain.hpp>
#include <hpctrain/models/blocks.hpp>  // ListsBlocks
#include <torch/torch.h>               // the model's layers (torch::nn)

using namespace std::chrono_literals;
namespace ht = hpctrain;

struct MlpImpl : torch::nn::Module, ht::ListsBlocks {
  MlpImpl()
      : first(register_module("first", torch::nn::Linear(32, 61))),
        second(register_module("second", torch::nn::Linear(61, 47))),
        head(register_module("head", torch::nn::Linear(47, 10))) {}
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override { return {first.ptr(), second.ptr()}; }
  torch::Tensor forward(torch::Tensor x) {
    x = run_block(
        0, [this](const torch::Tensor& in) { return torch::relu(first(in)); }, x);
    x = run_block(
        1, [this](const torch::Tensor& in) { return torch::tanh(second(in)); }, x);
    return head(x);
  }
  torch::nn::Linear first, second, head;
};
TORCH_MODULE(Mlp);

int main(int argc, char** argv) {
  // The same data in every process: a noisy linear teacher's classes.
  auto generator = at::make_generator<at::CPUGeneratorImpl>(12345);
  auto inputs = torch::randn({9600, 32}, generator);
  auto teacher = torch::randn({32, 10}, generator);
  auto targets = (inputs.matmul(teacher) + 0.5 * torch::randn({9600, 10}, generator)).argmax(1);

  auto job = ht::Job("reshard_training").nodes(1).tasks_per_node(4).cpus_per_task(1).time(10min).partition("debug");
  auto training = ht::Training()
                      .model([] { return Mlp(); })
                      .optimizer([](const ht::NamedParameters& parameters) {
                        auto options = torch::optim::AdamWOptions(3e-3).weight_decay(0.1);
                        return torch::optim::AdamW(ht::weight_decay_groups(parameters, options), options);
                      })
                      .train_data(ht::data::tensors(inputs, targets))
                      .batch_size(ht::global(96))
                      .gradient_accumulation(2)
                      .clip_grad_norm(1.0)
                      .max_steps(40)
                      .schedule(ht::LrSchedule::warmup_cosine(5, 0.1))
                      .seed(3)
                      .log_every(1)
                      .checkpoint_every(10)
                      .sharding(ht::zero3);
  return ht::run(argc, argv, job, training);
}
