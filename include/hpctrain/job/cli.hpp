#pragma once
// The whole program for a job (DESIGN.md's command-line contract): under the worker marker the code run under
// srun, under the preparation marker the job's preparation, else a login-node command (job/cli_options.hpp parses
// it, job/login_commands.hpp runs it). Every path ends through with_exit_codes: the message on stderr, then its
// exit code (0 ok, 2 usage or description, 1 runtime).
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <hpctrain/error.hpp>
#include <hpctrain/job/allocation.hpp>
#include <hpctrain/job/cli_options.hpp>
#include <hpctrain/job/job.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/job/login_commands.hpp>
#include <hpctrain/job/plan_request.hpp>
#include <hpctrain/job/prepare.hpp>
#include <hpctrain/job/render.hpp>
#include <hpctrain/job/run_placement.hpp>
#include <hpctrain/job/spec_error_exit.hpp>  // installed before main: a wrong setter exits 2
#include <hpctrain/names.hpp>

namespace hpctrain {

/// The code run under srun, given the arguments after the worker marker; returns the exit code.
using Worker = std::function<int(const std::vector<std::string>& args)>;
/// The code run under srun for a program with a knob table: the table holding this run's values, and where the
/// run lives (`--resume`'s directory; the run directory when the login side chose it in this process).
using KnobWorker = std::function<int(const Knobs& knobs, const RunPlacement& placement)>;
/// A program's checks on the login node: the knob table holding the command's values, and the ranks the command
/// starts when it says (none under --run, whose allocation says, for a chain of stages, or for --check-fabric,
/// whose ranks do not train).
using KnobLoginCheck = std::function<void(const Knobs& knobs, const LoginCheckFacts& facts)>;

namespace detail {
/// Set during static initialisation, before the user's main builds its description: in a program that can call
/// run_job (or hpctrain::run), a wrong setter exits 2 naming the field, whatever main does before the call.
inline const bool spec_errors_exit_2 = (install_spec_error_exit(), true);

/// The job's preparation step (the script's `--hpctrain-prepare` step), given the arguments after its marker; its
/// environment is read here, once.
inline int run_preparation_step(const Job& job, int argc, char** argv) {
  return run_preparation(job.preparation(),
                         prepare_context_from_environment(Environment::of_this_process(),
                                                          std::vector<std::string>(argv + 2, argv + argc)));
}

/// Whether the login command is `--run` in a task of the user's own srun step (the login shell's environment says).
inline bool runs_as_step_task(const LoginCommand& command, const RenderContext& context) {
  return command.mode == LoginCommand::Mode::run &&
         run_place(slurm::lookup_in(context.environment)) == RunPlace::step_task;
}

/// `job` with its preparation given the knob values of the arguments it is run with (the workers' arguments,
/// `--resume DIR` first when resuming), wherever it runs: the script's step or `--local`.
inline Job with_prepare_knobs(const Job& job, const Knobs& knobs) {
  if (!job.preparation()) return job;
  Job given = job;
  given.prepare(PrepareStep{[own = job.preparation(), knobs](const PrepareContext& context) {
                              PrepareContext with_values = context;
                              RunPlacement resumed;  // the preparation reads the knobs only
                              with_values.knobs = knobs.with_arguments(take_resume(context.args, resumed));
                              own(with_values);
                            },
                            job.preparation_check()});
  return given;
}
}  // namespace detail

/// The whole program for a job: worker mode under the marker, else the login-node command line. Arguments
/// that are not login options reach `worker` unchecked.
inline int run_job(int argc, char** argv, const Job& job, const Worker& worker) {
  if (is_worker_invocation(argc, argv)) return worker(std::vector<std::string>(argv + 2, argv + argc));
  if (is_prepare_invocation(argc, argv)) return detail::run_preparation_step(job, argc, argv);
  return with_exit_codes([&] {
    const auto command = parse_login_command(argc, argv);
    const auto context = current_render_context(argc, argv, command.forwarded);
    if (detail::runs_as_step_task(command, context)) {
      detail::step_task_placement(job, command, context);  // says what --run under srun does not run
      return worker(command.forwarded);
    }
    return run_login_command(job, command, context);
  });
}

/// The same for a program with a knob table: the login command refuses an unknown or invalid knob (exit 2,
/// nothing written or queued), `--help` lists the knobs, and `worker` gets the table with this run's values
/// (the worker's arguments are read with the same table; a bad one exits 2 on every rank).
/// `login_check`, when given, sees the knob values of a --dry-run, --submit, --local or --run, the ranks it
/// starts (login_world) and whether the job waits for others (LoginCheckFacts) before anything is written or queued
/// (Training::check_at_login: a data file visible here is validated, the batch checked against it); a SpecError from it
/// exits 2.
inline int run_job(int argc, char** argv, const Job& described, const Knobs& knobs, const KnobWorker& worker,
                   const KnobLoginCheck& login_check = {}, const Planner& planner = {}) {
  const Job job = detail::with_prepare_knobs(described, knobs);
  if (is_prepare_invocation(argc, argv)) return detail::run_preparation_step(job, argc, argv);
  if (is_worker_invocation(argc, argv))
    return with_exit_codes([&] {
      RunPlacement placement;
      placement.environment = Environment::of_this_process();  // read here, once, and passed down
      const auto args = take_resume(std::vector<std::string>(argv + 2, argv + argc), placement);
      return worker(knobs.with_arguments(args), placement);
    });
  return with_exit_codes([&] {
    const auto command = parse_login_command(argc, argv, knobs);
    const auto context = current_render_context(argc, argv, command.forwarded);
    using Mode = LoginCommand::Mode;
    if (command.mode == Mode::dry_run || command.mode == Mode::submit || command.mode == Mode::local ||
        command.mode == Mode::run) {
      const auto values = knobs.with_arguments(command.forwarded);
      if (job.preparation_check()) job.preparation_check()(values);
      if (login_check)
        login_check(values, {login_world(job, command), !command.after.empty() || !job.dependencies().empty()});
    }
    if (detail::runs_as_step_task(command, context))
      return worker(knobs.with_arguments(command.forwarded), detail::step_task_placement(job, command, context));
    return run_login_command(job, command, context, std::cout, std::cerr, &knobs, planner);
  });
}

}  // namespace hpctrain
