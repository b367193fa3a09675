#pragma once
// The login-node command line of an hpctrain binary (DESIGN.md's contract): --dry-run, --submit,
// --status, --logs [--follow], --cancel, --local N, --resume [DIR], the job overrides, and the worker
// marker that the generated script passes. With a knob table (job/knobs.hpp) every other argument must be a
// valid knob — checked here, before anything is written or queued — and is forwarded to the workers;
// without one (a torch-free program with its own worker protocol) other arguments are forwarded unchecked.
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>  // setenv: --local exports the job's environment
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>  // execl: --run becomes its script

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/job/allocation.hpp>
#include <hpctrain/job/array_commands.hpp>
#include <hpctrain/job/chain.hpp>
#include <hpctrain/job/job.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/job/plan_request.hpp>
#include <hpctrain/job/prepare.hpp>
#include <hpctrain/job/render.hpp>
#include <hpctrain/job/results.hpp>
#include <hpctrain/job/spec_error_exit.hpp>  // installed before main: a wrong setter exits 2
#include <hpctrain/job/submit.hpp>
#include <hpctrain/job/units.hpp>
#include <hpctrain/job/wandb_sync.hpp>
#include <hpctrain/names.hpp>
#include <hpctrain/slurm/cpus.hpp>
#include <hpctrain/slurm/local_launch.hpp>

