// A program built inside the image containers/Dockerfile makes (docs/containers.md, "An image for your cluster"):
// a classifier of a linear teacher's labels, declared for 2 nodes x 8 GPUs running in that image under pyxis.
//   in the image:  cmake -S . -B build -G Ninja && cmake --build build && ./build/train --local 1
//   login node:    ./build/train --submit   (in the image too: its RUNPATH names the image's LibTorch)
#include <hpctrain/hpctrain.hpp>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

using namespace std::chrono_literals;
namespace ht = hpctrain;

int main(int argc, char** argv) {
  // The same examples in every process: a fixed seed.
  auto generator = at::make_generator<at::CPUGeneratorImpl>(7);
  auto inputs = torch::randn({4096, 16}, generator);
  auto targets = inputs.matmul(torch::randn({16, 4}, generator)).argmax(1);

  auto job = ht::Job("train")
                 .nodes(2)
                 .gpus_per_node(8)  // one rank a GPU
                 .time(30min)
                 .requeue_on_timeout(2min)
                 .container(ht::Pyxis("./hpctrain-cu130.sqsh"));  // enroot import's output (containers/Dockerfile)
  auto training =
      ht::Training()
          .model([] {
            return torch::nn::Sequential(torch::nn::Linear(16, 64), torch::nn::ReLU(), torch::nn::Linear(64, 4));
          })
          .loss(torch::nn::functional::cross_entropy)
          .optimizer([](auto parameters) { return torch::optim::AdamW(parameters, 3e-3); })
          .train_data(ht::data::tensors(inputs, targets))
          .batch_size(ht::global(128))
          .schedule(ht::LrSchedule::warmup_cosine(5, 0.1))
          .max_steps(30)
          .log_every(10);
  return ht::run(argc, argv, job, training);
}
