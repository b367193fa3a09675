// A training built on the host and run inside a Charliecloud image that does not contain LibTorch: the job mounts
// the directory holding it (the venv) at the same path, so the binary's RUNPATH resolves inside as outside
// (docs/containers.md, "Containers and LibTorch"). tests/job/container_libtorch_test.sh submits it.
//   CONTAINER_IMAGE  the image directory (ch-run's)
//   CONTAINER_VENV   the directory to mount at its own path (the venv whose torch/lib is in the RUNPATH)
#include <fstream>

#include <hpctrain/hpctrain.hpp>

using namespace std::chrono_literals;
namespace ht = hpctrain;

namespace {
std::string required_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    fmt::print(stderr, "container_training: {} is not set (see the comment at the top of container_training.cpp)\n",
               name);
    std::exit(2);
  }
  return value;
}

/// The file LibTorch's CPU library was mapped from in this process (what the loader found through the RUNPATH).
std::string loaded_libtorch() {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find("/libtorch_cpu.so") != std::string::npos) return line.substr(line.find('/'));
  return "no libtorch_cpu.so";
}
}  // namespace

int main(int argc, char** argv) {
  const auto image = required_env("CONTAINER_IMAGE");
  const auto venv = required_env("CONTAINER_VENV");
  // ch-run sets CH_RUNNING inside the container: each rank says where it runs and which LibTorch it loaded.
  if (std::getenv("CH_RUNNING") != nullptr && std::getenv("SLURM_PROCID") != nullptr)
    fmt::print("container_training: rank {} on {} runs inside ch-run with {}\n", std::getenv("SLURM_PROCID"),
               std::getenv("SLURMD_NODENAME") ? std::getenv("SLURMD_NODENAME") : "?", loaded_libtorch());

  // The same data in every process: a linear teacher's four classes.
  auto generator = at::make_generator<at::CPUGeneratorImpl>(7);
  auto inputs = torch::randn({2048, 16}, generator);
  auto targets = inputs.matmul(torch::randn({16, 4}, generator)).argmax(1);

  auto job = ht::Job("container_training")
                 .nodes(2)
                 .tasks_per_node(1)
                 .cpus_per_task(1)
                 .time(5min)
                 .partition("debug")
                 .container(ht::Charliecloud(image))
                 .mount("/usr", "/usr")  // the image's /usr is empty: the host's compiler-built libraries
                 .mount(venv, venv);     // LibTorch at the path the binary's RUNPATH names
  auto training = ht::Training()
                      .model([] { return torch::nn::Linear(16, 4); })
                      .optimizer([](auto parameters) { return torch::optim::AdamW(parameters, 1e-2); })
                      .loss(torch::nn::functional::cross_entropy)
                      .train_data(ht::data::tensors(inputs, targets))
                      .batch_size(ht::global(64))
                      .max_steps(30)
                      .seed(1)
                      .log_every(10);
  return ht::run(argc, argv, job, training);
}
