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
#include <hpctrain/dist/process_group.hpp>
#include <hpctrain/dist/shard_collectives.hpp>
#include <hpctrain/error.hpp>

namespace hpctrain::dist {

namespace detail {

struct ShardedBucketState {
  std::size_t arrived = 0;
  bool complete = false;
  PendingReduceScatter reduce_scatter;
};

/// What the autograd hooks share with ShardedGradients (shared_ptr: hooks may outlive it).
struct ShardedGradientState {
  std::shared_ptr<ProcessGroup> group;
  FlatShardLayout layout;
  std::vector<torch::Tensor> parameters;
  std::vector<std::string> names;
  std::vector<std::pair<std::size_t, std::size_t>> slot_of;  // parameter -> (bucket, position)
  std::vector<bool> arrived;
  std::vector<ShardedBucketState> buckets;
  std::vector<torch::Tensor> gradient_shards;  // per bucket: this rank's averaged gradient shard
  std::size_t next_to_launch = 0;
  std::atomic<std::size_t> launched{0};
  bool sync = true;
  std::mutex mutex;

  void launch(std::size_t index) {
    const auto& bucket = layout.buckets()[index];
    torch::NoGradGuard no_grad;
    auto input = torch::zeros({bucket.padded_numel}, gradient_shards[index].options());
    for (std::size_t k = 0; k < bucket.parameters.size(); ++k) {
      auto& parameter = parameters[bucket.parameters[k]];
      if (!parameter.grad().defined()) continue;  // no gradient here this step: zeros, the peers may have one
      input.narrow(0, bucket.offsets[k], parameter.numel()).copy_(parameter.grad().reshape({-1}));
      parameter.mutable_grad().reset();  // the full gradient is not kept: only the shard survives
    }
    input.mul_(1.0 / group->world_size());
    buckets[index].reduce_scatter = start_reduce_scatter(*group, std::move(input), gradient_shards[index]);
    ++launched;
  }

  void launch_complete_buckets_in_order() {
    while (next_to_launch < buckets.size() && buckets[next_to_launch].complete) launch(next_to_launch++);
  }

  void on_gradient(std::size_t parameter) {
    std::lock_guard lock(mutex);
    if (!sync) return;
    if (arrived[parameter]) {
      throw RuntimeError("gradient_sync", fmt::format("parameter '{}' received a gradient twice before "
                                                      "finish_gradients(); call it after every synchronised backward",
                                                      names[parameter]));
    }
    arrived[parameter] = true;
    auto& bucket = buckets[slot_of[parameter].first];
    if (++bucket.arrived == layout.buckets()[slot_of[parameter].first].parameters.size()) {
      bucket.complete = true;
      launch_complete_buckets_in_order();
    }
  }
};

class GradientShardArrived : public torch::autograd::PostAccumulateGradHook {
 public:
  GradientShardArrived(std::shared_ptr<ShardedGradientState> state, std::size_t parameter)
      : state_(std::move(state)), parameter_(parameter) {}
  void operator()(const torch::autograd::Variable& /*tensor*/) override { state_->on_gradient(parameter_); }

 private:
  std::shared_ptr<ShardedGradientState> state_;
  std::size_t parameter_;
};

}  // namespace detail

/// Reduce-scatters gradients bucket by bucket during backward; each rank keeps its averaged shard only.
class ShardedGradients {
 public:
  /// `parameters` in the layout's order; installs the hooks (also at world size 1, where the
  /// reduce-scatter is a copy: the shard is the whole bucket).
  ShardedGradients(std::shared_ptr<ProcessGroup> group, FlatShardLayout layout, std::vector<torch::Tensor> parameters,
                   std::vector<std::string> names)
      : state_(std::make_shared<detail::ShardedGradientState>()) {
    auto& state = *state_;
    state.group = std::move(group);
    state.layout = std::move(layout);
    state.parameters = std::move(parameters);
    state.names = std::move(names);
    state.slot_of.resize(state.parameters.size());
    state.arrived.assign(state.parameters.size(), false);
    const auto& buckets = state.layout.buckets();
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      for (std::size_t k = 0; k < buckets[b].parameters.size(); ++k) state.slot_of[buckets[b].parameters[k]] = {b, k};
      const auto& first = state.parameters[buckets[b].parameters.front()];
      state.gradient_shards.push_back(torch::zeros({buckets[b].shard_numel}, first.options().requires_grad(false)));
      state.buckets.emplace_back();
    }
    for (std::size_t i = 0; i < state.parameters.size(); ++i) {
      torch::autograd::impl::set_post_acc_grad_hooks(state.parameters[i],
                                                     std::make_unique<detail::GradientShardArrived>(state_, i));
    }
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
    for (auto& bucket : state.buckets) bucket.complete = true;
    state.launch_complete_buckets_in_order();
    for (auto& bucket : state.buckets) {
      wait(*state.group, bucket.reduce_scatter);
      bucket.arrived = 0;
      bucket.complete = false;
    }
    state.arrived.assign(state.parameters.size(), false);
    state.next_to_launch = 0;
  }

  /// This rank's averaged gradient shard of bucket `b` (valid after finish()).
  const torch::Tensor& gradient_shard(std::size_t b) const { return state_->gradient_shards[b]; }
  /// Reduce-scatters launched since construction (instrumentation: communication during backward).
  std::size_t launched_bucket_count() const { return state_->launched; }

 private:
  std::shared_ptr<detail::ShardedGradientState> state_;
};

}  // namespace hpctrain::dist
