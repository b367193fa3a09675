#pragma once
// Asynchronous checkpoints (Training::checkpoint_async, --checkpoint-async), as PyTorch DCP's async_save and
// torchtitan do it: at the step boundary each rank serialises its archive into host memory — the snapshot (on a
// GPU, the device-to-host copy), after which the steps may change the tensors — and a background thread seals
// it (CRC-32C, header) and writes it (temporary name, fsync, rename) into the staging directory while training
// goes on. The commit stays collective and on the training thread, where every collective is issued in the same
// order on every rank: at a step boundary (once the Trainer's vote, dist::LaggedSum, says every writer is done) one
// all-reduce tells every rank whether every writer is done and with which size and CRC; rank 0 then writes meta.json
// and renames the directory, exactly as a synchronous save. Until then the checkpoint is only a `.tmp` directory, which
// `latest()` never accepts: a crash mid-save resumes from the previous one.
//
// One save at a time: the next start, the end of training and the preemption path wait for the one in flight,
// under the checkpoint timeout as a synchronous save's ranks wait for each other's files (a slow file system is
// not a hung collective). A writer's failure (a full disk, a quota) does not fail the run: the failed rank says
// why, rank 0 says that the previous checkpoint stays the newest, the staging directory is removed and training
// goes on; the Trainer retries a failed final save once, synchronously, and only that failure fails the run.
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <hpctrain/dist/collectives.hpp>
#include <hpctrain/dist/process_group.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/train/checkpoint/checkpoint.hpp>
#include <hpctrain/train/strategies/strategy.hpp>

namespace hpctrain::detail {

/// The save in flight, if any, on one rank; every call is collective and made at the same step on every rank.
class AsyncCheckpoint {
 public:
  using Warn = std::function<void(const std::string&)>;
  /// `warn` prints a warning line (every rank calls it with its own).
  explicit AsyncCheckpoint(Warn warn) : warn_(std::move(warn)) {}
  AsyncCheckpoint(const AsyncCheckpoint&) = delete;
  AsyncCheckpoint& operator=(const AsyncCheckpoint&) = delete;
  /// A run that fails with a save in flight lets the writer finish its file (never committed) before it goes.
  ~AsyncCheckpoint() {
    if (writer_.joinable()) writer_.join();
  }

  /// Waits for the save in flight, then stages checkpoint `state.step` in `store`: serialises this rank's archive
  /// (on the ranks that save) and starts writing it in the background.
  void start(dist::ProcessGroup& group, const CheckpointStore& store, DataParallelStrategy& strategy,
             const CheckpointState& state) {
    wait(group);
    const int rank = group.rank();
    const bool writes = rank == 0 || strategy.saves_per_rank();
    if (rank == 0) store.prepare(state.step);
    dist::barrier(group);  // the staging directory exists before any rank writes into it
    pending_.emplace(Pending{&store, state, strategy.name(), strategy.saves_per_rank()});
    done_ = !writes;
    if (!writes) return;
    torch::serialize::OutputArchive archive;
    PieceWriter pieces;
    strategy.save(archive, pieces);
    writer_ = std::thread(
        [this, &store, step = state.step, rank, bytes = serialize_archive(archive, std::move(pieces))]() mutable {
          try {
            file_ = store.write_serialized(step, rank, std::move(bytes));
          } catch (...) {
            error_ = std::current_exception();
          }
          done_ = true;  // after file_ and error_: whoever sees it set may read them
        });
  }

  /// Whether a save is in flight (the same on every rank).
  bool in_flight() const { return pending_.has_value(); }
  /// Whether this rank has finished its part of the save in flight (written, failed, or none to write); this rank's
  /// own answer, which the ranks sum at a step boundary before poll().
  bool finished_here() const { return pending_.has_value() && done_; }

  /// At a step boundary: commits the save in flight if every rank's writer is done; never waits for a writer.
  void poll(dist::ProcessGroup& group) {
    if (pending_) agree(group);
  }

