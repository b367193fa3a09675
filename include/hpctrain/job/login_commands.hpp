#pragma once
// The login-node commands of an hpctrain binary, one function each, and run_login_command that picks one for a
// parsed LoginCommand (job/cli_options.hpp): --dry-run, --submit, --status, --logs, --cancel (of a job, an array
// or a chain), --local (job/local_run.hpp), --run (job/allocation_run.hpp), --plan, --results, --wandb-sync.
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/job/allocation_run.hpp>
#include <hpctrain/job/array_commands.hpp>
#include <hpctrain/job/chain.hpp>
#include <hpctrain/job/cli_options.hpp>
#include <hpctrain/job/job.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/job/local_run.hpp>
#include <hpctrain/job/plan_request.hpp>
#include <hpctrain/job/render.hpp>
#include <hpctrain/job/results.hpp>
#include <hpctrain/job/run_placement.hpp>
#include <hpctrain/job/submit.hpp>
#include <hpctrain/job/wandb_sync.hpp>
#include <hpctrain/slurm/cpus.hpp>

namespace hpctrain {

/// An array's task ids must stay below the cluster's MaxArraySize; where scontrol answers, check it.
inline void check_array_on_cluster(const Job& job) {
  if (!job.array()) return;
  const auto config = run_process({"scontrol", "show", "config"});
  if (config.exit_code != 0) return;  // no cluster here (a dry run on a laptop): Slurm checks at submit
  const auto at = config.out.find("MaxArraySize");
  if (at == std::string::npos) return;
  const auto equals = config.out.find('=', at);
  int max_size = 0;
  if (equals != std::string::npos &&
      detail::parse_array_number(
          detail::trim(config.out.substr(equals + 1, config.out.find('\n', equals) - equals - 1)), max_size))
    check_array_against_max_size(*job.array(), max_size);
}

/// One node's CPUs in the job's partition as sinfo reports them (the smallest node's), asked only when the
/// default cpus_per_task needs it (a job on whole nodes or GPUs that states none, a site file without
/// cores_per_node); nothing where sinfo does not answer.
inline std::optional<int> cluster_node_cpus(const Job& job, const RenderContext& context) {
  if (job.cpus_per_task() || context.site.cores_per_node || context.sinfo_node_cpus) return context.sinfo_node_cpus;
  if (job.gpus_per_node_count() == 0 && !job.exclusive() && !fabric_wants_exclusive(context.site.fabric))
    return std::nullopt;
  std::vector<std::string> args = {"sinfo", "--noheader", "--format=%c"};
  if (job.partition()) args.push_back("--partition=" + *job.partition());
  try {
    const auto result = run_process(args);
    return result.exit_code == 0 ? slurm::smallest_node_cpus(result.out) : std::nullopt;
  } catch (const Error&) {
    return std::nullopt;  // no sinfo here (a dry run on a laptop)
  }
}

/// --status/--logs/--cancel when the last job is an array (or --task was given); empty: not an array.
inline std::optional<int> run_array_command(const Job& job, const LoginCommand& command, const RenderContext& context,
                                            std::ostream& out) {
  using Mode = LoginCommand::Mode;
  if (command.mode != Mode::status && command.mode != Mode::logs && command.mode != Mode::cancel) {
    if (command.task) throw UsageError("--task goes with --logs or --cancel of an array job");
    return std::nullopt;
  }
  const auto last = last_submitted(job, context);
  const auto record = read_array_record(last);
  if (!record) {
    if (command.task) throw UsageError(fmt::format("--task: job {} is not an array job", last.id));
    return std::nullopt;
  }
  if (command.task) require_array_task(*record, *command.task);
  switch (command.mode) {
    case Mode::status:
      out << format_array_status(last, *record, query_array_tasks(last.id, record->spec));
      return exit_ok;
    case Mode::logs: {
      if (!command.task)
        throw UsageError(
            fmt::format("job {} is an array ({}): say which task's log, --logs --task N", last.id, record->spec.text));
      auto task_job = last;
      task_job.id = fmt::format("{}_{}", last.id, *command.task);
      task_job.output_log = array_task_log(last, *record, *command.task, context.environment);
      print_logs(task_job, out, command.follow);
      return exit_ok;
    }
    default: {
      const auto target = command.task ? fmt::format("{}_{}", last.id, *command.task) : last.id;
      cancel(target);
      out << (command.task ? fmt::format("cancelled task {} of array job {}\n", *command.task, last.id)
                           : fmt::format("cancelled array job {} (every task)\n", last.id));
      return exit_ok;
    }
  }
}

/// Prints the job's warnings (job_warnings) on `err`.
inline void print_job_warnings(const Job& job, std::ostream& err) {
  for (const auto& warning : job_warnings(job)) err << "hpctrain: warning: " << warning << "\n";
}

namespace detail {
/// The job's sweep checked with the program's knob table, for --dry-run and --submit: every combination, before
/// anything is written or queued. A knob both swept and given on the command line is ambiguous: refused.
inline ResolvedSweep checked_sweep(const Job& job, const LoginCommand& command, const Knobs* knobs) {
  if (command.mode == LoginCommand::Mode::local)
    throw UsageError(
        "this program sweeps: a sweep runs as a job array, one task per combination; use --submit "
        "(or --dry-run to see it)");
  if (knobs == nullptr)
    throw SpecError(errors::spec_sweep, "sweep",
                    "needs the program's knob table to check its values "
                    "(hpctrain::run, or run_job(argc, argv, job, knobs, worker))");
  auto resolved = resolve_sweep(*job.sweep(), *knobs);
  for (const auto& argument : command.forwarded) {
    const auto flag = argument.substr(0, argument.find('='));
    for (const auto& combination : resolved.combinations)
      for (const auto& [knob, value] : combination.values)
        if (knobs->find(knob)->flag() == flag)
          throw UsageError(
              fmt::format("{} is swept ({}); leave it off the command line or out of the sweep", flag, knob));
  }
  return resolved;
}
}  // namespace detail

namespace detail {
/// The plan's warnings (its lines that begin `hpctrain: warning:`), for a --submit that does not print the plan.
inline void print_plan_warnings(const std::string& plan, std::ostream& err) {
  std::istringstream lines(plan);
  for (std::string line; std::getline(lines, line);)
    if (line.starts_with("hpctrain: warning:")) err << line << "\n";
}

/// Why a --submit of this plan's verdict is refused, if it is: a plan that does not fit, a requeue grace too short for
/// a save where the site refuses one (short_grace = refuse), and a GPU job's plan that
/// cannot know one GPU's memory (its type names none hpctrain knows, or none is asked for): queued, that job would be
/// checked by nothing until it runs out of memory on the nodes. --gpu-memory SIZE states the memory.
inline std::optional<std::string> submission_refusal(PlanVerdict verdict, const PlanRequest& request) {
  if (verdict == PlanVerdict::does_not_fit)
    return "the memory plan does not fit (--plan shows it; --gpu-memory SIZE states one GPU's memory)";
  if (verdict == PlanVerdict::short_grace)
    return "requeue_on_timeout's grace cannot hold a save (the warning above says what it needs), and the site "
           "file says short_grace = refuse";
  if (verdict != PlanVerdict::unknown || request.gpus_per_node == 0) return std::nullopt;
  return fmt::format(
      "the memory plan cannot check the job against one GPU's memory ({}): state it with --gpu-memory "
      "SIZE (80GB, 74.5GiB)",
      request.gpu_type.empty() ? "the job names no GPU type; a100:8 would name one"
                               : fmt::format("its GPU type '{}' names none hpctrain knows", request.gpu_type));
}

/// The memory plan of a --dry-run (printed to `err` as a section, when the program can plan) or a --submit
/// (printed only when it refuses the submission: nothing written or queued; else its warnings). Whether --submit
/// stops here (submission_refusal; a --dry-run says so as a warning).
inline bool plan_stops_submission(const Job& job, const LoginCommand& command, const RenderContext& context,
                                  const Knobs* knobs, const Planner& planner, std::ostream& err, bool print) {
  if (!planner || knobs == nullptr) return false;
  std::ostringstream text;
  text << gpu_memory_note(command);
  const auto request = plan_request(job, command, context.site, context.environment);
  const auto verdict = planner(knobs->with_arguments(command.forwarded), request, text);
  if (verdict == PlanVerdict::cannot_plan) return false;
  const auto refusal = submission_refusal(verdict, request);
  if (print || refusal) err << text.str();
  else print_plan_warnings(text.str(), err);
  if (refusal)
    err << (print ? "hpctrain: warning: --submit would stop here: " : "hpctrain: not submitted: ") << *refusal << "\n";
  return refusal.has_value();
}
}  // namespace detail

namespace detail {
/// Whether `path` lies inside `directory` (or is it), both taken absolute and normal.
inline bool is_within(const std::filesystem::path& path, const std::filesystem::path& directory) {
  const auto relative = std::filesystem::absolute(path).lexically_normal().lexically_relative(
      std::filesystem::absolute(directory).lexically_normal());
  return !relative.empty() && *relative.begin() != "..";
}

/// The context the workers are rendered or launched with: the sweep's points checked, and `--resume`'s directory
/// passed on (the script or --local then resumes from exactly that run).
inline RenderContext worker_context_for(const Job& job, const LoginCommand& command, const RenderContext& context,
                                        const Knobs* knobs) {
  using Mode = LoginCommand::Mode;
  RenderContext worker_context = context;
  if (job.sweep() && (command.mode == Mode::dry_run || command.mode == Mode::submit || command.mode == Mode::local))
    worker_context.sweep = checked_sweep(job, command, knobs);
  if (command.resume) {
    const auto from = resume_directory(*command.resume, job_root(job, context));
    // A chain resumes its first stage (chain.hpp's stage_context): a run of a later one would load the wrong model.
    for (const auto& stage : job.stages())
      if (is_within(from, job_root(stage, context)))
        throw SpecError(errors::spec_resume, fmt::format("--resume {}", *command.resume),
                        fmt::format("{} is a run of stage {}; a chain resumes its first stage ({}) from one of its "
                                    "runs, and runs the later stages again on its results",
                                    from.string(), stage.name(), job.name()));
    worker_context.worker_args = with_resume_first(std::move(worker_context.worker_args), from);
  }
  return worker_context;
}

/// --dry-run: the script (or the chain's scripts) on stdout, after the checks --submit makes; what the cluster
/// would refuse is a warning here.
inline int dry_run_command(const Job& job, const LoginCommand& command, RenderContext worker_context, std::ostream& out,
                           std::ostream& err, const Knobs* knobs, const Planner& planner) {
  if (!worker_context.slurm_version) worker_context.slurm_version = cluster_slurm_version();
  worker_context.sinfo_node_cpus = cluster_node_cpus(job, worker_context);
  check_array_on_cluster(job);
  print_job_warnings(job, err);
  plan_stops_submission(job, command, worker_context, knobs, planner, err, /*print=*/true);
  if (!job.stages().empty()) {
    out << render_chain(job, worker_context);
    return exit_ok;
  }
  const auto script = render_sbatch(job, worker_context);
  if (const auto refusal = cluster_refusal(job, script, worker_context.environment))
    err << "hpctrain: warning: --submit would stop here: " << refusal->what() << "\n";
  out << script;
  return exit_ok;
}

/// --submit: the job (or the chain of its stages) queued, unless the memory plan says it cannot fit or, for a GPU
/// job, cannot know one GPU's memory.
inline int submit_command(const Job& job, const LoginCommand& command, RenderContext worker_context, std::ostream& out,
                          std::ostream& err, const Knobs* knobs, const Planner& planner) {
  worker_context.sinfo_node_cpus = cluster_node_cpus(job, worker_context);
  check_array_on_cluster(job);
  print_job_warnings(job, err);
  if (plan_stops_submission(job, command, worker_context, knobs, planner, err, /*print=*/false)) return exit_usage;
  if (!job.stages().empty()) {
    const auto chain = submit_chain(job, worker_context);
    out << fmt::format("submitted a chain of {} stages, each after the one before completed successfully:\n",
                       chain.size());
    for (std::size_t i = 0; i < chain.size(); ++i)
      out << fmt::format("  stage {} {}: job {}\n    logs: {}\n", i + 1, chain[i].name, chain[i].id,
                         chain[i].output_log);
    return exit_ok;
  }
  const auto submitted = submit(job, worker_context);
  out << fmt::format(
      "submitted job {}\n  logs: {}\n  job directory: {} (also the run directory: checkpoints, metrics)\n",
      submitted.id, submitted.output_log, submitted.directory.string());
  return exit_ok;
}

/// --status: the last submitted job's state (each stage's for a chain), and a hint for a pending reason.
inline int status_command(const Job& job, const RenderContext& context, std::ostream& out) {
  const auto last = last_submitted(job, context);
  if (const auto chain = read_chain(last)) {
    std::vector<JobState> states;
    for (const auto& stage : *chain) states.push_back(query_state(stage.id));
    out << format_chain_status(*chain, states);
    return exit_ok;
  }
  const auto state = query_state(last.id);
  if (state.state.empty()) {
    out << fmt::format("job {}: unknown to squeue, sacct and scontrol (finished long ago, or purged)\n", last.id);
    return exit_failure;
  }
  out << fmt::format("job {} ({}): {} ({}; from {})\n", last.id, last.name, state.state, state.detail, state.source);
  if (!state.hint.empty()) out << fmt::format("hint: {}\n", state.hint);
  return exit_ok;
}

/// --plan: the memory plan of the program's Training at the job's geometry; exit 2 when it does not fit.
inline int plan_command(const Job& job, const LoginCommand& command, const RenderContext& context, std::ostream& out,
                        std::ostream& err, const Knobs* knobs, const Planner& planner) {
  if (!planner || knobs == nullptr) {
    err << "hpctrain: --plan: this program declares no memory plan (a Training from lm::causal_lm_training has one)\n";
    return exit_usage;
  }
  print_job_warnings(job, err);  // as --dry-run does: GPUs a node would leave idle, above all
  out << gpu_memory_note(command);
  const auto verdict = planner(knobs->with_arguments(command.forwarded),
                               plan_request(job, command, context.site, context.environment), out);
  return verdict == PlanVerdict::fits || verdict == PlanVerdict::unknown ? exit_ok : exit_usage;
}

/// --cancel: the last submitted job (every stage of a chain).
inline int cancel_command(const Job& job, const RenderContext& context, std::ostream& out) {
  const auto last = last_submitted(job, context);
  if (const auto chain = read_chain(last)) {
    for (const auto& stage : *chain) {
      cancel(stage.id);
      out << fmt::format("cancelled stage {} (job {})\n", stage.name, stage.id);
    }
    return exit_ok;
  }
  cancel(last.id);
  out << fmt::format("cancelled job {}\n", last.id);
  return exit_ok;
}
}  // namespace detail

/// Runs one login-node command for `job`; prints to `out`/`err`, returns the exit code.
/// `knobs`: the program's knob table (a sweep is checked with it), or nullptr for a program without one.
inline int run_login_command(Job job, const LoginCommand& command, const RenderContext& context,
                             std::ostream& out = std::cout, std::ostream& err = std::cerr, const Knobs* knobs = nullptr,
                             const Planner& planner = {}) {
  using Mode = LoginCommand::Mode;
  return with_exit_codes(err, [&]() -> int {
    apply_overrides(job, command);
    if (const auto handled = run_array_command(job, command, context, out)) return *handled;
    const auto worker_context = detail::worker_context_for(job, command, context, knobs);
    switch (command.mode) {
      case Mode::help: out << command.help; return exit_ok;
      case Mode::none: err << command.help; return exit_usage;
      case Mode::dry_run: return detail::dry_run_command(job, command, worker_context, out, err, knobs, planner);
      case Mode::submit: return detail::submit_command(job, command, worker_context, out, err, knobs, planner);
      case Mode::status: return detail::status_command(job, context, out);
      case Mode::logs: print_logs(last_submitted(job, context), out, command.follow); return exit_ok;
      case Mode::local:
        if (!job.stages().empty()) return detail::local_chain_command(job, command, context, worker_context, out, err);
        return detail::local_command(job, command, context, worker_context, out, err);
      case Mode::plan: return detail::plan_command(job, command, context, out, err, knobs, planner);
      case Mode::run: {
        auto allocation_context = worker_context;
        allocation_context.sinfo_node_cpus = cluster_node_cpus(job, allocation_context);
        print_job_warnings(job, err);
        return run_in_allocation(job, allocation_context, out, err);
      }
      case Mode::results: out << results_table(last_submitted(job, context), command.sort_by); return exit_ok;
      case Mode::wandb_sync:
        return wandb_sync(command.wandb_sync->empty() ? last_submitted(job, context).directory
                                                      : std::filesystem::path(*command.wandb_sync),
                          out, err, context.environment);
      case Mode::cancel: return detail::cancel_command(job, context, out);
    }
    return exit_failure;
  });
}

}  // namespace hpctrain
