#pragma once
// Peak memory of a measured phase: on CUDA, the caching allocator's peak of allocated bytes (what
// torch.cuda.max_memory_allocated() reads); on the CPU, the process's peak resident set (VmHWM), which
// reset_peak_memory starts again from the current resident set (Linux's /proc/self/clear_refs, "5"), so a
// CPU figure holds what the phase allocated plus what the process held when it began (and memory the C
// allocator kept from earlier phases).
//
// c10/cuda needs the CUDA runtime headers: a CPU-only LibTorch (or a machine without the CUDA toolkit)
// compiles the CPU half alone. CMake defines HPCTRAIN_GPU_SUITE_C10_CUDA when TorchConfig found c10_cuda.
#include <sys/resource.h>

#include <cstdint>
#include <fstream>
#include <string>

#include <torch/types.h>

#include <hpctrain/train/host_memory.hpp>

#if defined(HPCTRAIN_GPU_SUITE_C10_CUDA) && \
    __has_include(<c10/cuda/CUDACachingAllocator.h>) && __has_include(<cuda_runtime_api.h>)
#define HPCTRAIN_GPU_SUITE_CUDA_MEMORY 1
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace hpctrain_gpu_suite {

/// Whether peak_memory_bytes() reads the CUDA allocator on `device` (else the CPU's peak resident set).
inline bool reads_cuda_allocator(const torch::Device& device) {
#if defined(HPCTRAIN_GPU_SUITE_CUDA_MEMORY)
  return device.is_cuda();
#else
  (void)device;
  return false;
#endif
}

/// Frees cached blocks and starts a new peak (CUDA); starts the CPU's peak resident set again.
inline void reset_peak_memory(const torch::Device& device) {
  if (!device.is_cuda()) std::ofstream("/proc/self/clear_refs") << "5";
#if defined(HPCTRAIN_GPU_SUITE_CUDA_MEMORY)
  if (device.is_cuda()) {
    // The allocator's per-device state is created by CUDA's lazy initialisation; before the process's first
    // allocation on the device resetPeakStats throws "Invalid device argument". One small tensor creates it.
    (void)torch::empty({1}, torch::TensorOptions().device(device));
    c10::cuda::CUDACachingAllocator::emptyCache();
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
  }
#else
  (void)device;
#endif
}

/// Peak bytes since reset_peak_memory(device) (CUDA), or the process's peak resident set (CPU).
inline std::int64_t peak_memory_bytes(const torch::Device& device) {
#if defined(HPCTRAIN_GPU_SUITE_CUDA_MEMORY)
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
  }
#endif
  (void)device;
  if (const auto peak = hpctrain::detail::peak_resident_bytes(); peak > 0) return peak;
  rusage usage{};  // no /proc: the process's peak, never reset
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;  // kilobytes on Linux
}

}  // namespace hpctrain_gpu_suite
