#pragma once
// The collective half of checkpoints (the files are train/checkpoint.hpp's): every rank that saves
// writes its archive into the staging directory, the ranks agree on the files' sizes and CRCs in one
// all-reduce, rank 0 commits; on resume rank 0 picks the newest valid checkpoint and every rank loads it
// through the strategy.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <hpctrain/dist/collectives.hpp>
#include <hpctrain/dist/process_group.hpp>
#include <hpctrain/train/checkpoint.hpp>
#include <hpctrain/train/strategy.hpp>

namespace hpctrain::detail {

/// Saves checkpoint `state.step` of `strategy`; collective. Returns when the checkpoint is committed.
inline void save_checkpoint(dist::ProcessGroup& group, const CheckpointStore& store, DataParallelStrategy& strategy,
                            const CheckpointState& state) {
  const int rank = group.rank(), world = group.world_size();
  const dist::CheckpointWaits waits(group);  // the ranks wait for each other's files: the checkpoint timeout
  const bool per_rank = strategy.saves_per_rank();
  if (rank == 0) store.prepare(state.step);
  dist::barrier(group);
  // (size, crc) of each rank's file; zeros where a rank writes none. One all-reduce tells rank 0 all.
  auto records = torch::zeros({world, 2}, torch::kInt64);
  if (rank == 0 || per_rank) {
    torch::serialize::OutputArchive archive;
    strategy.save(archive);
    const auto file = store.write_rank(state.step, rank, archive);
    records[rank][0] = static_cast<std::int64_t>(file.size);
    records[rank][1] = static_cast<std::int64_t>(file.crc);
  }
  if (world > 1) records = dist::all_reduce_sum(group, records.to(group.device())).cpu();
  if (rank == 0) {
    CheckpointMeta meta{state, world, strategy.name(), {}};
    for (int r = 0; r < (per_rank ? world : 1); ++r)
      meta.files.push_back({checkpoint_rank_file(r), static_cast<std::uint64_t>(records[r][0].item<std::int64_t>()),
                            static_cast<std::uint32_t>(records[r][1].item<std::int64_t>())});
    store.commit(meta);
  }
  dist::barrier(group);  // no rank moves on (or exits) before the checkpoint is durable
}

/// Loads the newest valid checkpoint into `strategy` on every rank (rank 0 chooses, warning through `warn`
/// about each invalid newer one); collective. nullopt for a fresh run.
inline std::optional<CheckpointState> resume_latest(dist::ProcessGroup& group, const CheckpointStore& store, DataParallelStrategy& strategy,
                                                    const std::function<void(const std::string&)>& warn) {
  double chosen = 0;
  if (group.rank() == 0) {
    const auto latest = store.latest(warn);
    chosen = latest ? static_cast<double>(latest->meta.state.step) : -1.0;
  }
  chosen = dist::all_reduce_sum(group, chosen);  // rank 0's choice; the others add 0
  if (chosen < 0) return std::nullopt;
  const auto saved = store.read(store.directory() / checkpoint_dir_name(static_cast<std::int64_t>(chosen)));
  strategy.load(saved.strategy_state());
  return saved.meta.state;
}

}  // namespace hpctrain::detail
