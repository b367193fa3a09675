#pragma once
// The CPUs a rank may use. Under srun with --cpu-bind=cores (what the script renders once it knows each task's
// cores) the kernel's affinity mask is exactly this task's cores, so the intra-op threads follow the mask and
// nothing is divided; a mask spanning the whole machine means no binding (`--local`, TaskPlugin=task/none), and
// then the CPUs Slurm allotted (SLURM_CPUS_PER_TASK) or the machine's shared among the local ranks decide.
// Also: a node's CPU count as `sinfo` reports it, for the default cpus_per_task (job/render.hpp).
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>

#include <hpctrain/names.hpp>

namespace hpctrain::slurm {

/// CPUs in this process's affinity mask (sched_getaffinity; what `nproc` prints), or nothing when unreadable.
inline std::optional<int> affinity_cpu_count() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (::sched_getaffinity(0, sizeof mask, &mask) != 0) return std::nullopt;
  const int count = CPU_COUNT(&mask);
  return count > 0 ? std::optional<int>(count) : std::nullopt;
}

/// What decides a rank's intra-op threads besides an explicit count.
struct CpuView {
  std::optional<int> affinity;        ///< CPUs in the affinity mask
  int machine = 1;                    ///< CPUs of the machine (hardware_concurrency)
  std::optional<int> slurm_allotted;  ///< SLURM_CPUS_PER_TASK
  int local_ranks = 1;                ///< ranks on this node
};

/// The mask when it is narrower than the machine (the task is bound: its own cores, shared with no one); else
/// Slurm's allotment; else the machine's CPUs divided among the local ranks. At least 1.
inline int intra_op_threads(const CpuView& cpus) {
  if (cpus.affinity && *cpus.affinity < cpus.machine) return std::max(1, *cpus.affinity);
  if (cpus.slurm_allotted && *cpus.slurm_allotted > 0) return *cpus.slurm_allotted;
  return std::max(1, std::max(1, cpus.machine) / std::max(1, cpus.local_ranks));
}

/// This process's view: the mask, the machine, SLURM_CPUS_PER_TASK of the environment it began with, and
/// `local_ranks`.
inline CpuView this_process_cpus(int local_ranks, const Environment& environment) {
  CpuView cpus;
  cpus.affinity = affinity_cpu_count();
  cpus.machine = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (const auto allotted = environment.get("SLURM_CPUS_PER_TASK"); allotted && std::atoi(allotted->c_str()) > 0)
    cpus.slurm_allotted = std::atoi(allotted->c_str());
  cpus.local_ranks = local_ranks;
  return cpus;
}

/// The CPUs of the smallest node in `sinfo --noheader --format=%c` output (one line per node group: `32`, or
/// `32+` when a partition's nodes differ, the smallest first); nothing for an empty or unreadable answer.
inline std::optional<int> smallest_node_cpus(std::string_view sinfo_output) {
  std::optional<int> smallest;
  std::istringstream lines{std::string(sinfo_output)};
  for (std::string line; std::getline(lines, line);) {
    const auto digits = line.find_first_not_of(" \t");
    if (digits == std::string::npos) continue;
    std::size_t used = 0;
    int cpus = 0;
    try {
      cpus = std::stoi(line.substr(digits), &used);
    } catch (const std::exception&) {
      return std::nullopt;
    }
    if (cpus < 1) return std::nullopt;
    smallest = smallest ? std::min(*smallest, cpus) : cpus;
  }
  return smallest;
}

}  // namespace hpctrain::slurm
