#pragma once
// Blocking collectives over a ProcessGroup. Each is a no-op (or the identity) at world size 1, so a
// training loop calls them unconditionally. A failed collective marks the group failed (so its
// destructor does not wait for peers that may be dead) and throws RuntimeError(errors::runtime_collective).
#include <cstddef>
#include <cstdint>
#include <map>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <hpctrain/dist/process_group.hpp>
#include <hpctrain/dist/simulated_link.hpp>
#include <hpctrain/dist/traffic.hpp>
#include <hpctrain/error.hpp>

namespace hpctrain::dist {

namespace detail {

/// Waits for `work` (Gloo: up to the group's current timeout; NCCL: stream-ordered, the watchdog's timeout); a
/// failure (a peer died, the timeout passed) becomes RuntimeError naming this rank, the operation and the timeout
/// that governed the wait.
inline void wait_for(ProcessGroup& group, const c10::intrusive_ptr<c10d::Work>& work, std::string_view operation) {
  try {
    // NCCL: stream-ordered. Without a timeout the wait only makes the current stream wait on the collective's
    // event and the host runs on (prefetching the next blocks); with one, c10d polls the host until the
    // collective ends, a host stall at every wait. The backend's watchdog enforces its timeout there
    // (backend_timeout). Gloo's collectives run on the host: its wait blocks (no spinning) up to ours.
    if (group.device().is_cuda()) work->wait();
    else work->wait(group.timeout());
    if (auto* link = group.simulated_link()) link->wait(work.get());
  } catch (const std::exception& e) {
    group.mark_failed();
    throw RuntimeError(errors::runtime_collective,
                       fmt::format("rank {} of {}: {} failed ({}): {}", group.rank(), group.world_size(), operation,
                                   group.describe_timeout(), e.what()));
  }
}

/// Starts an operation; a failure to even start it is reported like a failed wait.
template <class Start>
c10::intrusive_ptr<c10d::Work> start(ProcessGroup& group, std::string_view operation, Start&& start_operation) {
  try {
    return start_operation();
  } catch (const std::exception& e) {
    group.mark_failed();
    throw RuntimeError(errors::runtime_collective, fmt::format("rank {} of {}: {} failed: {}", group.rank(),
                                                               group.world_size(), operation, e.what()));
  }
}

/// Counts a collective of `kind` over a payload of `bytes` that has just started (dist/traffic.hpp), and queues it on
/// the simulated link where a test asks for one (dist/simulated_link.hpp).
inline void note_started(ProcessGroup& group, const c10::intrusive_ptr<c10d::Work>& work, Collective kind,
                         std::size_t payload) {
  const auto bytes = static_cast<std::int64_t>(payload);
  count_collective(kind, bytes);
  if (auto* link = group.simulated_link()) link->started(work.get(), kind, bytes, group.world_size());
}

/// Rank 0's values of `tensors` (one dtype) broadcast through one flat buffer, copied back into each.
inline void broadcast_bucket(ProcessGroup& group, const std::vector<torch::Tensor>& tensors) {
  c10d::BroadcastOptions options;
  options.rootRank = 0;
  const auto& first = tensors.front();
  // A single contiguous tensor on the backend's device is broadcast in place: no copy at all.
  const bool in_place = tensors.size() == 1 && first.is_contiguous() && first.device() == group.device();
  std::vector<torch::Tensor> buffer;
  if (in_place) {
    buffer.push_back(first.detach());
  } else {
    std::vector<torch::Tensor> flat_views;
    for (const auto& tensor : tensors) flat_views.push_back(tensor.detach().reshape({-1}));
    buffer.push_back(torch::cat(flat_views).to(group.device()));
  }
  auto work = start(group, "broadcast", [&] { return group.backend()->broadcast(buffer, options); });
  note_started(group, work, Collective::broadcast, buffer.front().nbytes());
  wait_for(group, work, "broadcast");
  if (in_place) return;
  std::int64_t offset = 0;
  for (const auto& tensor : tensors) {
    const auto count = tensor.numel();
    tensor.detach().copy_(buffer[0].narrow(0, offset, count).view(tensor.sizes()));
    offset += count;
  }
}

/// Broadcasts `tensors` from rank 0 in flat buffers of at most `bucket_bytes` per dtype (DDP's
/// _sync_module_states buckets the same way, 250 MB): a few round trips instead of one per tensor, and never a
/// second copy of the whole model at setup (an 8B model's would be 32 GB in fp32). A tensor larger than a
/// bucket goes alone, in place when it can.
inline void broadcast_from_rank0(ProcessGroup& group, const std::vector<torch::Tensor>& tensors,
                                 std::size_t bucket_bytes = std::size_t{64} << 20) {
  std::map<int, std::vector<torch::Tensor>> by_dtype;  // std::map: the same order on every rank
  for (const auto& tensor : tensors)
    if (tensor.defined() && tensor.numel() > 0) by_dtype[static_cast<int>(tensor.scalar_type())].push_back(tensor);
  torch::NoGradGuard no_grad;
  for (auto& [dtype, group_tensors] : by_dtype) {
    std::vector<torch::Tensor> bucket;
    std::size_t bytes = 0;
    for (const auto& tensor : group_tensors) {
      const auto size = static_cast<std::size_t>(tensor.nbytes());
      if (!bucket.empty() && bytes + size > bucket_bytes) {
        broadcast_bucket(group, bucket);
        bucket.clear();
        bytes = 0;
      }
      bucket.push_back(tensor);
      bytes += size;
    }
    if (!bucket.empty()) broadcast_bucket(group, bucket);
  }
}

}  // namespace detail

/// Copies rank 0's parameters and buffers into every rank's `module` (same architecture on every rank).
inline void broadcast_module(ProcessGroup& group, torch::nn::Module& module) {
  if (group.world_size() == 1) return;
  auto tensors = module.parameters();
  for (auto& buffer : module.buffers()) tensors.push_back(buffer);
  detail::broadcast_from_rank0(group, tensors);
}

/// Sums `tensor` over all ranks, in place; returns it.
inline torch::Tensor all_reduce_sum(ProcessGroup& group, torch::Tensor tensor) {
  if (group.world_size() == 1) return tensor;
  // c10d wants dense contiguous tensors on the backend's device; reduce a copy otherwise.
  const bool direct = tensor.is_contiguous() && tensor.device() == group.device();
  std::vector<torch::Tensor> buffer{direct ? tensor : tensor.contiguous().to(group.device())};
  auto work = detail::start(group, "all_reduce", [&] { return group.backend()->allreduce(buffer); });
  detail::note_started(group, work, Collective::all_reduce, buffer.front().nbytes());
  detail::wait_for(group, work, "all_reduce");
  if (!direct) tensor.copy_(buffer[0]);
  return tensor;
}

/// Sums a number over all ranks (a loss, a sample count).
inline double all_reduce_sum(ProcessGroup& group, double value) {
  if (group.world_size() == 1) return value;
  auto tensor = torch::full({1}, value, torch::TensorOptions().dtype(torch::kFloat64).device(group.device()));
  return all_reduce_sum(group, tensor).item<double>();
}

/// True on every rank when `value` is true on at least one (ranks agree to stop, checkpoint, requeue).
inline bool any_rank(ProcessGroup& group, bool value) { return all_reduce_sum(group, value ? 1.0 : 0.0) > 0.0; }

/// Waits until every rank has reached this point.
inline void barrier(ProcessGroup& group) {
  if (group.world_size() == 1) return;
  auto work = detail::start(group, "barrier", [&] { return group.backend()->barrier(); });
  detail::wait_for(group, work, "barrier");
}

}  // namespace hpctrain::dist
