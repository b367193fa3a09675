#pragma once
// Host memory for the sharded strategies' flat buffers on a CPU device: a ZeRO-3 unit gathered whole (its
// forward, its backward), the padded flat gradient a reduce-scatter sends, ZeRO-2's gradient buckets. Each is
// one allocation of a few tens of MB (a 137M Llama's block: 45 MB), made and freed several times a step
// between the activations' allocations of 1-10 MB. From glibc's heap with the Trainer's keep_freed_memory (no
// mmap, no trimming: train/host_memory.hpp) those freed buffers were split by the activations that followed
// them, and each later buffer took new pages from the top of the heap: measured on that Llama under zero3 in
// fp32 at --local 4, a rank's heap held 1.1 GiB in use at most and 2.4 GiB in all after the second step; its
// peak resident memory was 2.62 GiB, and 2.01 and 2.02 GiB (two runs) with these buffers in the pool. At --local 1
// and 2, where the activations are larger than a unit, it did not move beyond a run's spread (3.95 and 4.10 GiB,
// 2.78 and 2.79 GiB): there the activations' own chunks are what the heap keeps (lm/memory_plan.hpp counts it).
//
// The pool keeps them out of the heap, as the CUDA caching allocator keeps a GPU's: each buffer is mapped on
// its own (mmap) and, once freed, kept for the next request of the same size (every unit of a model asks for
// the same few sizes again each step), so no page is faulted in again and no heap chunk is split. It keeps at
// most `kept_per_size` free buffers of a size (a step holds at most two units gathered and two reduce-scatters
// in flight, and a third being allocated) and unmaps the rest, so gathering a whole model once (an export, a
// digest) does not leave it resident.
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include <c10/core/Allocator.h>
#include <torch/types.h>

namespace hpctrain::dist {

/// A c10::Allocator of page-mapped host buffers, freed buffers kept for reuse by size (the header's comment).
class HostBufferPool final : public c10::Allocator {
 public:
  /// Free buffers of one size kept for reuse; more are unmapped when freed.
  static constexpr std::size_t kept_per_size = 4;

  c10::DataPtr allocate(std::size_t bytes) override {
    if (bytes == 0) return {nullptr, nullptr, &release, c10::Device(c10::DeviceType::CPU)};
    void* data = take(bytes);
    if (data == nullptr) {
      data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (data == MAP_FAILED) throw std::bad_alloc();
      std::lock_guard lock(mutex_);
      mapped_bytes_ += bytes;
    }
    return {data, new Buffer{this, data, bytes}, &release, c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void* destination, const void* source, std::size_t count) const override {
    std::memcpy(destination, source, count);
  }

  /// Bytes mapped now: the buffers in use and the free ones kept.
  std::size_t mapped_bytes() const {
    std::lock_guard lock(mutex_);
    return mapped_bytes_;
  }

  /// The process's pool (never destroyed: tensors may free their buffers during exit).
  static HostBufferPool& instance() {
    static auto* pool = new HostBufferPool();
    return *pool;
  }

 private:
  struct Buffer {
    HostBufferPool* pool;
    void* data;
    std::size_t bytes;
  };

  void* take(std::size_t bytes) {
    std::lock_guard lock(mutex_);
    auto found = free_.find(bytes);
    if (found == free_.end() || found->second.empty()) return nullptr;
    void* data = found->second.back();
    found->second.pop_back();
    return data;
  }

  void give_back(void* data, std::size_t bytes) {
    {
      std::lock_guard lock(mutex_);
      auto& kept = free_[bytes];
      if (kept.size() < kept_per_size) {
        kept.push_back(data);
        return;
      }
      mapped_bytes_ -= bytes;
    }
    munmap(data, bytes);
  }

  static void release(void* context) {
    auto* buffer = static_cast<Buffer*>(context);
    if (buffer == nullptr) return;
    buffer->pool->give_back(buffer->data, buffer->bytes);
    delete buffer;
  }

  mutable std::mutex mutex_;
  std::map<std::size_t, std::vector<void*>> free_;  // by size in bytes
  std::size_t mapped_bytes_ = 0;
};

/// An uninitialised flat tensor of `numel` elements: on a CPU device from the HostBufferPool, elsewhere from the
/// device's own allocator (a GPU's caching allocator already does what the pool does).
inline torch::Tensor empty_flat_buffer(std::int64_t numel, const torch::TensorOptions& options) {
  if (!options.device().is_cpu()) return torch::empty({numel}, options);
  auto& pool = HostBufferPool::instance();
  const auto bytes = static_cast<std::size_t>(numel) * torch::elementSize(torch::typeMetaToScalarType(options.dtype()));
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, pool.allocate(bytes), &pool, /*resizable=*/false);
  return torch::empty({0}, options).set_(storage, 0, {numel}, {1});
}

}  // namespace hpctrain::dist
