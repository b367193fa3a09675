#pragma once
// `--run`: from an allocation's shell (salloc, an interactive job) the program becomes the script that trains on
// it; as a task of the user's own `srun ... ./train --run` it is one rank of that step.
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>

#include <unistd.h>  // execl: --run becomes its script

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/job/allocation.hpp>
#include <hpctrain/job/cli_options.hpp>
#include <hpctrain/job/job.hpp>
#include <hpctrain/job/render.hpp>
#include <hpctrain/job/run_placement.hpp>
#include <hpctrain/job/submit.hpp>
#include <hpctrain/names.hpp>
#include <hpctrain/slurm/environment.hpp>

namespace hpctrain {

namespace detail {
inline slurm::EnvironmentLookup context_lookup(const RenderContext& context) {
  return slurm::lookup_in(context.environment);
}

/// The run directory of `--run` in allocation `job_id`: `hpctrain-jobs/<name>/<job id>`, as a batch job's, so
/// that a second `--run` in the same allocation resumes from the first one's checkpoints.
inline std::filesystem::path allocation_run_directory(const Job& job, const RenderContext& context,
                                                      const std::string& job_id) {
  return job_root(job, context) / job_id;
}
}  // namespace detail

/// `--run` from an allocation's shell: checks that the allocation holds the job, then replaces this process
/// with bash running render_allocation_script, so that its output streams here, its exit status is this
/// command's, and a SIGINT to this process (Ctrl-C) reaches the script's trap. Returns only by throwing:
/// UsageError outside an allocation, SpecError `[hpctrain.spec.allocation]` for one too small, RuntimeError
/// when bash cannot be started.
inline int run_in_allocation(const Job& job, const RenderContext& context, std::ostream& out, std::ostream& err) {
  const auto lookup = detail::context_lookup(context);
  const auto place = run_place(lookup);
  if (place == RunPlace::no_allocation)
    throw UsageError(fmt::format(
        "--run trains on the allocation this shell is in, and there is none here (SLURM_JOB_ID is not set).\n"
        "  Get one, then --run inside it:   {} --time=1:00:00\n"
        "                                   {} --run\n"
        "  Or submit a batch job:           {} --submit\n"
        "  Or run on this machine:          {} --local N",
        salloc_suggestion(job), context.program, context.program, context.program));
  if (place == RunPlace::step_task)
    throw UsageError("--run in a task of an srun step trains as that step's rank: run_job handles it");
  if (job.array())
    throw UsageError(
        fmt::format("--run: this job is an array ({}): its tasks are separate jobs; use --submit", job.array()->text));
  const auto allocation = read_allocation(lookup);
  check_allocation_fits(job, allocation);
  const auto script = render_allocation_script(job, context);
  out << fmt::format("hpctrain: --run on allocation {} ({} node(s)): {} rank(s) on {} node(s); run directory {}\n",
                     allocation.job_id, allocation.nodes, job.nodes() * job.tasks_per_node(), job.nodes(),
                     detail::allocation_run_directory(job, context, allocation.job_id).string())
      << std::flush;
  err << std::flush;
  std::cout.flush();
  std::cerr.flush();
  // A shell ignores SIGINT for what it starts in the background (`./train --run &` in a script), and bash
  // cannot trap a signal that was ignored when it started: Ctrl-C (or kill -INT) must reach the script's trap.
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  ::execl("/bin/bash", "bash", "-c", script.c_str(), "hpctrain-run", static_cast<char*>(nullptr));
  throw RuntimeError(errors::runtime_exec, fmt::format("cannot run /bin/bash for --run: {}", std::strerror(errno)));
}

namespace detail {
/// `srun [options] ./train --run`: this task is a rank of the user's step. Its placement: the run directory `--run`
/// from the allocation's shell would give (unless its launcher set HPCTRAIN_RUN_DIR), `--resume`'s directory and the
/// task's environment (the context's: this process's); the preparation step is not run here (rank 0 says so).
inline RunPlacement step_task_placement(const Job& job, const LoginCommand& command, const RenderContext& context) {
  const auto place_lookup = context_lookup(context);
  const auto job_id = place_lookup("SLURM_JOB_ID").value_or(place_lookup("SLURM_JOBID").value_or("0"));
  RunPlacement placement;
  placement.environment = context.environment;
  if (!place_lookup(env::run_dir)) placement.run_dir = allocation_run_directory(job, context, job_id);
  if (command.resume) placement.resume_from = resume_directory(*command.resume, job_root(job, context));
  if (job.preparation() && place_lookup("SLURM_PROCID").value_or("0") == "0")
    std::cerr << "hpctrain: --run under your own srun: the ranks train now; the preparation step (Job::prepare) "
                 "runs only from the allocation's shell (`--run` without srun)\n";
  return placement;
}
}  // namespace detail

}  // namespace hpctrain
