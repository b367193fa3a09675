#pragma once
// The login-node command line's options (DESIGN.md's contract): the modes (--dry-run, --submit, --status, --logs
// [--follow], --cancel, --local N, --run, --plan, --results, --resume [DIR], --wandb-sync), the job overrides and
// the job layer's options, parsed into a LoginCommand. With a knob table (job/knobs.hpp) every other argument must
// be a valid knob — checked here, before anything is written or queued — and is forwarded to the workers; without
// one (a torch-free program with its own worker protocol) other arguments are forwarded unchecked.
#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/job/job.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/job/plan_request.hpp>
#include <hpctrain/job/units.hpp>
#include <hpctrain/job/site.hpp>
#include <hpctrain/job/units.hpp>
#include <hpctrain/names.hpp>

namespace hpctrain {

/// What the login-node command line asked for.
struct LoginCommand {
  enum class Mode { none, help, dry_run, submit, status, logs, cancel, local, results, run, plan, wandb_sync };
  Mode mode = Mode::none;
  bool follow = false;
  std::optional<int> nodes, tasks_per_node, cpus_per_task, local_ranks;
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
  std::optional<int> task;             ///< --task N: one task of an array (--logs, --cancel)
  bool results = false;                ///< --results: the table of the last job's tasks (job/results.hpp)
  std::optional<std::string> sort_by;  ///< --sort-by METRIC[:max|:min] for --results
  /// --gpu-memory SIZE: one GPU's memory for the plan (else the GPU type's), checked by parse_gpu_memory.
  std::optional<std::string> gpu_memory;
  /// `--wandb-sync [RUN_DIR]`: RUN_DIR, or empty for the last submitted job's directory.
  std::optional<std::string> wandb_sync;
  /// `--check-fabric`: the workers run an all-reduce sweep instead of training; `--check-fabric-max SIZE` its
  /// largest message (default: 1 GiB over NCCL, 64 MiB over Gloo).
  bool check_fabric = false;
  std::optional<std::string> check_fabric_max;
  /// `--check-fabric-min-fraction F`: exit 1 below F of the fabric's bus bandwidth between nodes.
  std::optional<double> check_fabric_min_fraction;
  /// `--allow-socket-fallback`: NCCL over TCP sockets on an efa or infiniband site warns instead of failing.
  bool allow_socket_fallback = false;
};

/// What the plan says of `--gpu-memory N` without a unit: read as GiB, which an H100's "80 GB" is not.
inline std::string gpu_memory_note(const LoginCommand& command) {
  const auto memory = command.gpu_memory ? parse_gpu_memory(*command.gpu_memory) : std::nullopt;
  if (!memory || !memory->bare) return "";
  return fmt::format("hpctrain: --gpu-memory {0} read as {0} GiB ({1:.1f} GB); {0}GB states a GPU sold as {0} GB\n",
                     *command.gpu_memory, memory->bytes / 1e9);
}

/// `request` with `job`'s geometry: its ranks, its GPUs a node and their type (with the type's memory where the type
/// changes), its requeue grace. A chain's later stage is planned at its own job's (run.hpp).
inline PlanRequest with_job_geometry(PlanRequest request, const Job& job) {
  request.ranks_per_node = job.tasks_per_node();
  request.world = job.nodes() * request.ranks_per_node;
  request.gpus_per_node = job.gpus_per_node_count();
  const std::string type = job.gpus() ? job.gpus()->type : "";
  if (type != request.gpu_type) request.gpu_bytes = gpu_memory_of_type(type);
  request.gpu_type = type;
  request.requeue_grace_s.reset();
  if (job.requeue()) request.requeue_grace_s = static_cast<double>(job.requeue()->grace.count());
  return request;
}

/// The geometry `job` asks for, with `command`'s overrides applied, one GPU's memory (--gpu-memory, else the GPU
/// type's), its type, the site's fabric between nodes, and the test seams of the login shell's `environment`.
inline PlanRequest plan_request(const Job& job, const LoginCommand& command, const SiteSettings& site,
                                const Environment& environment) {
  PlanRequest request = with_job_geometry({}, job);
  if (command.gpu_memory) request.gpu_bytes = parse_gpu_memory(*command.gpu_memory).value().bytes;
  if (site.fabric.fabric) request.fabric = std::string(fabric_names[static_cast<std::size_t>(*site.fabric.fabric)]);
  request.expected_busbw_gbps = site.fabric.expected_busbw_gbps;
  request.checkpoint_write_gbps = site.checkpoint_write_gbps;
  request.refuse_short_grace = site.refuse_short_grace;
  request.simulated_link_gbps = test_seam_number(environment, env::test_seam::simulated_link, "GB/s");
  request.cpu_tflops = test_seam_number(environment, env::test_seam::plan_cpu_tflops, "TFLOP/s");
  return request;
}

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
               "with --submit, --run or --local: instead of training, time all-reduce, all-gather and reduce-scatter "
               "of 8 B up to --check-fabric-max over the job's ranks, as nccl-tests prints them, and on several nodes "
               "HSDP's groups within and across nodes, naming the slowest node");
  app.add_option("--check-fabric-max", command.check_fabric_max,
                 "with --check-fabric: the largest message (default 1G over NCCL, 64M over Gloo; K, M, G)")
      ->type_name("SIZE");
  app.add_option("--check-fabric-min-fraction", command.check_fabric_min_fraction,
                 "with --check-fabric: exit 1 when the slowest group across nodes reaches less than this fraction "
                 "(0 to 1) of the fabric's bus bandwidth (the site file's expected_busbw_gbps, else its fabric "
                 "preset's)")
      ->type_name("F");
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
  if (command.check_fabric_min_fraction)
    job.env(env::check_fabric_min_fraction, fmt::format("{}", *command.check_fabric_min_fraction));
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
  app.add_option("--gpu-memory", command.gpu_memory,
                 "with --plan, --dry-run or --submit: one GPU's memory, 80GB (as GPUs are sold), 74.5GiB, or a bare "
                 "number of GiB (default: what the GPU type says)")
      ->type_name("SIZE");
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
  app.add_option("--cpus-per-task", command.cpus_per_task,
                 "override --cpus-per-task: the #SBATCH line and every srun step (and so the threads a rank uses)");
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
  if (command.gpu_memory && command.mode != Mode::plan && command.mode != Mode::dry_run && command.mode != Mode::submit)
    throw UsageError("--gpu-memory goes with --plan, --dry-run or --submit");
  if (command.gpu_memory && !parse_gpu_memory(*command.gpu_memory))
    throw UsageError(
        fmt::format("--gpu-memory {}: expected one GPU's memory above 0: 80GB (decimal, as GPUs are "
                    "sold), 74.5GiB, or a bare number of GiB",
                    *command.gpu_memory));
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
  if (command.check_fabric_min_fraction && !command.check_fabric)
    throw UsageError("--check-fabric-min-fraction goes with --check-fabric");
  if (const auto fraction = command.check_fabric_min_fraction; fraction && !(*fraction > 0 && *fraction <= 1))
    throw UsageError(
        fmt::format("--check-fabric-min-fraction {}: expected a fraction above 0 and at most 1 of the "
                    "fabric's bus bandwidth",
                    *fraction));
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
/// The whole number of `--sbatch KEY=VALUE`; a UsageError naming the option otherwise.
inline int sbatch_count(const std::string& option, const std::string& value) {
  int count = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), count);
  if (value.empty() || error != std::errc() || end != value.data() + value.size())
    throw UsageError(fmt::format("--sbatch {}: expected a whole number of CPUs", option));
  return count;
}
}  // namespace detail

