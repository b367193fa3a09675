#pragma once
// A few numbers summed over the ranks without a wait on the step's path: each call starts the all-reduce of this
// rank's values and returns the sums of the call before, whose collective ran meanwhile (during a step). Every rank
// reads the same sums at the same call, so a decision taken on them (stop for a preemption, commit a save) is taken
// at the same step everywhere, one call after the ranks' values changed.
//
// The Trainer votes this way at every step boundary (train/trainer.hpp): a blocking all-reduce there would cost a
// round trip a step (and on a GPU a host sync: the sums read with .item()), which is why the vote used to be taken
// only every 10 steps. Here the host writes its values with fill_ (a kernel argument, no copy from pageable
// memory), the collective is queued behind the step (NCCL: stream-ordered), the sums come back through pinned
// memory with an event, and the next call waits on that event only: the host stays a step ahead of the device.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/types.h>

#include <hpctrain/dist/collectives.hpp>
#include <hpctrain/dist/process_group.hpp>
#include <hpctrain/dist/traffic.hpp>

namespace hpctrain::dist {

class LaggedSum {
 public:
  /// Sums of `size` numbers.
  explicit LaggedSum(std::size_t size) : size_(size) {}
  LaggedSum(const LaggedSum&) = delete;
  LaggedSum& operator=(const LaggedSum&) = delete;

  /// Collective: starts summing `values` (as many as the constructor said) over `group`'s ranks and returns the sums
  /// started by the previous call (std::nullopt at the first). At world size 1 the sums are the values, and still one
  /// call late.
  std::optional<std::vector<double>> exchange(ProcessGroup& group, const std::vector<double>& values) {
    std::optional<std::vector<double>> previous;
    if (in_flight_) previous = read(group);
    start(group, values);
    return previous;
  }

  /// Collective: waits for the sums in flight, if any, and drops them (before the run's last collectives).
  void settle(ProcessGroup& group) {
    if (in_flight_) read(group);
  }

 private:
  void start(ProcessGroup& group, const std::vector<double>& values) {
    in_flight_ = true;
    if (group.world_size() == 1) {
      alone_ = values;
      return;
    }
    if (!sums_.defined()) allocate(group);
    for (std::size_t i = 0; i < size_; ++i) sums_.select(0, static_cast<std::int64_t>(i)).fill_(values.at(i));
    std::vector<torch::Tensor> buffer{sums_};
    work_ = detail::start(group, "all_reduce", [&] { return group.backend()->allreduce(buffer); });
    detail::note_started(group, work_, Collective::all_reduce, sums_.nbytes());
    if (!group.device().is_cuda()) return;
    detail::wait_for(group, work_, "all_reduce");  // stream-ordered: the host goes on
    host_.copy_(sums_, /*non_blocking=*/true);
    const c10::impl::VirtualGuardImpl guard(group.device().type());
    copied_->record(guard.getStream(group.device()));
  }

  std::vector<double> read(ProcessGroup& group) {
    in_flight_ = false;
    if (group.world_size() == 1) return alone_;
    if (group.device().is_cuda()) copied_->synchronize();  // the device's work up to the previous call, not this step's
    else detail::wait_for(group, work_, "all_reduce");     // Gloo: done during the step
    const auto* data = (group.device().is_cuda() ? host_ : sums_).data_ptr<double>();
    return {data, data + size_};
  }

  void allocate(ProcessGroup& group) {
    const auto n = static_cast<std::int64_t>(size_);
    sums_ = torch::zeros({n}, torch::TensorOptions().dtype(torch::kFloat64).device(group.device()));
    if (!group.device().is_cuda()) return;
    host_ = torch::zeros({n}, torch::TensorOptions().dtype(torch::kFloat64).pinned_memory(true));
    copied_.emplace(group.device().type());
  }

  std::size_t size_;
  bool in_flight_ = false;
  torch::Tensor sums_;                ///< on the group's device, reduced in place
  torch::Tensor host_;                ///< CUDA: the sums' pinned copy on the host
  std::optional<c10::Event> copied_;  ///< CUDA: recorded after that copy
  std::vector<double> alone_;         ///< world size 1: the values themselves
  c10::intrusive_ptr<c10d::Work> work_;
};

}  // namespace hpctrain::dist
