#pragma once
// The two collectives of the sharded strategies, started asynchronously so they overlap with backward (or
// with each other), each finished by wait(). c10d's `_reduce_scatter_base` / `_allgather_base` take one flat
// input and one flat output: NCCL implements them natively; Gloo (torch 2.11) implements reduce-scatter as an
// all-reduce plus a slice — correct, twice the traffic. Where a backend refuses the flat reduce-scatter, we
// do that ourselves: all-reduce the whole input and copy our slice out at wait(). At world size 1 neither
// communicates: the reduce-scatter is a copy, the all-gather is the identity.
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/types.h>

#include <hpctrain/dist/collectives.hpp>
#include <hpctrain/dist/process_group.hpp>
#include <hpctrain/dist/traffic.hpp>

namespace hpctrain::dist {

/// A reduce-scatter in flight: `output` holds this rank's slice of the sum once wait() returns.
struct PendingReduceScatter {
  c10::intrusive_ptr<c10d::Work> work;
  torch::Tensor input;    ///< padded flat input (world_size · output.numel() elements); freed by wait()
  torch::Tensor output;   ///< this rank's shard of the sum
  bool sliced = false;    ///< fallback: `input` is all-reduced in place, the slice is copied at wait()
  torch::Tensor reduced;  ///< the collective's output when `input`'s dtype is not `output`'s: converted at wait()

  bool pending() const { return input.defined(); }
};

/// Starts summing `input` (flat, world_size · output.numel() elements) over all ranks into this rank's
/// `output`, the slice [rank · n, (rank + 1) · n) of the sum. The sum is taken in `input`'s dtype (a bf16 input: a
/// bf16 reduction, FSDP2's reduce_dtype) and converted into `output`'s at wait().
inline PendingReduceScatter start_reduce_scatter(ProcessGroup& group, torch::Tensor input, torch::Tensor output) {
  PendingReduceScatter pending{nullptr, std::move(input), std::move(output), false, {}};
  if (group.world_size() == 1) return pending;
  const bool converts = pending.input.scalar_type() != pending.output.scalar_type();
  if (converts) pending.reduced = torch::empty(pending.output.sizes(), pending.input.options());
  try {
    pending.work = group.backend()->_reduce_scatter_base(converts ? pending.reduced : pending.output, pending.input);
  } catch (const c10::Error&) {
    // The backend has no flat reduce-scatter: all-reduce + slice (the peers take the same path: same backend).
    pending.reduced = torch::Tensor();
    std::vector<torch::Tensor> tensors{pending.input};
    pending.work = detail::start(group, "gradient reduce_scatter", [&] { return group.backend()->allreduce(tensors); });
    pending.sliced = true;
  }
  detail::note_started(group, pending.work, Collective::reduce_scatter, pending.input.nbytes());
  return pending;
}

/// Waits for a reduce-scatter; afterwards `output` holds the sum of this rank's slice; the input is freed.
inline void wait(ProcessGroup& group, PendingReduceScatter& pending) {
  if (!pending.pending()) return;
  torch::NoGradGuard no_grad;
  if (group.world_size() == 1) {
    pending.output.copy_(pending.input);
  } else {
    detail::wait_for(group, pending.work, "gradient reduce_scatter");
    if (pending.sliced) {
      const auto n = pending.output.numel();
      pending.output.copy_(pending.input.narrow(0, group.rank() * n, n));
    } else if (pending.reduced.defined()) {
      pending.output.copy_(pending.reduced);
    }
  }
  pending.work.reset();
  pending.input = torch::Tensor();
  pending.reduced = torch::Tensor();
}

/// An all-gather in flight into a flat buffer.
struct PendingAllGather {
  c10::intrusive_ptr<c10d::Work> work;
  bool pending = false;
};

/// Starts gathering every rank's shard of `flat` (world_size equal slices) into all of `flat`, in place:
/// this rank's input is its own slice of `flat` (NCCL and Gloo both accept an input inside the output).
inline PendingAllGather start_all_gather_in_place(ProcessGroup& group, torch::Tensor flat) {
  PendingAllGather pending;
  if (group.world_size() == 1) return pending;
  const auto n = flat.numel() / group.world_size();
  auto own = flat.narrow(0, group.rank() * n, n);
  pending.work =
      detail::start(group, "parameter all_gather", [&] { return group.backend()->_allgather_base(flat, own); });
  detail::note_started(group, pending.work, Collective::all_gather, flat.nbytes());
  pending.pending = true;
  return pending;
}

/// Waits for an all-gather.
inline void wait(ProcessGroup& group, PendingAllGather& pending) {
  if (!pending.pending) return;
  detail::wait_for(group, pending.work, "parameter all_gather");
  pending.work.reset();
  pending.pending = false;
}

/// An all-reduce (sum) in flight, in place.
struct PendingAllReduce {
  c10::intrusive_ptr<c10d::Work> work;
  bool pending = false;
};

/// Starts summing `tensor` (contiguous, on the group's device) over the group's ranks, in place: hybrid
/// sharding's gradient shards across the replicas. Nothing at group size 1.
inline PendingAllReduce start_all_reduce_in_place(ProcessGroup& group, torch::Tensor tensor) {
  PendingAllReduce pending;
  if (group.world_size() == 1 || tensor.numel() == 0) return pending;
  const auto bytes = tensor.nbytes();
  std::vector<torch::Tensor> tensors{std::move(tensor)};
  pending.work = detail::start(group, "gradient all_reduce", [&] { return group.backend()->allreduce(tensors); });
  detail::note_started(group, pending.work, Collective::all_reduce, bytes);
  pending.pending = true;
  return pending;
}

/// Waits for an all-reduce.
inline void wait(ProcessGroup& group, PendingAllReduce& pending) {
  if (!pending.pending) return;
  detail::wait_for(group, pending.work, "gradient all_reduce");
  pending.work.reset();
  pending.pending = false;
}

}  // namespace hpctrain::dist