/// The overrides that set the ranks: --nodes, --tasks-per-node and --gpus-per-node (which sets the tasks a node).
inline void apply_geometry_overrides(Job& job, const LoginCommand& command) {
  if (command.nodes) job.nodes(*command.nodes);
  if (command.tasks_per_node) job.tasks_per_node(*command.tasks_per_node);
  if (command.gpus_per_node) job.gpus_per_node(std::string_view(*command.gpus_per_node));
}

/// The ranks a --local, --dry-run or --submit of `job` starts to train, for the login checks: --local's count, else
/// nodes × tasks a node with the command's overrides (a GPU count without tasks gives a task a GPU). None for --run
/// (its allocation says), for a chain (each stage has its own) and for --check-fabric (its ranks do not train).
inline std::optional<int> login_world(Job job, const LoginCommand& command) {
  using Mode = LoginCommand::Mode;
  if (command.check_fabric || command.mode == Mode::run || !job.stages().empty()) return std::nullopt;
  if (command.mode == Mode::local) return command.local_ranks;
  apply_geometry_overrides(job, command);
  return job.nodes() * job.tasks_per_node();
}

/// Applies the command-line overrides to `job` (the setters validate: SpecError names the field).
inline void apply_overrides(Job& job, const LoginCommand& command) {
  apply_geometry_overrides(job, command);
  if (command.cpus_per_task) job.cpus_per_task(*command.cpus_per_task);
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
    const auto key = option.substr(0, equals), value = equals == std::string::npos ? "" : option.substr(equals + 1);
    // The CPUs of a task govern the srun steps too: as --cpus-per-task, not an #SBATCH line the steps would not follow.
    if (key == "cpus-per-task" || key == "c") job.cpus_per_task(detail::sbatch_count(option, value));
    else job.sbatch_option(key, value);
  }
  for (const auto& id : command.after) job.after(id, After::ok);
  apply_job_layer_overrides(job, command);
}

}  // namespace hpctrain
