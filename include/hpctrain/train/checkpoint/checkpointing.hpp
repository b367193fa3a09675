#pragma once
// The collective half of checkpoints (the files are train/checkpoint/checkpoint.hpp's): every rank that saves
// writes its archive into the staging directory, the ranks agree on the files' sizes and CRCs in one
// all-reduce, rank 0 commits; on resume the ranks agree on the newest checkpoint all of them find valid,
// each verifying only its share, and every rank loads it through the strategy.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <hpctrain/dist/collectives.hpp>
#include <hpctrain/dist/process_group.hpp>
#include <hpctrain/train/checkpoint/checkpoint.hpp>
#include <hpctrain/train/strategies/strategy.hpp>

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
    PieceWriter pieces(PieceWriter::Hold::reference);  // written below, before training changes a tensor
    strategy.save(archive, pieces);
    const auto file = store.write_rank(state.step, rank, archive, std::move(pieces));
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

/// Whether this rank's share of checkpoint `directory` is valid (its meta.json, and the archives verify_share
/// gives it); the checkpoint, its own archive's bytes kept, when it is. Rank 0 alone warns about meta.json (every
/// rank reads the same one), each rank about its own archives.
inline std::optional<SavedCheckpoint> verify_own_share(const CheckpointStore& store,
                                                       const std::filesystem::path& directory, int rank, int world,
                                                       const std::function<void(const std::string&)>& warn) {
  std::optional<SavedCheckpoint> saved;
  try {
    saved = store.read(directory);
  } catch (const RuntimeError& error) {
    if (rank == 0) warn(fmt::format("warning: skipping checkpoint: {}", error.what()));
    return std::nullopt;
  }
  try {
    return store.verify_share(std::move(*saved), rank, world);
  } catch (const RuntimeError& error) {
    warn(fmt::format("warning: skipping checkpoint: rank {}: {}", rank, error.what()));
    return std::nullopt;
  }
}

/// Loads the newest checkpoint that every rank finds valid into `strategy`; collective. nullopt for a fresh run.
/// No rank reads the whole checkpoint to decide: rank 0 proposes the newest step not yet refused, each rank
/// verifies its share of it (its own archive at the same world size), and one all-reduce counts the ranks that
/// found theirs invalid; any refusal and every rank moves on to the next older one together. Each round reads
/// one meta.json and this rank's archives; the one it loads is read once. A strategy that reads parts of the files
/// itself (ZeRO's pieces at another world size) checks them in `load` and agrees there: its CheckpointRefused, on
/// every rank, is one more refusal of this checkpoint.
inline std::optional<CheckpointState> resume_latest(dist::ProcessGroup& group, const CheckpointStore& store,
                                                    DataParallelStrategy& strategy,
                                                    const std::function<void(const std::string&)>& warn) {
  const int rank = group.rank(), world = group.world_size();
  const auto candidates = rank == 0 ? store.list() : std::vector<std::filesystem::path>{};  // oldest first
  for (std::size_t tried = 0;; ++tried) {
    double proposal = 0;  // rank 0's: a step, or -1 when nothing is left; the others add 0
    if (rank == 0)
      proposal = tried < candidates.size()
                     ? static_cast<double>(*checkpoint_step(candidates[candidates.size() - 1 - tried]))
                     : -1.0;
    proposal = dist::all_reduce_sum(group, proposal);
    if (proposal < 0) return std::nullopt;
    const auto directory = store.directory() / checkpoint_dir_name(static_cast<std::int64_t>(proposal));
    auto saved = verify_own_share(store, directory, rank, world, warn);
    double refusals = dist::all_reduce_sum(group, saved ? 0.0 : 1.0);
    if (refusals == 0) {
      try {
        strategy.load(saved->strategy_state());
        return saved->meta.state;
      } catch (const CheckpointRefused& refused) {  // a piece a rank read was invalid: every rank is here
        if (refused.found_here()) warn(fmt::format("warning: skipping checkpoint: rank {}: {}", rank, refused.what()));
        refusals = dist::all_reduce_sum(group, refused.found_here() ? 1.0 : 0.0);
      }
    }
    if (rank == 0 && saved)
      warn(fmt::format("warning: skipping checkpoint: {}: {} of {} ranks found their archives invalid",
                       directory.string(), refusals, world));
  }
}

}  // namespace hpctrain::detail
