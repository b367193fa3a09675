#pragma once
// The Trainer's whole step as one CUDA graph (Training::cuda_graphs, `--cuda-graphs`): forward, backward,
// clipping and the optimizer's update are captured once and then replayed, one launch a step instead of the
// ~1,000 kernels of a GPT-2 step whose launches leave the GPU idle between small kernels. What PyTorch's
// whole-network capture recipe does (torch.cuda.graph): warm-up steps on a side stream (lazy initialisation,
// cuBLAS's workspace for that stream, the runtime-compiled kernels), the step captured on that stream into a
// private memory pool, and the batch copied into the tensors the graph reads before each replay.
//
// A replay repeats the captured launches with the captured arguments: the batch must have the captured shapes
// (a batch of other shapes runs eagerly, as the warm-up steps do), the step must read nothing on the host (the
// Trainer's does not: clipping and the loss stay tensors), and the optimizer must keep its step counts and
// learning rates on the device (FusedAdamW::keep_counters_on_device). The per-step seed reaches the graph:
// CUDA's generator is registered with it, and each replay draws from the generator's seed at that time.
//
// Built only against a LibTorch with CUDA (ATen/cuda/CUDAGraph.h and the CUDA runtime's headers present);
// elsewhere `step_graphs_built` is false and the Trainer refuses the switch.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>
#include <torch/types.h>

#include <hpctrain/error.hpp>
#include <hpctrain/train/data/source.hpp>
#include <hpctrain/train/optim/fused_adamw.hpp>

#if __has_include(<ATen/cuda/CUDAGraph.h>) && __has_include(<cuda_runtime_api.h>)
#include <ATen/cuda/CUDAGraph.h>
#define HPCTRAIN_STEP_GRAPHS 1
#else
#define HPCTRAIN_STEP_GRAPHS 0
#endif

namespace hpctrain::detail {

/// Whether this program was built with CUDA graphs (against a LibTorch with CUDA).
inline constexpr bool step_graphs_built = HPCTRAIN_STEP_GRAPHS == 1;

/// What one optimizer step leaves: the step's mean loss and the gradients' norm before clipping (undefined
/// without clipping). 0-dim tensors on the device.
struct StepOutputs {
  torch::Tensor loss;
  torch::Tensor grad_norm;
};

/// The Trainer's step on a batch already on the device.
using DeviceStep = std::function<StepOutputs(const data::Batch&)>;

/// Whether `a` and `b` have the same tensors: names, shapes and dtypes.
inline bool same_layout(const data::Batch& a, const data::Batch& b) {
  const auto same = [](const torch::Tensor& x, const torch::Tensor& y) {
    return x.defined() == y.defined() && (!x.defined() || (x.sizes() == y.sizes() && x.dtype() == y.dtype()));
  };
  if (!same(a.inputs, b.inputs) || !same(a.targets, b.targets) || a.fields.size() != b.fields.size()) return false;
  for (const auto& [name, tensor] : a.fields) {
    const auto found = b.fields.find(name);
    if (found == b.fields.end() || !same(tensor, found->second)) return false;
  }
  return true;
}

/// Copies every tensor of `from` into `into`'s (same layout), without waiting when `non_blocking`.
inline void copy_batch(data::Batch& into, const data::Batch& from, bool non_blocking) {
  const auto copy = [&](torch::Tensor& to, const torch::Tensor& source) {
    if (to.defined()) to.copy_(source, non_blocking);
  };
  copy(into.inputs, from.inputs);
  copy(into.targets, from.targets);
  for (auto& [name, tensor] : into.fields) copy(tensor, from.fields.at(name));
}

/// The step captured once and replayed: `run` for every step of the run.
class StepGraph {
 public:
  /// Eager steps before the capture: PyTorch's recipe takes three.
  static constexpr std::int64_t warmup_steps = 3;

  /// `optimizer`: the run's, which from now on keeps its counts on the device.
  StepGraph(torch::Device device, FusedAdamW& optimizer) : device_(device), optimizer_(optimizer) {
    optimizer_.keep_counters_on_device();
#if HPCTRAIN_STEP_GRAPHS
    side_ = c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device);
#endif
  }

