#pragma once
// Our DistributedDataParallel (LibTorch has none in C++). Gradients are grouped into buckets of about
// 25 MB (the first one smaller, so communication starts early), assigned in reverse registration order
// because backward produces the last layers' gradients first. A post-accumulate-grad hook on every
// parameter counts arrivals; a full bucket is copied into a flat buffer, pre-scaled by 1/world_size (Gloo
// has no AVG) and all-reduced asynchronously while backward goes on. Buckets are launched strictly in
// bucket order on every rank, so collectives pair up even if autograd completes them in another order.
// finish() waits for every bucket and writes the averaged gradients back before optimizer.step().
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <hpctrain/dist/collectives.hpp>
#include <hpctrain/dist/gradient_hooks.hpp>
#include <hpctrain/dist/process_group.hpp>
#include <hpctrain/dist/traffic.hpp>
#include <hpctrain/error.hpp>

namespace hpctrain::dist {

/// How GradientSync groups gradients.
struct GradientSyncOptions {
  /// Capacity of every bucket but the first. Default: 25 MiB (as torch DDP's bucket_cap_mb).
  std::size_t bucket_bytes = 25u << 20;
  /// Capacity of the first bucket: small, so the first all-reduce starts early in backward. Default: 1 MiB.
  std::size_t first_bucket_bytes = 1u << 20;
  /// Launch each bucket's all-reduce as soon as its gradients are in, while backward goes on (on NCCL the
  /// collectives run on the process group's own stream, beside the compute stream). false launches every
  /// bucket in finish(), after backward: the same collectives and results, no overlap; the GPU suite's
  /// dist.ddp.overlap row times both. Default: true.
  bool overlap_with_backward = true;
};

namespace detail {

/// One parameter as the bucket planner sees it.
struct ParameterShape {
  std::size_t bytes = 0;
  int dtype = 0;
  std::string device;
};

/// Groups parameters (indices in registration order) into buckets: reverse registration order, one dtype
/// and device per bucket, a bucket closes when the next parameter would overflow its capacity (a parameter
/// larger than a capacity gets a bucket of its own).
inline std::vector<std::vector<std::size_t>> plan_buckets(const std::vector<ParameterShape>& parameters,
                                                          const GradientSyncOptions& options) {
  std::vector<std::vector<std::size_t>> buckets;
  std::size_t filled = 0;
  for (std::size_t i = parameters.size(); i-- > 0;) {
    const auto& parameter = parameters[i];
    const std::size_t capacity = buckets.size() == 1 ? options.first_bucket_bytes : options.bucket_bytes;
    bool open_new = buckets.empty();
    if (!open_new) {
      const auto& first_of_current = parameters[buckets.back().front()];
      open_new = first_of_current.dtype != parameter.dtype || first_of_current.device != parameter.device ||
                 filled + parameter.bytes > capacity;
    }
    if (open_new) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(i);
    filled += parameter.bytes;
  }
  return buckets;
}

/// The launch order of bucketed gradient collectives, shared by GradientSync (all-reduce) and ShardedGradients
/// (reduce-scatter): counts each parameter's gradient as it arrives (from a post-accumulate-grad hook), marks
/// a bucket complete when all of its parameters arrived, and launches complete buckets strictly in bucket
/// order, so that the collectives pair up across ranks whatever order autograd finishes them in. The caller
/// serialises calls (its mutex); launched() may be read from any thread.
class BucketLaunchOrder {
 public:
  /// `buckets[b]` lists bucket b's parameters (indices below `parameters`).
  void plan(const std::vector<std::vector<std::size_t>>& buckets, std::size_t parameters) {
    bucket_of_.assign(parameters, 0);
    sizes_.clear();
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      sizes_.push_back(buckets[b].size());
      for (auto parameter : buckets[b]) bucket_of_[parameter] = b;
    }
    reset();
  }

