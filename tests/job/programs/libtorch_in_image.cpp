// A one-file LibTorch program that tests/job/container_build_in_image_test.sh compiles inside a Charliecloud image,
// with the image's compiler against the image's LibTorch, and runs there: a least-squares fit by gradient descent
// through autograd, then the file its LibTorch came from. Only per-operator ATen headers: a test compiles it in
// every run (12 s and 0.5 GB, against 35 s and 0.9 GB with <torch/nn> and <torch/optim>, on a loaded 2-core EPYC).
#include <cstdio>
#include <fstream>
#include <string>

#include <ATen/core/Tensor.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/headeronly/version.h>

int main() {
  const auto inputs = at::randn({256, 8});
  const auto targets = inputs.matmul(at::randn({8, 1}));  // an exact linear teacher: the loss can fall to 0
  auto weights = at::zeros({8, 1}).requires_grad_();
  for (int step = 0; step <= 50; ++step) {
    auto loss = at::mse_loss(inputs.matmul(weights), targets);
    if (step % 25 == 0) std::printf("step %d loss %.9g\n", step, loss.item<double>());
    loss.backward();
    c10::NoGradGuard no_grad;
    weights.sub_(weights.grad(), 0.1);
    weights.mutable_grad().zero_();
  }
  // Which LibTorch the loader found: the RUNPATH's, inside the image.
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find("/libtorch_cpu.so") != std::string::npos) {
      std::printf("LibTorch %s from %s\n", TORCH_VERSION, line.substr(line.find('/')).c_str());
      return 0;
    }
  std::printf("libtorch_cpu.so is not mapped\n");
  return 1;
}
