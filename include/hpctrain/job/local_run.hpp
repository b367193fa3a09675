#pragma once
// `--local N`: the job's preparation step, then N ranks on this machine (slurm/local_launch.hpp),
// each run in a directory of its own, with the job's environment as the sbatch script would export it.
#include <ctime>
#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/files.hpp>
#include <hpctrain/job/chain.hpp>
#include <hpctrain/job/cli_options.hpp>
#include <hpctrain/job/job.hpp>
#include <hpctrain/job/prepare.hpp>
#include <hpctrain/job/process.hpp>
#include <hpctrain/job/render.hpp>
#include <hpctrain/job/submit.hpp>
#include <hpctrain/names.hpp>
#include <hpctrain/slurm/local_launch.hpp>

namespace hpctrain {

namespace detail {
/// The environment `job`'s steps start from under --local, as its sbatch script exports it (render.hpp): this
/// shell's (`shell`), the site's where the shell has none of its own (site_environment), then the job's literal
/// values (Job::env, --env) and path entries (prepend_env, append_env), which win over the shell's. pass_env and
/// secret_env names are the shell's own already.
inline Environment job_environment(const Job& job, const RenderContext& context, Environment shell) {
  for (const auto& variable : site_environment(job, context.site))  // the site's first, as in the script
    if (!variable.shell_wins || !shell.get(variable.name, EmptyValue::kept)) shell.set(variable.name, variable.value);
  for (const auto& var : job.environment()) {
    if (var.kind == EnvKind::literal) {
      shell.set(var.name, var.value);
      continue;
    }
    const auto now = shell.get(var.name).value_or("");  // a path list: the entry joins what is there
    const bool first = var.kind == EnvKind::prepend;
    shell.set(var.name, now.empty() ? var.value : first ? var.value + ":" + now : now + ":" + var.value);
  }
  return shell;
}

/// A new directory `<root>/local-<UTC time>[-<n>]` for one `--local` run (created here, so two runs started
/// in the same second do not share one).
inline std::filesystem::path new_local_run_directory(const std::filesystem::path& root) {
  namespace fs = std::filesystem;
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &utc);
  fs::create_directories(root);
  for (int attempt = 1;; ++attempt) {
    const auto name =
        fmt::format("{}{}{}", layout::local_run_prefix, stamp, attempt == 1 ? "" : fmt::format("-{}", attempt));
    if (fs::create_directory(root / name)) return root / name;
  }
}
}  // namespace detail

/// `--local N` with Job::prepare: the preparation step runs first, as the script runs it (`<program>
/// --hpctrain-prepare <the workers' arguments>`, in the job's `environment`), with the run directory
/// `hpctrain-jobs/<name>/local` (job id `local`); it is skipped when that directory says it completed with the same
/// arguments and earlier stages (its marker holds them: another `--data` prepares again).
inline int prepare_locally(const Job& job, const RenderContext& context, const std::vector<std::string>& args,
                           const RenderContext& worker_context, Environment environment, std::ostream& err) {
  if (!job.preparation()) return exit_ok;
  const auto run_dir = job_root(job, context) / "local";
  const auto done = run_dir / prepare_done_file;
  std::string arguments;
  for (const auto& arg : args) arguments += arg + "\n";
  // A chain's later stage prepares from what the earlier ones wrote (sft's export): a new run of them, again.
  if (const auto earlier = environment.get(env::stage_dirs)) arguments += "earlier stages:\n" + *earlier + "\n";
  if (const auto marker = detail::read_file_if_present(done, errors::runtime_io); marker && *marker == arguments) {
    err << fmt::format("hpctrain: preparation already done ({}); skipping it\n", done.string());
    return exit_ok;
  }
  std::filesystem::create_directories(run_dir);
  environment.set(env::run_dir, run_dir.string());
  for (const char* slurm_job : {"SLURM_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT"})
    environment.remove(slurm_job);  // job id `local`, even from inside an allocation
  std::vector<std::string> step = {context.program, std::string(prepare_flag)};
  step.insert(step.end(), worker_context.worker_args.begin(), worker_context.worker_args.end());
  const int status = run_attached(step, environment);
  if (status == exit_ok) detail::write_file_atomically(done, arguments);
  return status;
}

namespace detail {
/// --local N: the preparation here, then N ranks on this machine, each run in a directory of its own
/// (`run_directory` when given: a chain's stage).
inline int local_command(const Job& job, const LoginCommand& command, const RenderContext& context,
                         const RenderContext& worker_context, std::ostream& out, std::ostream& err,
                         std::optional<std::filesystem::path> run_directory = std::nullopt) {
  const auto environment = job_environment(job, context, context.environment);
  if (const int prepared = prepare_locally(job, context, command.forwarded, worker_context, environment, err);
      prepared != exit_ok)
    return prepared;
  std::vector<std::string> args = {std::string(worker_flag)};
  args.insert(args.end(), worker_context.worker_args.begin(), worker_context.worker_args.end());
  LocalLaunchOptions options;
  options.environment = environment;  // the ranks see the job's environment, as under the script
  // The ranks run in a new directory of their own: tell them where the preparation left its results.
  if (job.preparation()) options.prepare_directory = job_root(job, context) / "local" / layout::prepare_output;
  // Each run its own directory, so a second run trains again instead of finding the first one's checkpoints; a
  // directory named in HPCTRAIN_RUN_DIR is the user's choice and is kept.
  require(*command.local_ranks >= 1, errors::spec_local, *command.local_ranks, "needs at least 1 rank");
  if (run_directory) options.run_directory = std::move(run_directory);
  else if (!context.environment.get(env::run_dir))
    options.run_directory = new_local_run_directory(job_root(job, context));
  out << fmt::format("run directory: {}\n",
                     options.run_directory ? options.run_directory->string() : *context.environment.get(env::run_dir))
      << std::flush;
  return launch_local(*command.local_ranks, context.program, args, options);
}

/// --local N of a chain (Job::then): each stage in order, as its job would run, in a run directory of its own
/// (`$HPCTRAIN_RUN_DIR/<stage>` when that is set) and told the earlier stages' (stage_dir); a stage that fails
/// stops the chain, as afterok does.
inline int local_chain_command(const Job& job, const LoginCommand& command, const RenderContext& context,
                               const RenderContext& worker_context, std::ostream& out, std::ostream& err) {
  auto stages = chain_jobs(job);
  std::vector<std::pair<std::string, std::string>> earlier;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    auto& stage = stages[i];
    tell_earlier_stages(stage, earlier);
    const auto chosen = context.environment.get(env::run_dir);
    const auto run_directory = chosen ? std::filesystem::path(*chosen) / detail::directory_name(stage.name())
                                      : new_local_run_directory(job_root(stage, context));
    std::filesystem::create_directories(run_directory);
    out << fmt::format("stage {} of {}: {}\n", i + 1, stages.size(), stage.name()) << std::flush;
    if (const int status =
            local_command(stage, command, context, stage_context(worker_context, i), out, err, run_directory);
        status != exit_ok) {
      if (i + 1 < stages.size())
        err << fmt::format("hpctrain: stage {} ({}) exited {}: the later stages do not run\n", i + 1, stage.name(),
                           status);
      return status;
    }
    earlier.emplace_back(stage.name(), std::filesystem::absolute(run_directory).string());
  }
  return exit_ok;
}
}  // namespace detail

}  // namespace hpctrain
