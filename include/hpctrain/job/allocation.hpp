#pragma once
// `./train --run`: where it was started, read from SLURM_*. Three places look alike and are told apart:
// - no allocation: no SLURM_JOB_ID;
// - an allocation's shell (salloc's shell, a batch script, the shell of `srun --pty bash`): --run starts the
//   training step itself. salloc and sbatch set SLURM_JOB_ID but no SLURM_STEP_ID; an interactive
//   `srun --pty` shell is a step's task too, but srun marks it with SLURM_PTY_PORT;
// - a task of the user's own step (`srun [options] ./train --run`): SLURM_STEP_ID and SLURM_PROCID set, no
//   pty. The ranks are that step's tasks and train as workers.
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/job/job.hpp>
#include <hpctrain/slurm/environment.hpp>

namespace hpctrain {

/// Where `--run` was started.
enum class RunPlace { no_allocation, allocation_shell, step_task };

/// What the allocation holds, as its shell's SLURM_* say.
struct Allocation {
  std::string job_id;              ///< SLURM_JOB_ID
  int nodes = 0;                   ///< SLURM_JOB_NUM_NODES (else SLURM_NNODES)
  std::vector<int> cpus_per_node;  ///< SLURM_JOB_CPUS_PER_NODE expanded (`2(x3),1`); empty when unset
};

/// Where this process runs (see the file's comment).
inline RunPlace run_place(const slurm::EnvironmentLookup& lookup) {
  if (!lookup("SLURM_JOB_ID") && !lookup("SLURM_JOBID")) return RunPlace::no_allocation;
  const bool in_step = (lookup("SLURM_STEP_ID") || lookup("SLURM_STEPID")) && lookup("SLURM_PROCID");
  if (in_step && !lookup("SLURM_PTY_PORT")) return RunPlace::step_task;
  return RunPlace::allocation_shell;
}

/// The allocation of this shell. Throws RuntimeError `[hpctrain.runtime.slurm_env]` for a malformed variable.
inline Allocation read_allocation(const slurm::EnvironmentLookup& lookup) {
  Allocation allocation;
  const auto id = lookup("SLURM_JOB_ID") ? lookup("SLURM_JOB_ID") : lookup("SLURM_JOBID");
  allocation.job_id = id.value_or("");
  if (const auto nodes = lookup("SLURM_JOB_NUM_NODES") ? lookup("SLURM_JOB_NUM_NODES") : lookup("SLURM_NNODES"))
    allocation.nodes = slurm::detail::parse_int("SLURM_JOB_NUM_NODES", *nodes, 1);
  if (const auto cpus = lookup("SLURM_JOB_CPUS_PER_NODE"))
    allocation.cpus_per_node = slurm::parse_tasks_per_node(*cpus, "SLURM_JOB_CPUS_PER_NODE");
  if (allocation.nodes == 0) allocation.nodes = static_cast<int>(allocation.cpus_per_node.size());
  return allocation;
}

/// The salloc line that fits `job`: what `--run` suggests where there is no allocation.
inline std::string salloc_suggestion(const Job& job) {
  std::string line = fmt::format("salloc --nodes={} --ntasks-per-node={}", job.nodes(), job.tasks_per_node());
  if (job.cpus_per_task()) line += fmt::format(" --cpus-per-task={}", *job.cpus_per_task());
  if (job.gpus_per_node_count() > 0) line += fmt::format(" --gpus-per-node={}", job.gpus_per_node_count());
  if (job.partition()) line += fmt::format(" --partition={}", *job.partition());
  if (job.account()) line += fmt::format(" --account={}", *job.account());
  return line;
}

/// Refuses an allocation smaller than `job` asks for: fewer nodes, or a node with fewer CPUs than the job's
/// tasks per node times its CPUs per task. Throws SpecError `[hpctrain.spec.allocation]` naming both sides.
/// (GPUs are not checked here: SLURM_GPUS_ON_NODE is per node of a step, not of the allocation's shell.)
inline void check_allocation_fits(const Job& job, const Allocation& allocation) {
  const auto subject = fmt::format("allocation {}", allocation.job_id);
  if (allocation.nodes < job.nodes())
    throw SpecError(errors::spec_allocation, subject,
                    fmt::format("has {} node(s) but the job asks for nodes = {}; allocate it with `{}`",
                                allocation.nodes, job.nodes(), salloc_suggestion(job)));
  const int cpus_needed = job.tasks_per_node() * job.cpus_per_task().value_or(1);
  int fitting = 0;
  for (const int cpus : allocation.cpus_per_node) fitting += cpus >= cpus_needed;
  if (!allocation.cpus_per_node.empty() && fitting < job.nodes())
    throw SpecError(errors::spec_allocation, subject,
                    fmt::format("has {} of {} node(s) with the {} CPU(s) the job asks for per node (tasks_per_node = "
                                "{} x cpus_per_task = {}; SLURM_JOB_CPUS_PER_NODE lists what each node holds); "
                                "allocate it with `{}`",
                                fitting, allocation.nodes, cpus_needed, job.tasks_per_node(),
                                job.cpus_per_task().value_or(1), salloc_suggestion(job)));
}

}  // namespace hpctrain