  /// Records parameter `p`'s gradient and calls `launch(b)` for every bucket that may go now. A second
  /// gradient before reset() is a RuntimeError naming the parameter (`name`) and the call that resets
  /// (`finish_call`, e.g. "finish()"). With `launch_complete` false nothing is launched here: launch_all() does.
  template <class Launch>
  void arrive(std::size_t p, const std::string& name, std::string_view finish_call, Launch&& launch,
              bool launch_complete = true) {
    if (arrived_[p]) {
      throw RuntimeError(errors::runtime_gradient_sync,
                         fmt::format("parameter '{}' received a gradient twice before {}; call it "
                                     "after every synchronised backward",
                                     name, finish_call));
    }
    arrived_[p] = true;
    const auto b = bucket_of_[p];
    if (++counts_[b] == sizes_[b]) {
      complete_[b] = true;
      if (launch_complete) launch_in_order(launch);
    }
  }

  /// Launches every bucket not launched yet, in order: those whose gradients did not all arrive (unused
  /// parameters, or no backward at all) still go out, so that every rank launches the same collectives.
  template <class Launch>
  void launch_all(Launch&& launch) {
    std::fill(complete_.begin(), complete_.end(), true);
    launch_in_order(launch);
  }

  /// Whether parameter `p`'s gradient arrived since the last reset().
  bool arrived(std::size_t p) const { return arrived_[p]; }
  /// Forgets arrivals and launches: the next synchronised backward starts over.
  void reset() {
    arrived_.assign(bucket_of_.size(), false);
    counts_.assign(sizes_.size(), 0);
    complete_.assign(sizes_.size(), false);
    next_ = 0;
  }
  /// Buckets launched since plan() (instrumentation: shows communication starting during backward).
  std::size_t launched() const { return launched_; }

 private:
  template <class Launch>
  void launch_in_order(Launch& launch) {
    while (next_ < complete_.size() && complete_[next_]) {
      launch(next_++);
      ++launched_;
    }
  }

  std::vector<std::size_t> bucket_of_, sizes_, counts_;
  std::vector<bool> arrived_, complete_;
  std::size_t next_ = 0;
  std::atomic<std::size_t> launched_{0};
};

struct SyncBucket {
  std::vector<std::size_t> parameters;  // indices into SyncState::parameters
  std::vector<std::int64_t> offsets;    // element offset of each parameter in `buffer`
  torch::Tensor buffer;                 // flat gradients, all-reduced in place
  c10::intrusive_ptr<c10d::Work> work;
};

/// The state the autograd hooks share with GradientSync (shared_ptr: hooks may outlive a moved-from sync).
struct SyncState {
  std::shared_ptr<ProcessGroup> group;
  std::vector<torch::Tensor> parameters;
  std::vector<std::string> names;
  std::vector<SyncBucket> buckets;
  BucketLaunchOrder order;
  bool sync = true;
  bool overlap = true;  // GradientSyncOptions::overlap_with_backward
  std::vector<std::string> without_gradient;
  std::mutex mutex;

  void launch(std::size_t index) {
    auto& bucket = buckets[index];
    torch::NoGradGuard no_grad;
    for (std::size_t k = 0; k < bucket.parameters.size(); ++k) {
      const auto& parameter = parameters[bucket.parameters[k]];
      auto slice = bucket.buffer.narrow(0, bucket.offsets[k], parameter.numel());
      const auto& grad = parameter.grad();
      if (grad.defined()) {
        slice.copy_(grad.reshape({-1}));
      } else {
        slice.zero_();  // no gradient here this step: contribute zeros, the peers may have one
      }
    }
    bucket.buffer.mul_(1.0 / group->world_size());
    std::vector<torch::Tensor> tensors{bucket.buffer};
    bucket.work = start(*group, "gradient all_reduce", [&] { return group->backend()->allreduce(tensors); });
    note_started(*group, bucket.work, Collective::all_reduce, bucket.buffer.nbytes());
  }

  void on_gradient(std::size_t parameter) {
    std::lock_guard lock(mutex);
    if (!sync) return;
    order.arrive(
        parameter, names[parameter], "finish()", [this](std::size_t b) { launch(b); }, overlap);
  }
};

}  // namespace detail

