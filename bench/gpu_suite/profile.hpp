#pragma once
// A Chrome trace of a few training steps under the Kineto profiler (CPU ops and, on CUDA, kernels): where a
// step's time goes, beside torch.profiler's traces of the Python peers (bench/model_peer.py, bench/llama_peer.py),
// summed side by side by bench/trace_summary.py.
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>
#include <torch/torch.h>

namespace hpctrain_gpu_suite {

/// Runs `steps` calls of `step` under the profiler and saves the trace at `path`.
template <typename Step>
void profile(const std::string& path, const torch::Device& device, int steps, Step&& step) {
  namespace kineto = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const kineto::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (device.is_cuda()) activities.insert(ActivityType::CUDA);
  kineto::prepareProfiler(config, activities);
  kineto::enableProfiler(config, activities);
  for (int i = 0; i < steps; ++i) step();
  if (device.is_cuda()) torch::cuda::synchronize();
  // The folder is made here: Kineto's save only logs a failed open (the first traced GPU call lost its traces so).
  const auto folder = std::filesystem::path(path).parent_path();
  if (!folder.empty()) std::filesystem::create_directories(folder);
  kineto::disableProfiler()->save(path);
}

/// Where the suite's rows save traces: the folder HPCTRAIN_SUITE_TRACES names (a bench switch, not a test hook:
/// the rows' figures are the same with it), else nowhere.
inline std::string trace_path(const std::string& row_id) {
  const char* folder = std::getenv("HPCTRAIN_SUITE_TRACES");
  return folder != nullptr && *folder != '\0' ? std::string(folder) + "/" + row_id + ".json" : std::string();
}

}  // namespace hpctrain_gpu_suite