  /// One step on `batch` (on the host, or pinned when `non_blocking`): eagerly on the side stream for the
  /// first warm-up steps, then captured once, then replayed for every batch of the captured layout; a batch
  /// of another layout runs eagerly. Outputs of a replay are copies: the next replay overwrites the graph's.
  StepOutputs run(const data::Batch& batch, bool non_blocking, const DeviceStep& step) {
    if (eager_ < warmup_steps) {
      ++eager_;
      return on_side_stream([&] { return step(batch.to(device_, non_blocking)); });
    }
#if HPCTRAIN_STEP_GRAPHS
    if (!graph_) return capture(batch, non_blocking, step);
    if (same_layout(batch, static_batch_)) return replay(batch, non_blocking);
#endif
    ++eager_;
    ++other_layouts_;
    return on_side_stream([&] { return step(batch.to(device_, non_blocking)); });
  }

  /// Steps replayed (the captured one included), and steps run eagerly for a batch of another layout.
  std::int64_t replays() const { return replays_; }
  std::int64_t other_layouts() const { return other_layouts_; }

 private:
  /// `work` on the side stream, ordered after what the current stream has queued and before what it queues next.
  template <class Work>
  StepOutputs on_side_stream(const Work& work) {
    const c10::impl::VirtualGuardImpl guard(device_.type());
    const auto current = guard.getStream(device_);
    wait(side_, current);
    StepOutputs outputs;
    {
      c10::StreamGuard on_side(side_);
      outputs = work();
    }
    wait(current, side_);
    // Made on the side stream, read on the current one: the allocator must not hand their memory to the side
    // stream again before the current stream has read them.
    for (const auto* tensor : {&outputs.loss, &outputs.grad_norm})
      if (tensor->defined()) tensor->record_stream(current);
    return outputs;
  }

  /// `waiter` waits for what `queued` has queued so far.
  void wait(const c10::Stream& waiter, const c10::Stream& queued) const {
    c10::Event event(device_.type());
    event.record(queued);
    event.block(waiter);
  }

#if HPCTRAIN_STEP_GRAPHS
  /// Captures the step on `batch`'s layout into the graph, then replays it for this step.
  StepOutputs capture(const data::Batch& batch, bool non_blocking, const DeviceStep& step) {
    static_batch_ = batch.to(device_, non_blocking);
    // The warm-up steps' blocks back to the device, their gradients included (the captured step makes its own):
    // the graph's pool is its own, and would come on top of them.
    optimizer_.zero_grad(/*set_to_none=*/true);
    c10::cuda::CUDACachingAllocator::emptyCache();
    optimizer_.load_learning_rates();
    graph_ = std::make_unique<at::cuda::CUDAGraph>();
    const c10::impl::VirtualGuardImpl guard(device_.type());
    const auto current = guard.getStream(device_);
    wait(side_, current);
    optimizer_.set_capturing(true);
    try {
      c10::StreamGuard on_side(side_);
      // Thread-local: the prefetch thread pinning the next batch meanwhile does not break the capture.
      graph_->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      try {
        captured_ = step(static_batch_);
      } catch (...) {
        try {
          graph_->capture_end();  // ends the stream's capture and the pool's, whatever state they are in
        } catch (...) {
        }
        throw;
      }
      graph_->capture_end();
    } catch (const std::exception& e) {
      optimizer_.set_capturing(false);
      graph_.reset();
      throw RuntimeError(errors::runtime_cuda_graph,
                         fmt::format("--cuda-graphs: the training step could not be captured in a CUDA graph: {}. "
                                     "A captured step must not read a tensor on the host (.item(), a printed "
                                     "value, a shape taken from the data); run without --cuda-graphs",
                                     first_line(e.what())));
    }
    optimizer_.set_capturing(false);  // the capture counted this step on the host already
    wait(current, side_);
    graph_->replay();
    ++replays_;
    return copies();
  }

  StepOutputs replay(const data::Batch& batch, bool non_blocking) {
    copy_batch(static_batch_, batch, non_blocking);
    optimizer_.load_learning_rates();
    optimizer_.count_replayed_step();
    graph_->replay();
    ++replays_;
    return copies();
  }

  StepOutputs copies() const {
    return {captured_.loss.clone(), captured_.grad_norm.defined() ? captured_.grad_norm.clone() : torch::Tensor()};
  }

  static std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

  std::unique_ptr<at::cuda::CUDAGraph> graph_;
  data::Batch static_batch_;  ///< what the graph reads: each replay's batch is copied here
  StepOutputs captured_;      ///< what the graph writes
#endif

  torch::Device device_;
  FusedAdamW& optimizer_;
  c10::Stream side_ = c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::DeviceType::CPU));
  std::int64_t eager_ = 0, replays_ = 0, other_layouts_ = 0;
};

}  // namespace hpctrain::detail
