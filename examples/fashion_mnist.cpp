// Fashion-MNIST with a small CNN (2 conv + batch norm + pooling), trained data-parallel.
//   ./fashion_mnist --dry-run            the sbatch script it would submit
//   ./fashion_mnist --submit             2 nodes x 1 CPU task on the cluster; the log ends with test_accuracy=...
//   ./fashion_mnist --local 2            2 ranks on this machine
//   ./fashion_mnist --local 1 --epochs 1 --lr 1e-3    training knobs override the description
//   ./fashion_mnist --submit --sweep --max-steps 20   a 4-task array: lr x batch size (see below)
//   ./fashion_mnist --results            the last job's tasks: knob values, state, final metrics, best first
#include <hpctrain/hpctrain.hpp>
#include <torch/torch.h>  // the model's layers (torch::nn)
using namespace std::chrono_literals;
namespace ht = hpctrain;

// Two conv blocks (conv, batch norm, ReLU, 2x2 max pool) and a small classifier head: the dataset README's
// "2 conv + pooling + BN" row (0.934), small enough for one CPU core per rank.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : features(register_module("features", torch::nn::Sequential(
            torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).padding(1).bias(false)), torch::nn::BatchNorm2d(32),
            torch::nn::ReLU(), torch::nn::MaxPool2d(2),
            torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1).bias(false)), torch::nn::BatchNorm2d(64),
            torch::nn::ReLU(), torch::nn::MaxPool2d(2)))),
        classifier(register_module("classifier", torch::nn::Sequential(
            torch::nn::Flatten(), torch::nn::Linear(64 * 7 * 7, 128), torch::nn::ReLU(), torch::nn::Dropout(0.25),
            torch::nn::Linear(128, 10)))) {}
  torch::Tensor forward(torch::Tensor x) { return classifier->forward(features->forward(x)); }
  torch::nn::Sequential features, classifier;
};
TORCH_MODULE(Net);

int main(int argc, char** argv) {
  const std::string data = "/usr/share/datasets/fashion-mnist/";  // Debian's dataset-fashion-mnist
  auto job = ht::Job("fashion_mnist").nodes(2).cpus_per_task(1).time(30min).partition("debug")
                 .requeue_on_timeout(1min);  // USR2 a minute before the limit: checkpoint, requeue, resume
  auto training = ht::Training()
      .model([] { return Net(); }).loss(torch::nn::functional::cross_entropy)
      .optimizer([](auto parameters) {
        return torch::optim::AdamW(parameters, torch::optim::AdamWOptions(2e-3).weight_decay(1e-4));
      })
      .train_data(ht::data::idx(data + "train-images-idx3-ubyte.gz", data + "train-labels-idx1-ubyte.gz"))
      .eval_data(ht::data::idx(data + "t10k-images-idx3-ubyte.gz", data + "t10k-labels-idx1-ubyte.gz"))
      .batch_size(ht::global(128))  // the same optimisation at any world size that divides 128
      .epochs(6).schedule(ht::LrSchedule::warmup_cosine(200, 0.02)).seed(1)
      .log_every(50).eval_every(1000).checkpoint_every(250).metric(ht::metrics::accuracy);
  // `--sweep`, this example's own flag (taken out before ht::run parses the knobs): one array task per grid point.
  std::vector<char*> args(argv, argv + argc);
  if (std::erase_if(args, [](const char* arg) { return std::string_view(arg) == "--sweep"; }) > 0)
    job.sweep(ht::Sweep().grid("lr", {1e-3, 3e-3}).grid("batch_size", {64, 128}));
  return ht::run(static_cast<int>(args.size()), args.data(), job, training);
}