  /// Waits for the save in flight and commits it; returns, on every rank, whether it was committed (true also when
  /// none was in flight), false when a writer failed (warned, the staging directory removed).
  bool wait(dist::ProcessGroup& group) {
    if (!pending_) return true;
    const dist::CheckpointWaits waits(group);  // the ranks wait for each other's writers: the checkpoint timeout
    if (writer_.joinable()) writer_.join();
    const bool committed = agree(group) == Outcome::committed;
    dist::barrier(group);  // no rank moves on (or exits) before the checkpoint is committed
    return committed;
  }

 private:
  struct Pending {
    const CheckpointStore* store;
    CheckpointState state;
    std::string strategy;
    bool per_rank;
  };
  enum Status : std::int64_t { writing = 0, written = 1, failed = 2 };
  enum class Outcome { writing, committed, failed };

  /// One all-reduce of every rank's (size, CRC, status); rank 0 commits once all are written. When a writer failed,
  /// on every rank: abandon() and Outcome::failed.
  Outcome agree(dist::ProcessGroup& group) {
    const int rank = group.rank(), world = group.world_size();
    if (done_ && writer_.joinable()) writer_.join();
    auto records = torch::zeros({world, 3}, torch::kInt64);
    records[rank][2] = !done_ ? writing : error_ ? failed : written;
    if (done_ && !error_) {
      records[rank][0] = static_cast<std::int64_t>(file_.size);
      records[rank][1] = static_cast<std::int64_t>(file_.crc);
    }
    if (world > 1) records = dist::all_reduce_sum(group, records.to(group.device())).cpu();
    const auto status = records.select(1, 2);
    const auto pending = *pending_;
    if ((status == failed).any().item<bool>()) {
      abandon(group, (status == failed).nonzero().select(1, 0));
      return Outcome::failed;
    }
    if ((status == writing).any().item<bool>()) return Outcome::writing;  // asked again at a later step boundary
    pending_.reset();
    if (rank != 0) return Outcome::committed;
    CheckpointMeta meta{pending.state, world, pending.strategy, {}};
    for (int r = 0; r < (pending.per_rank ? world : 1); ++r)
      meta.files.push_back({checkpoint_rank_file(r), static_cast<std::uint64_t>(records[r][0].item<std::int64_t>()),
                            static_cast<std::uint32_t>(records[r][1].item<std::int64_t>())});
    pending.store->commit(meta);
    return Outcome::committed;
  }

  /// A save some writer failed: each failed rank warns with its own reason, rank 0 names the ranks; once every
  /// writer has stopped, rank 0 removes the staging directory (a full disk gets its space back for the next save).
  void abandon(dist::ProcessGroup& group, const torch::Tensor& failed_ranks) {
    const auto pending = *std::exchange(pending_, std::nullopt);
    const auto step = pending.state.step;
    if (error_) {
      try {
        std::rethrow_exception(std::exchange(error_, nullptr));
      } catch (const std::exception& error) {
        warn_(fmt::format("warning: rank {}: the checkpoint of step {} was not written: {}", group.rank(), step,
                          error.what()));
      }
    }
    if (group.rank() == 0) {
      std::vector<std::int64_t> ranks(failed_ranks.data_ptr<std::int64_t>(),
                                      failed_ranks.data_ptr<std::int64_t>() + failed_ranks.numel());
      warn_(
          fmt::format("warning: checkpoint of step {} not saved (rank(s) {} could not write; their lines say why): "
                      "the previous checkpoint stays the newest, training goes on",
                      step, fmt::join(ranks, ", ")));
    }
    const dist::CheckpointWaits waits(group);  // the other writers finish their files first
    if (writer_.joinable()) writer_.join();
    dist::barrier(group);
    if (group.rank() == 0) detail::remove_tree(pending.store->staging(step));
  }

  std::optional<Pending> pending_;
  std::thread writer_;
  std::atomic<bool> done_{true};
  std::exception_ptr error_;
  CheckpointFile file_;
  Warn warn_;
};

}  // namespace hpctrain::detail