namespace hpctrain {

/// What the login-node command line asked for.
struct LoginCommand {
  enum class Mode { none, help, dry_run, submit, status, logs, cancel, local, results, run, plan, wandb_sync };
  Mode mode = Mode::none;
  bool follow = false;
  std::optional<int> nodes, tasks_per_node, local_ranks;
  std::optional<std::string> gpus_per_node, time, partition, account;
  std::vector<std::string> env;     ///< K=V
  std::vector<std::string> sbatch;  ///< KEY=VALUE or KEY
  /// `--resume [DIR]`: DIR, or empty for the newest run of this program that has checkpoints.
  std::optional<std::string> resume;
  /// `--after JOB` (repeatable): the submitted job waits until JOB completed successfully (afterok).
  std::vector<std::string> after;
  /// For the workers: the knobs, validated and spelled `--name=value` when a table was given, else as typed.
  std::vector<std::string> forwarded;
  std::string help;
  // The job layer's second-wave options (add_job_layer_options / apply_job_layer_overrides).
  std::optional<std::string> gpu_syntax, array;
  std::optional<int> task;               ///< --task N: one task of an array (--logs, --cancel)
  bool results = false;                  ///< --results: the table of the last job's tasks (job/results.hpp)
  std::optional<std::string> sort_by;    ///< --sort-by METRIC[:max|:min] for --results
  std::optional<double> gpu_memory_gib;  ///< --gpu-memory GIB: one GPU's memory for the plan (else the GPU type's)
  /// `--wandb-sync [RUN_DIR]`: RUN_DIR, or empty for the last submitted job's directory.
  std::optional<std::string> wandb_sync;
  /// `--check-fabric`: the workers run an all-reduce sweep instead of training; `--check-fabric-max SIZE` its
  /// largest message (default: 1 GiB over NCCL, 64 MiB over Gloo).
  bool check_fabric = false;
  std::optional<std::string> check_fabric_max;
  /// `--allow-socket-fallback`: NCCL over TCP sockets on an efa or infiniband site warns instead of failing.
  bool allow_socket_fallback = false;
};

/// The geometry `job` asks for, with `command`'s overrides applied, and one GPU's memory: --gpu-memory, else
/// the GPU type's.
inline PlanRequest plan_request(const Job& job, const LoginCommand& command) {
  PlanRequest request;
  request.ranks_per_node = job.tasks_per_node();
  request.world = job.nodes() * request.ranks_per_node;
  request.gpus_per_node = job.gpus_per_node_count();
  if (command.gpu_memory_gib) request.gpu_bytes = *command.gpu_memory_gib * 1024.0 * 1024.0 * 1024.0;
  else if (job.gpus() && !job.gpus()->type.empty()) request.gpu_bytes = gpu_memory_of_type(job.gpus()->type);
  return request;
}

/// The code run under srun, given the arguments after the worker marker; returns the exit code.
using Worker = std::function<int(const std::vector<std::string>& args)>;
/// The code run under srun for a program with a knob table: the table holding this run's values.
using KnobWorker = std::function<int(const Knobs& knobs)>;

/// Options of arrays, sweeps and site settings, kept apart from the parser's structure.
inline void add_job_layer_options(CLI::App& app, LoginCommand& command) {
  app.add_option("--gpu-syntax", command.gpu_syntax,
                 "write GPUs as --gpus-per-node or --gres=gpu:N (gpus-per-node|gres)");
  app.add_option("--array", command.array, "submit a job array: task ids like 0-15, 1,3,5, 0-30:10, 0-15%4");
  app.add_option("--task", command.task, "with --logs or --cancel of an array: that task only");
  app.add_flag("--results", command.results,
               "one row per task of the last job (array or sweep): knob values, state, final metrics, best first");
  app.add_option("--sort-by", command.sort_by,
                 "with --results: the metric to rank by, METRIC[:max|:min] (default: eval_loss; accuracy-like "
                 "metrics rank higher first)");
}

/// Options of the network checks (job/fabric.hpp, job/nccl_network.hpp).
inline void add_fabric_options(CLI::App& app, LoginCommand& command) {
  app.add_flag("--check-fabric", command.check_fabric,
               "with --submit, --run or --local: instead of training, time all-reduces of 8 B up to --check-fabric-max "
               "over the job's ranks and print size, time, algbw and busbw as nccl-tests' all_reduce_perf does");
  app.add_option("--check-fabric-max", command.check_fabric_max,
                 "with --check-fabric: the largest message (default 1G over NCCL, 64M over Gloo; K, M, G)")
      ->type_name("SIZE");
  app.add_flag("--allow-socket-fallback", command.allow_socket_fallback,
               "run even when NCCL fell back to TCP sockets on a site whose fabric is efa or infiniband");
}

/// Applies the options of add_job_layer_options and add_fabric_options to `job`: the network checks travel to
/// the workers as environment variables of the job.
inline void apply_job_layer_overrides(Job& job, const LoginCommand& command) {
  if (command.gpu_syntax) job.gpu_syntax(std::string_view(*command.gpu_syntax));
  if (command.array) job.array(*command.array);
  if (command.allow_socket_fallback) job.env(env::allow_socket_fallback, "1");
  if (command.check_fabric)
    job.env(env::check_fabric, command.check_fabric_max
                                   ? std::to_string(parse_bytes(*command.check_fabric_max, "check_fabric_max"))
                                   : "0");
}

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
      task_job.output_log = array_task_log(last, *record, *command.task);
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
inline LoginCommand parse_login_command(int argc, char** argv, const Knobs* knobs) {
  LoginCommand command;
  CLI::App app{"An hpctrain program: it submits itself to Slurm and trains under srun.", argc > 0 ? argv[0] : "train"};
  app.set_help_flag();  // ours below, so that --help is a mode like the others
  app.allow_extras();
  app.footer(
      "Without a mode the program only prints this text. Other arguments are forwarded to the workers (a\n"
      "training program checks them here first: see its knobs below).\n"
      "Exit codes: 0 success, 2 bad usage or invalid job description, 1 a runtime failure.");
  bool help = false, dry_run = false, submit = false, status = false, logs = false, cancel = false, run = false;
  app.add_flag("-h,--help", help, "print this help");
  app.add_flag("--dry-run", dry_run, "print the sbatch script --submit would submit; touch nothing");
  app.add_flag("--submit", submit, "write the script under hpctrain-jobs/<name>/<id>/ and sbatch it");
  app.add_flag("--status", status, "state of the last submitted job (squeue, then sacct)");
  app.add_flag("--logs", logs, "print the last submitted job's log");
  app.add_flag("--follow", command.follow, "with --logs: keep printing until the job ends");
  app.add_flag("--cancel", cancel, "scancel the last submitted job");
  bool plan = false;
  app.add_flag("--plan", plan,
               "print what each GPU and node will hold (parameters, gradients, optimizer state, activations) "
               "and whether it fits; exit 2 if it does not; touch nothing");
  app.add_option("--gpu-memory", command.gpu_memory_gib,
                 "with --plan, --dry-run or --submit: one GPU's memory in GiB (default: what the GPU type says)")
      ->type_name("GIB");
  app.add_flag("--run", run,
               "inside an allocation (salloc, an interactive job): run the training on it as the batch script "
               "would; under your own srun: train as that step's ranks");
  app.add_option("--after", command.after,
                 "with --submit or --dry-run: start only after job JOB completed "
                 "successfully (--dependency=afterok:JOB; repeatable)")
      ->allow_extra_args(false)
      ->type_name("JOB");
  app.add_option("--local", command.local_ranks,
                 "run N ranks on this machine, without Slurm (like torchrun --standalone)");
  app.add_option("--nodes", command.nodes, "override --nodes");
  app.add_option("--tasks-per-node", command.tasks_per_node, "override --ntasks-per-node");
  app.add_option("--gpus-per-node", command.gpus_per_node, "override --gpus-per-node (4 or a100:4)");
  app.add_option("--time", command.time, "override --time (D-HH:MM:SS, HH:MM:SS, MM, 90min, 2h)");
  app.add_option("--partition", command.partition, "override --partition");
  app.add_option("--account", command.account, "override --account");
  app.add_option("--env", command.env, "export K=V in the job (repeatable)")->allow_extra_args(false);
  app.add_option("--sbatch", command.sbatch, "any sbatch option as KEY=VALUE or KEY (repeatable)")
      ->allow_extra_args(false);
  // --- run directories (item 7 of issue 8): only programs with a knob table train, so only they resume.
  std::vector<std::string> resume;
  CLI::Option* resume_option = nullptr;
  if (knobs != nullptr)
    resume_option = app.add_option("--resume", resume,
                                   "with --submit, --dry-run or --local: start from the newest checkpoint of run "
                                   "directory DIR (default: this program's newest run)")
                        ->expected(0, 1)
                        ->type_name("[DIR]");
  std::vector<std::string> wandb_sync;
  CLI::Option* wandb_sync_option = nullptr;
  if (knobs != nullptr)
    wandb_sync_option = app.add_option("--wandb-sync", wandb_sync,
                                       "upload the W&B offline runs of the last job (or of run directory RUN_DIR) with "
                                       "wandb sync; prints the command where wandb is not on PATH")
                            ->expected(0, 1)
                            ->type_name("[RUN_DIR]");
  add_job_layer_options(app, command);
  add_fabric_options(app, command);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  if (resume_option != nullptr && resume_option->count() > 0) command.resume = resume.empty() ? "" : resume.front();
  if (wandb_sync_option != nullptr && wandb_sync_option->count() > 0)
    command.wandb_sync = wandb_sync.empty() ? "" : wandb_sync.front();
  command.forwarded = app.remaining();
  command.help = app.help();
  if (knobs != nullptr) {
    // Every knob is checked now, so that a typo or a bad value fails before anything is written or queued.
    command.forwarded = knobs->with_arguments(command.forwarded).arguments();
    command.help += "\n" + knobs->help();
  }
  const bool local = command.local_ranks.has_value();
  const int modes = help + dry_run + submit + status + logs + cancel + local + command.results + run + plan +
                    command.wandb_sync.has_value();
  if (modes > 1)
    throw UsageError(fmt::format(
        "choose one of --dry-run, --submit, --status, --logs, --cancel, --local, --run, --results, --plan{}",
        knobs != nullptr ? ", --wandb-sync" : ""));
  using Mode = LoginCommand::Mode;
  command.mode = help                 ? Mode::help
                 : dry_run            ? Mode::dry_run
                 : submit             ? Mode::submit
                 : status             ? Mode::status
                 : logs               ? Mode::logs
                 : cancel             ? Mode::cancel
                 : local              ? Mode::local
                 : run                ? Mode::run
                 : command.results    ? Mode::results
                 : plan               ? Mode::plan
                 : command.wandb_sync ? Mode::wandb_sync
                                      : Mode::none;
  if (command.follow && command.mode != Mode::logs) throw UsageError("--follow goes with --logs");
  if (command.gpu_memory_gib && command.mode != Mode::plan && command.mode != Mode::dry_run &&
      command.mode != Mode::submit)
    throw UsageError("--gpu-memory goes with --plan, --dry-run or --submit");
  if (command.gpu_memory_gib && !(*command.gpu_memory_gib > 0))
    throw UsageError(fmt::format("--gpu-memory {}: must be a positive number of GiB", *command.gpu_memory_gib));
  if (command.sort_by && command.mode != Mode::results) throw UsageError("--sort-by goes with --results");
  if (command.resume && command.mode != Mode::submit && command.mode != Mode::dry_run && command.mode != Mode::local &&
      command.mode != Mode::run)
    throw UsageError("--resume goes with --submit, --dry-run, --local or --run");
  if (!command.after.empty() && command.mode != Mode::submit && command.mode != Mode::dry_run)
    throw UsageError("--after goes with --submit or --dry-run");
  if (command.check_fabric && command.mode != Mode::submit && command.mode != Mode::dry_run &&
      command.mode != Mode::local && command.mode != Mode::run)
    throw UsageError("--check-fabric goes with --submit, --run or --local (or --dry-run, to see the script)");
  if (command.check_fabric_max && !command.check_fabric)
    throw UsageError("--check-fabric-max goes with --check-fabric");
  if (command.allow_socket_fallback && command.mode != Mode::submit && command.mode != Mode::dry_run &&
      command.mode != Mode::local && command.mode != Mode::run)
    throw UsageError("--allow-socket-fallback goes with --submit, --run or --local (or --dry-run)");
  return command;
}
}  // namespace detail