/// Data-parallel gradient averaging overlapped with backward; rank 0's parameters are broadcast at construction.
class GradientSync {
 public:
  /// Broadcasts `module` from rank 0 and installs the gradient hooks (none at world size 1).
  GradientSync(std::shared_ptr<ProcessGroup> group, torch::nn::Module& module, GradientSyncOptions options = {})
      : state_(std::make_shared<detail::SyncState>()) {
    state_->group = std::move(group);
    state_->overlap = options.overlap_with_backward;
    std::vector<detail::ParameterShape> shapes;
    for (const auto& item : module.named_parameters()) {
      if (!item.value().requires_grad()) continue;
      state_->names.push_back(item.key());
      state_->parameters.push_back(item.value());
      shapes.push_back({static_cast<std::size_t>(item.value().numel()) * item.value().element_size(),
                        static_cast<int>(item.value().scalar_type()), item.value().device().str()});
    }
    plan_ = detail::plan_buckets(shapes, options);
    if (state_->group->world_size() == 1) return;

    broadcast_module(*state_->group, module);
    state_->order.plan(plan_, state_->parameters.size());
    for (std::size_t b = 0; b < plan_.size(); ++b) {
      detail::SyncBucket bucket;
      std::int64_t elements = 0;
      for (std::size_t position = 0; position < plan_[b].size(); ++position) {
        const auto parameter = plan_[b][position];
        bucket.parameters.push_back(parameter);
        bucket.offsets.push_back(elements);
        elements += state_->parameters[parameter].numel();
      }
      const auto& first = state_->parameters[plan_[b].front()];
      bucket.buffer = torch::zeros({elements}, first.options().requires_grad(false));
      state_->buckets.push_back(std::move(bucket));
    }
    detail::install_gradient_hooks(state_->parameters, state_);
  }

  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  /// Removes the hooks: the module trains locally again.
  ~GradientSync() {
    if (!state_ || state_->group->world_size() == 1) return;
    for (auto& parameter : state_->parameters) torch::autograd::impl::set_post_acc_grad_hooks(parameter, nullptr);
  }

  /// false on the non-final micro-steps of gradient accumulation: gradients accumulate locally, no communication.
  void set_sync(bool sync) {
    std::lock_guard lock(state_->mutex);
    state_->sync = sync;
  }

  /// Waits for every bucket and stores the averaged gradients in `.grad`; call before optimizer.step().
  /// Parameters that got no gradient on any rank this step end with a zero gradient; their names are in
  /// parameters_without_gradient().
  void finish() {
    auto& state = *state_;
    if (state.group->world_size() == 1) return;
    std::lock_guard lock(state.mutex);
    if (!state.sync) return;
    state.without_gradient.clear();
    for (std::size_t i = 0; i < state.parameters.size(); ++i)
      if (!state.order.arrived(i)) state.without_gradient.push_back(state.names[i]);
    state.order.launch_all([&state](std::size_t b) { state.launch(b); });
    torch::NoGradGuard no_grad;
    for (auto& bucket : state.buckets) {
      detail::wait_for(*state.group, bucket.work, "gradient all_reduce");
      for (std::size_t k = 0; k < bucket.parameters.size(); ++k) {
        auto& parameter = state.parameters[bucket.parameters[k]];
        auto averaged = bucket.buffer.narrow(0, bucket.offsets[k], parameter.numel()).view(parameter.sizes());
        if (parameter.grad().defined()) {
          parameter.mutable_grad().copy_(averaged);
        } else {
          parameter.mutable_grad() = averaged.clone();
        }
      }
      bucket.work.reset();
    }
    state.order.reset();
  }

  /// Parameter names per bucket, in launch order (the plan; also at world size 1).
  std::vector<std::vector<std::string>> bucket_parameter_names() const {
    std::vector<std::vector<std::string>> names;
    for (const auto& bucket : plan_) {
      names.emplace_back();
      for (auto parameter : bucket) names.back().push_back(state_->names[parameter]);
    }
    return names;
  }
  /// Number of buckets.
  std::size_t bucket_count() const { return plan_.size(); }
  /// All-reduces launched since construction (instrumentation: shows communication starting during backward).
  std::size_t launched_bucket_count() const {
    return state_ && state_->group->world_size() > 1 ? state_->order.launched() : 0;
  }
  /// Names of the parameters that received no gradient on this rank in the last synchronised step.
  std::vector<std::string> parameters_without_gradient() const { return state_->without_gradient; }

 private:
  std::shared_ptr<detail::SyncState> state_;
  std::vector<std::vector<std::size_t>> plan_;
};

}  // namespace hpctrain::dist
