#pragma once
// `--local N`: the job's preparation in this process, then N ranks on this machine (slurm/local_launch.hpp),
// each run in a directory of its own, with the job's environment as the sbatch script would export it.
#include <cstdlib>  // setenv: the job's environment, for the processes --local starts
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
#include <hpctrain/job/render.hpp>
#include <hpctrain/job/submit.hpp>
#include <hpctrain/names.hpp>
#include <hpctrain/slurm/local_launch.hpp>

namespace hpctrain {

namespace detail {
/// The job's literal environment (Job::env, --env) and its path entries (prepend_env, append_env), exported in
/// this process for what --local starts, as the sbatch script exports them (render.hpp), after the site's
/// (site_environment): the job's values win over this shell's. pass_env and secret_env names are this shell's
/// own already.
inline void export_job_environment(const Job& job, const RenderContext& context) {
  for (const auto& variable : site_environment(job, context.site))  // the site's first, as in the script
    ::setenv(variable.name.c_str(), variable.value.c_str(), variable.shell_wins ? 0 : 1);
  for (const auto& var : job.environment()) {
    if (var.kind == EnvKind::literal) {
      ::setenv(var.name.c_str(), var.value.c_str(), 1);
      continue;
    }
    const auto now = hpctrain::getenv(var.name).value_or("");  // a path list: the entry joins what is there
    const bool first = var.kind == EnvKind::prepend;
    ::setenv(var.name.c_str(),
             (now.empty() ? var.value
              : first     ? var.value + ":" + now
                          : now + ":" + var.value)
                 .c_str(),
             1);
  }
}

/// Restores, when it ends, the variables `job`'s environment sets in this process (export_job_environment): a
/// chain's `--local` stage then leaves the next one this shell's values, as each job of the chain starts from them.
class JobEnvironmentRestore {
 public:
  JobEnvironmentRestore(const Job& job, const RenderContext& context) {
    for (const auto& variable : site_environment(job, context.site)) keep(variable.name);
    for (const auto& variable : job.environment()) keep(variable.name);
  }
  ~JobEnvironmentRestore() {
    for (const auto& [name, value] : saved_)
      if (value) ::setenv(name.c_str(), value->c_str(), 1);
      else ::unsetenv(name.c_str());
  }
  JobEnvironmentRestore(const JobEnvironmentRestore&) = delete;
  JobEnvironmentRestore& operator=(const JobEnvironmentRestore&) = delete;

 private:
  void keep(const std::string& name) {
    for (const auto& [kept, value] : saved_)
      if (kept == name) return;
    saved_.emplace_back(name, hpctrain::getenv(name));
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

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

/// `--local N` with Job::prepare: the preparation runs first, in this process, with the run directory
/// `hpctrain-jobs/<name>/local` (job id `local`); it is skipped when that directory says it completed with the same
/// arguments and earlier stages (its marker holds them: another `--data` prepares again).
inline int prepare_locally(const Job& job, const RenderContext& context, const std::vector<std::string>& args,
                           std::ostream& err) {
  if (!job.preparation()) return exit_ok;
  PrepareContext prepare;
  prepare.job_id = "local";
  prepare.run_dir = job_root(job, context) / "local";
  prepare.output_dir = prepare.run_dir / layout::prepare_output;
  prepare.args = args;
  const auto done = prepare.run_dir / prepare_done_file;
  std::string arguments;
  for (const auto& arg : args) arguments += arg + "\n";
  // A chain's later stage prepares from what the earlier ones wrote (sft's export): a new run of them, again.
  if (const auto earlier = hpctrain::getenv(env::stage_dirs)) arguments += "earlier stages:\n" + *earlier + "\n";
  if (const auto marker = detail::read_file_if_present(done, errors::runtime_io); marker && *marker == arguments) {
    err << fmt::format("hpctrain: preparation already done ({}); skipping it\n", done.string());
    return exit_ok;
  }
  const int status = run_preparation(job.preparation(), prepare);
  if (status == exit_ok) detail::write_file_atomically(done, arguments);
  return status;
}

namespace detail {
/// --local N: the preparation here, then N ranks on this machine, each run in a directory of its own
/// (`run_directory` when given: a chain's stage).
inline int local_command(const Job& job, const LoginCommand& command, const RenderContext& context,
                         const RenderContext& worker_context, std::ostream& out, std::ostream& err,
                         std::optional<std::filesystem::path> run_directory = std::nullopt) {
  export_job_environment(job, context);  // the preparation and the ranks see the job's environment
  if (const int prepared = prepare_locally(job, context, command.forwarded, err); prepared != exit_ok) return prepared;
  std::vector<std::string> args = {std::string(worker_flag)};
  args.insert(args.end(), worker_context.worker_args.begin(), worker_context.worker_args.end());
  LocalLaunchOptions options;
  // The ranks run in a new directory of their own: tell them where the preparation left its results.
  if (job.preparation()) options.prepare_directory = job_root(job, context) / "local" / layout::prepare_output;
  // Each run its own directory, so a second run trains again instead of finding the first one's checkpoints; a
  // directory named in HPCTRAIN_RUN_DIR is the user's choice and is kept.
  require(*command.local_ranks >= 1, errors::spec_local, *command.local_ranks, "needs at least 1 rank");
  if (run_directory) options.run_directory = std::move(run_directory);
  else if (!hpctrain::getenv(env::run_dir)) options.run_directory = new_local_run_directory(job_root(job, context));
  out << fmt::format("run directory: {}\n",
                     options.run_directory ? options.run_directory->string() : *hpctrain::getenv(env::run_dir))
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
    const auto chosen = hpctrain::getenv(env::run_dir);
    const auto run_directory = chosen ? std::filesystem::path(*chosen) / detail::directory_name(stage.name())
                                      : new_local_run_directory(job_root(stage, context));
    std::filesystem::create_directories(run_directory);
    out << fmt::format("stage {} of {}: {}\n", i + 1, stages.size(), stage.name()) << std::flush;
    const JobEnvironmentRestore shell_environment(stage, context);
    if (const int status = local_command(stage, command, context, worker_context, out, err, run_directory);
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
