#pragma once
// What the Trainer decides before the first step from the description and the environment: the intra-op
// threads and the per-step RNG seed.
//
// The run directory is train/run_directory.hpp's (a directory per run, --resume).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string_view>
#include <thread>

#include <hpctrain/names.hpp>
#include <hpctrain/slurm/cpus.hpp>
#include <hpctrain/slurm/world.hpp>
#include <hpctrain/train/training.hpp>

namespace hpctrain::detail {

/// Intra-op threads: explicit, else this task's affinity mask when it is bound to its own cores, else the CPUs
/// Slurm gave the task (SLURM_CPUS_PER_TASK of `environment`, the rank's), else the machine's shared among the local
/// ranks (slurm/cpus.hpp).
inline int resolve_threads(const Training& training, const slurm::World& world, const Environment& environment) {
  if (training.threads() > 0) return training.threads();
  return slurm::intra_op_threads(slurm::this_process_cpus(world.local_world_size, environment));
}

/// A distinct, reproducible RNG seed per (seed, rank, step) (splitmix64 finaliser).
inline std::uint64_t step_seed(std::int64_t seed, int rank, std::int64_t step) {
  std::uint64_t z = static_cast<std::uint64_t>(seed) * 0x9E3779B97F4A7C15ull +
                    static_cast<std::uint64_t>(rank) * 0xBF58476D1CE4E5B9ull +
                    static_cast<std::uint64_t>(step) * 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFFull;
}

}  // namespace hpctrain::detail
