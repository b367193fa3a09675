#pragma once
// ZeRO-2's gradient path: GradientSync's overlap, with a reduce-scatter instead of an all-reduce. A
// post-accumulate-grad hook on every parameter counts arrivals per bucket of a FlatShardLayout; a full
// bucket is copied into a fresh padded flat buffer (pre-scaled by 1/world_size: Gloo has no AVG), its
// parameters' `.grad` are released at once (each rank keeps only its shard from here on), and the buffer is
// reduce-scattered into the bucket's persistent gradient shard while backward goes on. Buckets launch
// strictly in bucket order on every rank, so collectives pair up whatever order autograd finishes them in.
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>

#include <hpctrain/dist/flat_shards.hpp>
#include <hpctrain/dist/gradient_hooks.hpp>
#include <hpctrain/dist/gradient_sync.hpp>
#include <hpctrain/dist/host_buffer_pool.hpp>
#include <hpctrain/dist/process_group.hpp>
#include <hpctrain/dist/shard_collectives.hpp>
#include <hpctrain/error.hpp>

namespace hpctrain::dist {

namespace detail {}  // namespace detail

/// Copies the gradients of `bucket`'s parameters into a fresh padded flat buffer (pre-scaled by 1/N: Gloo has
/// no AVG; a parameter without gradient contributes zeros, the peers may have one), releases them (only the
/// shard survives), and starts reduce-scattering the buffer into `gradient_shard`. Nothing for an empty bucket.
/// N is the group's size, or `average_over` when positive (hybrid sharding: the whole world, whose other shard
/// groups' sums are added afterwards). The sum is taken in `reduce_dtype` (the input buffer's; kUndefined: the
/// gradient shard's) and converted into the shard's dtype when it is done.
inline PendingReduceScatter start_bucket_reduce_scatter(ProcessGroup& group, const FlatBucket& bucket,
                                                        std::vector<torch::Tensor>& parameters,
                                                        torch::Tensor gradient_shard, int average_over = 0,
                                                        torch::ScalarType reduce_dtype = c10::ScalarType::Undefined) {
  if (bucket.padded_numel == 0) return {};
  torch::NoGradGuard no_grad;
  const auto dtype = reduce_dtype == c10::ScalarType::Undefined ? gradient_shard.scalar_type() : reduce_dtype;
  auto input = empty_flat_buffer(bucket.padded_numel, gradient_shard.options().dtype(dtype)).zero_();  // CPU: heap
  for (std::size_t k = 0; k < bucket.parameters.size(); ++k) {
    auto& parameter = parameters[bucket.parameters[k]];
    if (!parameter.grad().defined()) continue;
    input.narrow(0, bucket.offsets[k], parameter.grad().numel()).copy_(parameter.grad().reshape({-1}));
    parameter.mutable_grad().reset();
  }
  input.mul_(1.0 / (average_over > 0 ? average_over : group.world_size()));
  return start_reduce_scatter(group, std::move(input), std::move(gradient_shard));
}

namespace detail {

/// What the autograd hooks share with ShardedGradients (shared_ptr: hooks may outlive it).
struct ShardedGradientState {
  std::shared_ptr<ProcessGroup> group;
  FlatShardLayout layout;
  std::vector<torch::Tensor> parameters;
  std::vector<std::string> names;
  std::vector<PendingReduceScatter> reduce_scatters;  // per bucket
  std::vector<torch::Tensor> gradient_shards;         // per bucket: this rank's averaged gradient shard
  torch::ScalarType reduce_dtype =
      c10::ScalarType::Undefined;  // what the reduce-scatters sum in (undefined: the shards')
  BucketLaunchOrder order;         // GradientSync's: strictly in bucket order
  bool sync = true;
  std::mutex mutex;

  void launch(std::size_t index) {
    reduce_scatters[index] = start_bucket_reduce_scatter(*group, layout.buckets()[index], parameters,
                                                         gradient_shards[index], 0, reduce_dtype);
  }

  void on_gradient(std::size_t parameter) {
    std::lock_guard lock(mutex);
    if (!sync) return;
    order.arrive(parameter, names[parameter], "finish_gradients()", [this](std::size_t b) { launch(b); });
  }
};

}  // namespace detail

/// Reduce-scatters gradients bucket by bucket during backward; each rank keeps its averaged shard only.
class ShardedGradients {
 public:
  /// `parameters` in the layout's order; installs the hooks (also at world size 1, where the
  /// reduce-scatter is a copy: the shard is the whole bucket).
  /// `reduce_dtype`: what the reduce-scatters sum in (kUndefined: the parameters' dtype).
  ShardedGradients(std::shared_ptr<ProcessGroup> group, FlatShardLayout layout, std::vector<torch::Tensor> parameters,
                   std::vector<std::string> names, torch::ScalarType reduce_dtype = c10::ScalarType::Undefined)
      : state_(std::make_shared<detail::ShardedGradientState>()) {
    auto& state = *state_;
    state.reduce_dtype = reduce_dtype;
    state.group = std::move(group);
    state.layout = std::move(layout);
    state.parameters = std::move(parameters);
    state.names = std::move(names);
    const auto& buckets = state.layout.buckets();
    std::vector<std::vector<std::size_t>> plan;
    for (const auto& bucket : buckets) {
      plan.push_back(bucket.parameters);
      const auto& first = state.parameters[bucket.parameters.front()];
      state.gradient_shards.push_back(torch::zeros({bucket.shard_numel}, first.options().requires_grad(false)));
    }
    state.reduce_scatters.resize(buckets.size());
    state.order.plan(plan, state.parameters.size());
    detail::install_gradient_hooks(state.parameters, state_);
  }
  ShardedGradients(const ShardedGradients&) = delete;
  ShardedGradients& operator=(const ShardedGradients&) = delete;
  ~ShardedGradients() {
    for (auto& parameter : state_->parameters) torch::autograd::impl::set_post_acc_grad_hooks(parameter, nullptr);
  }

  /// false on the non-final micro-steps of an accumulation: full gradients accumulate locally.
  void set_sync(bool sync) {
    std::lock_guard lock(state_->mutex);
    state_->sync = sync;
  }

  /// Launches the buckets that are still missing gradients (unused parameters: zeros), waits for all.
  /// Afterwards gradient_shard(b) holds the average over all ranks of this rank's shard of bucket b.
  void finish() {
    auto& state = *state_;
    std::lock_guard lock(state.mutex);
    if (!state.sync) return;
    state.order.launch_all([&state](std::size_t b) { state.launch(b); });
    for (auto& reduce_scatter : state.reduce_scatters) wait(*state.group, reduce_scatter);
    state.order.reset();
  }

  /// This rank's averaged gradient shard of bucket `b` (valid after finish()).
  const torch::Tensor& gradient_shard(std::size_t b) const { return state_->gradient_shards[b]; }
  /// Reduce-scatters launched since construction (instrumentation: communication during backward).
  std::size_t launched_bucket_count() const { return state_->order.launched(); }

 private:
  std::shared_ptr<detail::ShardedGradientState> state_;
};

}  // namespace hpctrain::dist
