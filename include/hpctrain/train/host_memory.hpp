#pragma once
// Host memory between steps on a CPU device (Training::keep_freed_memory). A CPU step allocates and frees the
// same big tensors every time: GPT-2's head alone makes [tokens, 50257] logits in bf16 and fp32, their
// log-softmax and gradients, 100-200 MB each for 1024 tokens. glibc serves a block over its mmap threshold
// (at most 32 MB) with mmap and returns it with munmap on free, so every step page-faults all of it in again
// and the kernel zeroes each page. Measured on the 2-core dev machine (one thread, bf16): the head's forward
// and backward took 773 ms per step that way and 450 ms with the memory kept; PyTorch's CPU tuning guide
// gets the same by preloading jemalloc or tcmalloc. This asks glibc to keep it: no mmap for big blocks (they
// come from the heap and go back to it) and no trimming of the heap's top. A rank's resident memory stays at
// its peak, which a training loop reaches every step anyway.
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <climits>
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

namespace hpctrain::detail {

/// Tells the C allocator to keep freed memory in the process; false where it cannot (not glibc).
inline bool keep_freed_host_memory() {
#if defined(__GLIBC__)
  return mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1;
#else
  return false;
#endif
}

/// A line of /proc/self/status in bytes ("VmHWM:   123456 kB"), or 0 where /proc does not say.
inline std::int64_t status_bytes(std::string_view field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(field.size())) * 1024;
  return 0;
}

/// Returns the free memory at the top of the heap and in its freed chunks to the kernel (glibc's malloc_trim):
/// under keep_freed_host_memory nothing is trimmed otherwise, and a big buffer freed and allocated again after
/// small allocations split its chunk takes new pages each time. No-op without glibc.
inline void return_freed_host_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

/// The process's peak resident memory so far in bytes (Linux's VmHWM), or 0 where /proc does not say.
inline std::int64_t peak_resident_bytes() { return status_bytes("VmHWM:"); }

/// The process's resident memory now in bytes (VmRSS), or 0 where /proc does not say.
inline std::int64_t resident_bytes() { return status_bytes("VmRSS:"); }

/// Starts the peak (VmHWM) again from the resident memory now, so that it measures what follows (Linux 4.0+:
/// writing 5 to /proc/self/clear_refs); false where it cannot.
inline bool reset_peak_resident() {
  std::ofstream clear("/proc/self/clear_refs");
  return static_cast<bool>(clear << "5" << std::flush);
}

}  // namespace hpctrain::detail