/// Parses argv (without the worker marker); arguments it does not know are kept in `forwarded` unchecked.
/// Throws UsageError.
inline LoginCommand parse_login_command(int argc, char** argv) {
  return detail::parse_login_command(argc, argv, nullptr);
}

/// Parses argv against `knobs` as well: an unknown argument is a UsageError naming it, an invalid knob value
/// a SpecError `[hpctrain.spec.knob]` naming the knob, the value and the reason.
inline LoginCommand parse_login_command(int argc, char** argv, const Knobs& knobs) {
  return detail::parse_login_command(argc, argv, &knobs);
}

namespace detail {
/// The run directory `--resume DIR` names (DIR absolute), or the newest run under `root` with checkpoints.
/// Throws SpecError `[hpctrain.spec.resume]` when there is none to resume from.
inline std::filesystem::path resume_directory(const std::string& requested, const std::filesystem::path& root) {
  namespace fs = std::filesystem;
  if (!requested.empty()) {
    const fs::path directory = fs::absolute(requested).lexically_normal();
    if (!layout::has_checkpoints(directory))
      throw SpecError(errors::spec_resume, fmt::format("--resume {}", requested),
                      fmt::format("{} holds no checkpoint to resume from", (directory / layout::checkpoints).string()));
    return directory;
  }
  std::optional<fs::path> newest;
  fs::file_time_type newest_time{};
  std::error_code error;
  for (fs::directory_iterator entry(root, error), end; !error && entry != end; entry.increment(error)) {
    if (!entry->is_directory(error) || !layout::has_checkpoints(entry->path())) continue;
    const auto time = fs::last_write_time(entry->path() / layout::checkpoints, error);
    if (!newest || time > newest_time) newest = entry->path(), newest_time = time;
  }
  if (!newest)
    throw SpecError(
        errors::spec_resume, "--resume",
        fmt::format("no run of this program under {} has checkpoints; name one: --resume DIR", root.string()));
  return *newest;
}

/// A new directory `<root>/local-<UTC time>[-<n>]` for one `--local` run (created here, so two runs started
/// in the same second do not share one).
/// The job's literal environment (Job::env, --env), exported in this process for what --local starts, as the
/// sbatch script exports it (render.hpp), after the site's (site_environment): the job's values win over this
/// shell's. pass_env and secret_env names are this shell's own already.
inline void export_job_environment(const Job& job, const RenderContext& context) {
  for (const auto& variable : site_environment(job, context.site))  // the site's first, as in the script
    ::setenv(variable.name.c_str(), variable.value.c_str(), variable.shell_wins ? 0 : 1);
  for (const auto& var : job.environment())
    if (var.kind == EnvKind::literal) ::setenv(var.name.c_str(), var.value.c_str(), 1);
}

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

/// Applies the command-line overrides to `job` (the setters validate: SpecError names the field).
inline void apply_overrides(Job& job, const LoginCommand& command) {
  if (command.nodes) job.nodes(*command.nodes);
  if (command.tasks_per_node) job.tasks_per_node(*command.tasks_per_node);
  if (command.gpus_per_node) job.gpus_per_node(std::string_view(*command.gpus_per_node));
  if (command.time) job.time(parse_slurm_time(*command.time));
  if (command.partition) job.partition(*command.partition);
  if (command.account) job.account(*command.account);
  for (const auto& assignment : command.env) {
    const auto equals = assignment.find('=');
    if (equals == std::string::npos) throw UsageError(fmt::format("--env expects K=V, got '{}'", assignment));
    job.env(assignment.substr(0, equals), assignment.substr(equals + 1));
  }
  for (const auto& option : command.sbatch) {
    const auto equals = option.find('=');
    job.sbatch_option(option.substr(0, equals), equals == std::string::npos ? "" : option.substr(equals + 1));
  }
  for (const auto& id : command.after) job.after(id, After::ok);
  apply_job_layer_overrides(job, command);
}

/// `--local N` with Job::prepare: the preparation runs first, in this process, with the run directory
/// `hpctrain-jobs/<name>/local` (job id `local`); it is skipped when that directory says it completed.
inline int prepare_locally(const Job& job, const RenderContext& context, const std::vector<std::string>& args,
                           std::ostream& err) {
  if (!job.preparation()) return exit_ok;
  PrepareContext prepare;
  prepare.job_id = "local";
  prepare.run_dir = job_root(job, context) / "local";
  prepare.output_dir = prepare.run_dir / layout::prepare_output;
  prepare.args = args;
  const auto done = prepare.run_dir / prepare_done_file;
  if (std::filesystem::exists(done)) {
    err << fmt::format("hpctrain: preparation already done ({}); skipping it\n", done.string());
    return exit_ok;
  }
  const int status = run_preparation(job.preparation(), prepare);
  if (status == exit_ok) detail::write_file_atomically(done, "");
  return status;
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
inline slurm::EnvironmentLookup context_lookup(const RenderContext& context) {
  if (!context.lookup_env) return slurm::process_environment;
  return [lookup = context.lookup_env](const std::string& name) -> std::optional<std::string> {
    auto value = lookup(name);
    if (value && value->empty()) return std::nullopt;
    return value;
  };
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
/// The memory plan of a --dry-run (printed to `err` as a section, when the program can plan) or a --submit
/// (printed only when it does not fit, which refuses the submission: nothing written or queued).
inline PlanVerdict plan_before_queueing(const Job& job, const LoginCommand& command, const Knobs* knobs,
                                        const Planner& planner, std::ostream& err, bool print) {
  if (!planner || knobs == nullptr) return PlanVerdict::cannot_plan;
  std::ostringstream text;
  const auto verdict = planner(knobs->with_arguments(command.forwarded), plan_request(job, command), text);
  if (verdict == PlanVerdict::cannot_plan) return verdict;
  if (print || verdict == PlanVerdict::does_not_fit) err << text.str();
  if (verdict == PlanVerdict::does_not_fit && !print)
    err << "hpctrain: not submitted: the memory plan does not fit (--plan shows it; --gpu-memory GIB states one GPU's "
           "memory)\n";
  return verdict;
}
}  // namespace detail

namespace detail {
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
    worker_context.worker_args.insert(worker_context.worker_args.begin(), {"--resume", from.string()});
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
  plan_before_queueing(job, command, knobs, planner, err, /*print=*/true);
  if (!job.stages().empty()) {
    out << render_chain(job, worker_context);
    return exit_ok;
  }
  const auto script = render_sbatch(job, worker_context);
  if (const auto refusal = cluster_refusal(job, script))
    err << "hpctrain: warning: --submit would stop here: " << refusal->what() << "\n";
  out << script;
  return exit_ok;
}

/// --submit: the job (or the chain of its stages) queued, unless the memory plan says it cannot fit.
inline int submit_command(const Job& job, const LoginCommand& command, RenderContext worker_context, std::ostream& out,
                          std::ostream& err, const Knobs* knobs, const Planner& planner) {
  worker_context.sinfo_node_cpus = cluster_node_cpus(job, worker_context);
  check_array_on_cluster(job);
  print_job_warnings(job, err);
  if (plan_before_queueing(job, command, knobs, planner, err, /*print=*/false) == PlanVerdict::does_not_fit)
    return exit_usage;
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

/// --local N: the preparation here, then N ranks on this machine, each run in a directory of its own.
inline int local_command(const Job& job, const LoginCommand& command, const RenderContext& context,
                         const RenderContext& worker_context, std::ostream& out, std::ostream& err) {
  export_job_environment(job, context);  // the preparation and the ranks see the job's environment
  if (const int prepared = prepare_locally(job, context, command.forwarded, err); prepared != exit_ok) return prepared;
  // The ranks run in a new directory of their own: tell them where the preparation left its results.
  if (job.preparation())
    ::setenv(env::prepare_dir, (job_root(job, context) / "local" / layout::prepare_output).c_str(), 1);
  std::vector<std::string> args = {std::string(worker_flag)};
  args.insert(args.end(), worker_context.worker_args.begin(), worker_context.worker_args.end());
  LocalLaunchOptions options;
  // Each run its own directory, so a second run trains again instead of finding the first one's checkpoints; a
  // directory named in HPCTRAIN_RUN_DIR is the user's choice and is kept.
  if (!hpctrain::getenv(env::run_dir)) {
    require(*command.local_ranks >= 1, errors::spec_local, *command.local_ranks, "needs at least 1 rank");
    options.run_directory = new_local_run_directory(job_root(job, context));
  }
  out << fmt::format("run directory: {}\n",
                     options.run_directory ? options.run_directory->string() : *hpctrain::getenv(env::run_dir))
      << std::flush;
  return launch_local(*command.local_ranks, context.program, args, options);
}

/// --plan: the memory plan of the program's Training at the job's geometry; exit 2 when it does not fit.
inline int plan_command(const Job& job, const LoginCommand& command, std::ostream& out, std::ostream& err,
                        const Knobs* knobs, const Planner& planner) {
  if (!planner || knobs == nullptr) {
    err << "hpctrain: --plan: this program declares no memory plan (a Training from lm::causal_lm_training has one)\n";
    return exit_usage;
  }
  const auto verdict = planner(knobs->with_arguments(command.forwarded), plan_request(job, command), out);
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
  try {
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
      case Mode::local: return detail::local_command(job, command, context, worker_context, out, err);
      case Mode::plan: return detail::plan_command(job, command, out, err, knobs, planner);
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
                          out, err);
      case Mode::cancel: return detail::cancel_command(job, context, out);
    }
  } catch (const std::exception& e) {
    err << e.what() << "\n";
    return exit_code_of(e);
  }
  return exit_failure;
}

namespace detail {
/// `srun [options] ./train --run`: this task is a rank of the user's step. It gets the run directory `--run`
/// from the allocation's shell would give (unless HPCTRAIN_RUN_DIR is set) and `--resume`'s directory; the
/// preparation step is not run here (rank 0 says so).
inline void prepare_step_task(const Job& job, const LoginCommand& command, const RenderContext& context) {
  const auto place_lookup = slurm::process_environment;
  const auto job_id = place_lookup("SLURM_JOB_ID").value_or(place_lookup("SLURM_JOBID").value_or("0"));
  if (!hpctrain::getenv(env::run_dir))
    ::setenv(env::run_dir, allocation_run_directory(job, context, job_id).c_str(), 1);
  if (command.resume) ::setenv(env::resume_from, resume_directory(*command.resume, job_root(job, context)).c_str(), 1);
  if (job.preparation() && place_lookup("SLURM_PROCID").value_or("0") == "0")
    std::cerr << "hpctrain: --run under your own srun: the ranks train now; the preparation step (Job::prepare) "
                 "runs only from the allocation's shell (`--run` without srun)\n";
}

/// Set during static initialisation, before the user's main builds its description: in a program that can call
/// run_job (or hpctrain::run), a wrong setter exits 2 naming the field, whatever main does before the call.
inline const bool spec_errors_exit_2 = (install_spec_error_exit(), true);
}  // namespace detail

/// The whole program for a job: worker mode under the marker, else the login-node command line. Arguments
/// that are not login options reach `worker` unchecked.
inline int run_job(int argc, char** argv, const Job& job, const Worker& worker) {
  if (is_worker_invocation(argc, argv)) return worker(std::vector<std::string>(argv + 2, argv + argc));
  if (is_prepare_invocation(argc, argv))
    return run_preparation(job.preparation(),
                           prepare_context_from_environment(std::vector<std::string>(argv + 2, argv + argc)));
  LoginCommand command;
  try {
    command = parse_login_command(argc, argv);
    if (command.mode == LoginCommand::Mode::run && run_place() == RunPlace::step_task) {
      detail::prepare_step_task(job, command, current_render_context(argc, argv, command.forwarded));
      return worker(command.forwarded);
    }
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return exit_code_of(e);
  }
  return run_login_command(job, command, current_render_context(argc, argv, command.forwarded));
}

/// The same for a program with a knob table: the login command refuses an unknown or invalid knob (exit 2,
/// nothing written or queued), `--help` lists the knobs, and `worker` gets the table with this run's values
/// (the worker's arguments are read with the same table; a bad one exits 2 on every rank).
/// `login_check`, when given, sees the knob values of a --dry-run, --submit or --local before anything is written
/// or queued (Training::login_check: a data file visible here is validated); a SpecError from it exits 2.
inline int run_job(int argc, char** argv, const Job& job, const Knobs& knobs, const KnobWorker& worker,
                   const std::function<void(const Knobs&)>& login_check = {}, const Planner& planner = {}) {
  if (is_prepare_invocation(argc, argv))
    return run_preparation(job.preparation(),
                           prepare_context_from_environment(std::vector<std::string>(argv + 2, argv + argc)));
  if (is_worker_invocation(argc, argv)) {
    try {
      std::vector<std::string> args(argv + 2, argv + argc);
      // `--resume DIR` (put first by the login command) travels on as HPCTRAIN_RESUME_FROM, which the training
      // layer reads where it resolves the run directory (train/run_directory.hpp). Still one thread here.
      if (args.size() >= 2 && args[0] == "--resume") {
        ::setenv(env::resume_from, args[1].c_str(), 1);
        args.erase(args.begin(), args.begin() + 2);
      }
      return worker(knobs.with_arguments(args));
    } catch (const std::exception& e) {
      std::cerr << e.what() << "\n";
      return exit_code_of(e);
    }
  }
  LoginCommand command;
  try {
    command = parse_login_command(argc, argv, knobs);
    using Mode = LoginCommand::Mode;
    if (login_check && (command.mode == Mode::dry_run || command.mode == Mode::submit || command.mode == Mode::local ||
                        command.mode == Mode::run))
      login_check(knobs.with_arguments(command.forwarded));
    if (command.mode == Mode::run && run_place() == RunPlace::step_task) {
      detail::prepare_step_task(job, command, current_render_context(argc, argv, command.forwarded));
      return worker(knobs.with_arguments(command.forwarded));
    }
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return exit_code_of(e);
  }
  return run_login_command(job, command, current_render_context(argc, argv, command.forwarded), std::cout, std::cerr,
                           &knobs, planner);
}

}  // namespace hpctrain
