#pragma once
// Renders a Job as an sbatch script. The script stays on the host: `#SBATCH` directives, modules,
// setup lines and exports, then one `srun` step that starts this same binary in worker mode, inside
// the container when there is one. Every user string is quoted for the language of its line (bash, or
// sbatch's directive parser); only `setup` lines are raw shell, by design.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/job/container.hpp>
#include <hpctrain/job/fabric.hpp>
#include <hpctrain/job/job.hpp>
#include <hpctrain/job/prepare.hpp>
#include <hpctrain/job/shell.hpp>
#include <hpctrain/job/site.hpp>
#include <hpctrain/job/slurm_version.hpp>
#include <hpctrain/job/units.hpp>
#include <hpctrain/names.hpp>  // worker_flag, the job-directory layout
#include <hpctrain/version.hpp>

namespace hpctrain {

/// Everything a rendering needs besides the Job: fixed by tests, taken from the process otherwise.
struct RenderContext {
  std::string program;                   ///< absolute path of the binary the step runs
  std::vector<std::string> argv;         ///< the login-node invocation, for the header comment
  std::vector<std::string> worker_args;  ///< forwarded to the workers after the marker
  std::string workdir;                   ///< absolute; the job's working directory unless Job::chdir
  std::string generated_at;              ///< header timestamp
  /// The submitting shell's variables (pass_env, secret_env, the site file's path, the environment `--local` and
  /// `--run` start from): this process's, taken once at the edge (current_render_context). Default: none (tests
  /// give their own).
  Environment environment;
  /// The cluster's defaults (job/site.hpp). Default: none (tests); the process's own in current_render_context.
  SiteSettings site;
  /// The job's sweep checked against the program's knob table (resolve_sweep); without it a sweep is rendered
  /// with its values as written (unchecked_sweep).
  std::optional<ResolvedSweep> sweep;
  /// The cluster's Slurm release (job/slurm_version.hpp): flags that changed between releases follow it.
  /// Default: none (tests); --dry-run and --submit ask `sbatch --version`.
  std::optional<SlurmVersion> slurm_version;
  /// CPUs of one node of the job's partition as `sinfo` reports them, when the site file states no
  /// cores_per_node. Default: none (tests); --dry-run, --submit and --run ask sinfo (cluster_node_cpus).
  std::optional<int> sinfo_node_cpus;
};

namespace detail {
inline std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

/// A comment cannot hold a line break: one would end the comment and start a command.
inline std::string comment_safe(std::string text) {
  std::string safe;
  for (char c : text) {
    if (c == '\n') safe += "\\n";
    else if (c == '\r') safe += "\\r";
    else safe += c;
  }
  return safe;
}

/// The job name as a directory name: hostile names become harmless ones.
inline std::string directory_name(std::string_view name) {
  std::string safe;
  for (char c : name) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
    safe += ok ? c : '_';
  }
  if (safe.empty() || safe == "." || safe == "..") safe = "job";
  if (safe.size() > 64) safe.resize(64);  // a path component is at most 255 bytes; keep it readable
  return safe;
}

inline std::string join(const std::vector<std::string>& items, std::string_view separator) {
  std::string joined;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) joined += separator;
    joined += items[i];
  }
  return joined;
}
}  // namespace detail

/// The context of this process: /proc/self/exe, the current directory, now, its environment.
inline RenderContext current_render_context(int argc, char** argv, std::vector<std::string> worker_args) {
  RenderContext context;
  std::error_code ec;
  auto program = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) program = std::filesystem::absolute(argc > 0 ? argv[0] : "");
  context.program = program.string();
  for (int i = 0; i < argc; ++i) context.argv.emplace_back(argv[i]);
  context.worker_args = std::move(worker_args);
  context.workdir = std::filesystem::current_path().string();
  context.generated_at = detail::utc_now();
  context.environment = Environment::of_this_process();
  context.site = load_site_settings(
      [&shell = context.environment](const std::string& name) { return shell.get(name, EmptyValue::kept); });
  return context;
}

/// The job's working directory: Job::chdir, else the context's.
inline std::string job_workdir(const Job& job, const RenderContext& context) {
  return job.chdir() ? *job.chdir() : context.workdir;
}

/// Where the job's records and (by default) logs live: `<workdir>/hpctrain-jobs/<name>`.
inline std::filesystem::path job_root(const Job& job, const RenderContext& context) {
  return std::filesystem::path(job_workdir(job, context)) / layout::jobs_root / detail::directory_name(job.name());
}

namespace detail {
/// The user's mounts plus, unless opted out, the binary's directory and the working directory.
inline std::vector<Mount> container_mounts(const Job& job, const RenderContext& context) {
  std::vector<Mount> mounts = job.mounts();
  if (job.mount_program()) {
    const auto add = [&](const std::string& path) {
      for (const auto& m : mounts)
        if (m.target == path) return;
      Mount m{path, path, false};
      check_mount_for(job.container(), m);
      mounts.push_back(std::move(m));
    };
    add(std::filesystem::path(context.program).parent_path().string());
    add(job_workdir(job, context));
  }
  return mounts;
}

/// One variable the site's settings export (site_environment).
struct SiteVariable {
  std::string name;
  std::string value;
  std::string why;          ///< the script's comment
  bool shell_wins = false;  ///< `${NAME:-value}`: a value in the submitting shell (sbatch passes it on) wins
};

/// What the site file sets for the workers, less what the job sets itself (Job::env wins): the fabric's
/// preset, the fabric's name for rank 0's check, the expected bus bandwidth, the timeouts.
inline std::vector<SiteVariable> site_environment(const Job& job, const SiteSettings& site) {
  std::vector<SiteVariable> variables;
  for (auto& [name, value, why] : fabric_environment(site.fabric)) variables.push_back({name, value, why});
  if (site.fabric.fabric)
    variables.push_back(
        {env::fabric, std::string(to_string(*site.fabric.fabric)),
         fabric_needs_check(site.fabric.fabric) ? "rank 0 checks that NCCL uses it" : "no check: sockets"});
  if (site.fabric.expected_busbw_gbps)
    variables.push_back(
        {env::expected_busbw, fmt::format("{}", *site.fabric.expected_busbw_gbps), "for --check-fabric"});
  const std::pair<const char*, std::optional<int>> timeouts[] = {{env::rendezvous_timeout, site.rendezvous_timeout_s},
                                                                 {env::collective_timeout, site.collective_timeout_s},
                                                                 {env::checkpoint_timeout, site.checkpoint_timeout_s}};
  for (const auto& [name, seconds] : timeouts)
    if (seconds) variables.push_back({name, std::to_string(*seconds), "seconds", true});
  std::erase_if(variables, [&](const SiteVariable& variable) {  // the job's own value replaces the site's
    return std::any_of(job.environment().begin(), job.environment().end(), [&](const EnvVar& own) {
      return own.name == variable.name && own.kind != EnvKind::prepend && own.kind != EnvKind::append;
    });
  });
  return variables;
}

/// True where a path variable's entries (prepend_env, append_env) are added inside the container rather than on the
/// host: pyxis sets the image's value of a variable over the host's unless `--container-env` names it, and then the
/// host's replaces the image's; Apptainer's `%environment` does the same. Either way the image's own entries (a CUDA
/// image's LD_LIBRARY_PATH) or the job's would be lost, so the step adds the job's to what the image has
/// (path_entries_wrapper). Charliecloud passes the host's environment unchanged, as a job without a container runs.
inline bool path_entries_inside(const Job& job) {
  return std::holds_alternative<Pyxis>(job.container()) || std::holds_alternative<Apptainer>(job.container());
}

inline bool is_path_entry(const EnvVar& var) { return var.kind == EnvKind::prepend || var.kind == EnvKind::append; }

/// The variable that carries a path entry into the container (names.hpp: prepend_prefix, append_prefix).
inline std::string path_entry_carrier(const EnvVar& var) {
  return std::string(var.kind == EnvKind::prepend ? env::prepend_prefix : env::append_prefix) + var.name;
}

/// The variables the script exports for the workers: the site's (site_environment), the job's own (env,
/// pass_env, secret_env; a path entry's carrier where it is added inside the container), the run directory and,
/// with requeue_on_timeout, the requeue marker.
inline std::vector<std::string> exported_names(const Job& job, const RenderContext& context) {
  std::vector<std::string> names;
  const auto add = [&](const std::string& name) {
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  };
  for (const auto& variable : site_environment(job, context.site)) add(variable.name);
  for (const auto& var : job.environment())
    add(is_path_entry(var) && path_entries_inside(job) ? path_entry_carrier(var) : var.name);
  add(env::run_dir);
  add(env::requeue_marker);  // every job: a preempted one comes back too (preemption_restarts)
  if (job.requeue_signal() != "USR2") add(env::preempt_signal);
  return names;
}

/// Apptainer gives the image's %environment precedence over the host's variables, except for those passed
/// as APPTAINERENV_<NAME> (SINGULARITYENV_ for singularity): re-export each of ours that way.
inline std::string apptainer_env_lines(const Job& job, const std::vector<std::string>& names) {
  const auto* apptainer = std::get_if<Apptainer>(&job.container());
  if (apptainer == nullptr) return "";
  const std::string prefix = apptainer->command() == "singularity" ? "SINGULARITYENV_" : "APPTAINERENV_";
  std::string lines;
  for (const auto& name : names) lines += fmt::format("export {}{}=\"${}\"\n", prefix, name, name);
  return lines;
}

inline std::string mount_spec(const Mount& m) {
  return m.read_only ? fmt::format("{}:{}:ro", m.source, m.target) : fmt::format("{}:{}", m.source, m.target);
}

/// The words between the srun options and the binary: pyxis flags, or the runtime command.
inline std::vector<std::string> container_words(const Job& job, const RenderContext& context) {
  const auto workdir = job_workdir(job, context);
  const auto mounts = container_mounts(job, context);
  std::vector<std::string> words;
  if (const auto* pyxis = std::get_if<Pyxis>(&job.container())) {
    words.push_back("--container-image=" + pyxis->image());
    std::vector<std::string> specs;
    for (const auto& m : mounts) specs.push_back(mount_spec(m));
    if (!specs.empty()) words.push_back("--container-mounts=" + join(specs, ","));
    words.push_back("--container-workdir=" + workdir);
    words.push_back(pyxis->mount_home() ? "--container-mount-home" : "--no-container-mount-home");
    if (pyxis->writable()) words.push_back(*pyxis->writable() ? "--container-writable" : "--container-readonly");
    // The variables hpctrain exports win over the image's ENV lines (pyxis#124: without --container-env the
    // image's value wins; NeMo had NCCL settings silently ignored).
    const auto names = exported_names(job, context);
    if (!names.empty()) words.push_back("--container-env=" + join(names, ","));
    if (pyxis->name()) words.push_back("--container-name=" + *pyxis->name());
  } else if (const auto* apptainer = std::get_if<Apptainer>(&job.container())) {
    words.push_back(apptainer->command());
    words.push_back("exec");
    if (job.gpus_per_node_count() > 0) words.push_back("--nv");
    for (const auto& m : mounts) {
      words.push_back("--bind");
      words.push_back(mount_spec(m));
    }
    words.push_back("--pwd");
    words.push_back(workdir);
    for (const auto& [name, value] : apptainer->env()) {
      words.push_back("--env");
      words.push_back(name + "=" + value);
    }
    words.push_back(apptainer->image());
  } else if (const auto* charliecloud = std::get_if<Charliecloud>(&job.container())) {
    words.push_back("ch-run");
    for (const auto& m : mounts) {
      words.push_back("-b");
      words.push_back(m.source + ":" + m.target);
    }
    words.push_back("--cd");
    words.push_back(workdir);
    words.push_back(charliecloud->image());
    words.push_back("--");
  }
  return words;
}

/// Where path entries are added inside the container: `/bin/sh -c '<the additions>; exec "$@"' hpctrain ` before
/// the binary, each addition reading its entries from the carrier variable (never a user string in the script),
/// in the order the job declared them; else nothing.
inline std::string path_entries_wrapper(const Job& job) {
  if (!path_entries_inside(job)) return "";
  std::string script;
  std::vector<std::string> names;
  for (const auto& var : job.environment()) {
    if (!is_path_entry(var)) continue;
    const auto carrier = path_entry_carrier(var);
    const auto addition = var.kind == EnvKind::prepend
                              ? fmt::format("{0}=\"${1}${{{0}:+:${0}}}\"; ", var.name, carrier)
                              : fmt::format("{0}=\"${{{0}:+${0}:}}${1}\"; ", var.name, carrier);
    // Each carrier holds all of its kind's entries for the variable: one addition per variable and kind.
    if (script.find(addition) == std::string::npos) script += addition;
    if (std::find(names.begin(), names.end(), var.name) == names.end()) names.push_back(var.name);
  }
  if (names.empty()) return "";
  return fmt::format("/bin/sh -c {} hpctrain ",
                     shell_quote(fmt::format("{}export {}; exec \"$@\"", script, join(names, " "))));
}

/// `srun <options> [user srun options] [container] <binary> <marker> <forwarded args>`, one word group per line.
inline std::string srun_step(const Job& job, const RenderContext& context, std::vector<std::string> srun,
                             std::string_view marker) {
  for (const auto& [key, value] : job.srun_options())
    srun.push_back(shell_quote(value.empty() ? "--" + key : fmt::format("--{}={}", key, value)));
  std::vector<std::string> container_line;
  for (const auto& word : container_words(job, context)) container_line.push_back(shell_quote(word));
  if (!container_line.empty()) srun.push_back(join(container_line, " "));
  std::string command = path_entries_wrapper(job) + shell_quote(context.program) + " " + std::string(marker);
  for (const auto& a : context.worker_args) command += " " + shell_quote(a);
  if (job.sweep()) command += " \"${sweep_args[@]}\"";  // this task's combination (sweep_block)
  srun.push_back(command);
  return join(srun, " \\\n  ");
}

/// A sweep's combinations: task i's knob values as bash words, each quoted (a value never reaches the shell
/// unquoted); a task id that is no combination (an edited script) fails before any rank starts.
inline std::string sweep_block(const Job& job, const RenderContext& context) {
  const auto resolved = context.sweep ? *context.sweep : unchecked_sweep(*job.sweep());
  std::string block = fmt::format(
      "# Sweep: {} combinations, one per array task; task i runs with combination i's knob values.\n"
      "case \"$SLURM_ARRAY_TASK_ID\" in\n",
      resolved.combinations.size());
  for (std::size_t i = 0; i < resolved.combinations.size(); ++i) {
    std::vector<std::string> words;
    for (const auto& arg : resolved.args[i]) words.push_back(shell_quote(arg));
    block += fmt::format("  {}) sweep_args=({}) ;;  # {}\n", resolved.combinations[i].task, join(words, " "),
                         comment_safe(resolved.combinations[i].describe()));
  }
  block += fmt::format(
      "  *) echo \"hpctrain: array task $SLURM_ARRAY_TASK_ID is no combination of this sweep (0-{})\" >&2; exit 2 ;;\n"
      "esac\n",
      resolved.combinations.size() - 1);
  return block;
}

/// True when the job's sbatch or srun options name `key`.
inline bool has_option(const Job& job, std::string_view key) {
  for (const auto& [k, v] : job.sbatch_options())
    if (k == key) return true;
  for (const auto& [k, v] : job.srun_options())
    if (k == key) return true;
  return false;
}

/// The preparation step (Job::prepare): one task on one node, before training, skipped once it completed.
inline std::string preparation_block(const Job& job, const RenderContext& context) {
  std::vector<std::string> srun = {"srun --nodes=1 --ntasks=1 --exclusive --kill-on-bad-exit=1 --unbuffered"};
  if (job.cpus_per_task()) srun.push_back(fmt::format("--cpus-per-task={}", *job.cpus_per_task()));
  const auto step = srun_step(job, context, std::move(srun), prepare_flag);
  return fmt::format(
      "# Preparation (Job::prepare): one task, before any training rank starts; a requeued job skips it once\n"
      "# it completed.\n"
      "mkdir -p \"$HPCTRAIN_RUN_DIR\"\n"
      "if [ -e \"$HPCTRAIN_RUN_DIR/{done}\" ]; then\n"
      "  echo \"hpctrain: preparation already done ($HPCTRAIN_RUN_DIR/{done}); skipping it\"\n"
      "else\n"
      "  prepare_status=0\n"
      "  {step} || prepare_status=$?\n"
      "  if [ \"$prepare_status\" -ne 0 ]; then\n"
      "    echo \"hpctrain: the preparation step failed (exit $prepare_status); no training rank started\" >&2\n"
      "    exit \"$prepare_status\"\n"
      "  fi\n"
      "  touch \"$HPCTRAIN_RUN_DIR/{done}\"\n"
      "fi\n",
      fmt::arg("done", prepare_done_file), fmt::arg("step", step));
}
}  // namespace detail

namespace detail {
/// The site's variables (site_environment), before the job's own, with where they come from.
inline std::string site_block(const Job& job, const RenderContext& context) {
  const auto variables = site_environment(job, context.site);
  if (variables.empty()) return "";
  const auto& fabric = context.site.fabric;
  std::string s = fabric.fabric ? fmt::format("# Site: fabric {} ({}); the job's own variables win.\n",
                                              to_string(*fabric.fabric), comment_safe(fabric.source))
                                : "# Site settings; the job's own variables win.\n";
  for (const auto& variable : variables)
    s += variable.shell_wins
             ? fmt::format("export {0}=\"${{{0}:-{1}}}\"  # {2}; the submitting shell's value wins\n", variable.name,
                           variable.value, variable.why)
             : fmt::format("export {}={}  # {}\n", variable.name, shell_quote(variable.value), variable.why);
  return s;
}

/// The script from `set -euo pipefail` to the run directory: modules, setup lines, the job's variables.
/// Shared by the batch script (render_sbatch) and `--run`'s script (render_allocation_script).
inline std::string script_setup(const Job& job, const RenderContext& context) {
  std::string s;
  s += "\nset -euo pipefail\n";
  if (!job.modules().empty()) {
    s += "# Module scripts read unset variables.\nset +u\n";
    for (const auto& m : job.modules()) s += fmt::format("module load {}\n", shell_quote(m));
    s += "set -u\n";
  }
  for (const auto& line : job.setup_lines()) s += line + "\n";
  s += site_block(job, context);
  bool secret_comment = false;
  for (const auto& var : job.environment()) {
    switch (var.kind) {
      case EnvKind::literal: s += fmt::format("export {}={}\n", var.name, shell_quote(var.value)); break;
      case EnvKind::pass_through: {
        const auto value = context.environment.get(var.name, EmptyValue::kept);  // set empty: passed on empty
        require(value.has_value(), "env", var.name, "is not set in the submitting environment (pass_env)");
        s += fmt::format("export {}={}  # from the submitting shell\n", var.name, shell_quote(*value));
        break;
      }
      // ${NAME:+...}: nothing where NAME is unset or empty, and no error under set -u. Where the entries are added
      // inside the container, the same line builds their carrier instead (path_entries_wrapper).
      case EnvKind::prepend: {
        const auto name = path_entries_inside(job) ? path_entry_carrier(var) : var.name;
        s += fmt::format("export {0}={1}\"${{{0}:+:${0}}}\"\n", name, shell_quote(var.value));
        break;
      }
      case EnvKind::append: {
        const auto name = path_entries_inside(job) ? path_entry_carrier(var) : var.name;
        s += fmt::format("export {0}=\"${{{0}:+${0}:}}\"{1}\n", name, shell_quote(var.value));
        break;
      }
      case EnvKind::secret:
        if (!secret_comment) s += "# Secrets travel in sbatch's environment, never in this file.\n";
        secret_comment = true;
        s += fmt::format(": \"${{{0}:?hpctrain: secret {0} did not reach the job; set it where you submit}}\"\n",
                         var.name);
        break;
    }
  }

  // The run's checkpoints, metrics and TensorBoard events live beside its script and log; a requeued run
  // keeps its job id, so it finds its checkpoints again.
  if (job.array()) {
    // One run directory per task, inside the array's job directory: `<array id>/<array id>_<task id>`.
    s += "# A job array: every task has its own run directory (and log), and is requeued on its own.\n";
    s += fmt::format("export {}={}/\"$SLURM_ARRAY_JOB_ID/${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}\"\n",
                     env::run_dir, shell_quote(job_root(job, context).string()));
    s += "mkdir -p \"$HPCTRAIN_RUN_DIR\"\n";
    if (job.sweep()) s += sweep_block(job, context);
  } else {
    s += fmt::format("export {}={}/\"$SLURM_JOB_ID\"\n", env::run_dir, shell_quote(job_root(job, context).string()));
  }

  return s;
}

/// The training step's own srun options (before the job's srun_options and the container words).
inline std::vector<std::string> training_srun_options(const Job& job) {
  std::vector<std::string> srun = {"srun --kill-on-bad-exit=1 --unbuffered"};
  // Slurm 22.05's srun stopped reading SLURM_CPUS_PER_TASK from the allocation: say it again for the step. Once
  // each task's CPUs are known, each is bound to its own cores (unless the job binds them its own way): the
  // ranks' intra-op threads then follow their affinity mask (slurm/cpus.hpp) instead of competing for the node.
  if (job.cpus_per_task()) srun.push_back(fmt::format("--cpus-per-task={}", *job.cpus_per_task()));
  if (job.cpus_per_task() && !has_option(job, "cpu-bind")) srun.push_back("--cpu-bind=cores");
  if (job.requeue()) srun.push_back(fmt::format("--signal={}@{}", job.requeue_signal(), job.requeue()->grace.count()));
  return srun;
}

/// Between the setup and the training step: the preemption signal's name, Apptainer's copies of our
/// variables, the preparation step.
inline std::string script_before_step(const Job& job, const RenderContext& context) {
  std::string s;
  if (job.requeue_signal() != "USR2")  // workers default to USR2 (train/preemption.hpp)
    s += fmt::format("export HPCTRAIN_PREEMPT_SIGNAL={}\n", job.requeue_signal());
  if (std::holds_alternative<Apptainer>(job.container())) {
    auto names = exported_names(job, context);
    std::erase(names, env::requeue_marker);  // exported with the requeue block below
    s += "# Our variables win over the image's %environment.\n" + apptainer_env_lines(job, names);
  }
  if (job.preparation()) s += preparation_block(job, context);
  return s;
}
}  // namespace detail

/// The default `--output`: `<root>/%j/slurm-%j.out`, for an array `<root>/%A/slurm-%A_%a.out` (the array's
/// job directory exists before any task starts; Slurm does not create directories for logs).
inline std::string default_output_pattern(const Job& job, const RenderContext& context) {
  const auto root = job_root(job, context);
  return job.array() ? (root / "%A" / "slurm-%A_%a.out").string() : (root / "%j" / "slurm-%j.out").string();
}

/// What the script requeues: the job, or only this task of an array (`<array id>_<task id>`; requeueing
/// the array id would requeue every task, Lightning #15022).
inline std::string requeue_target(const Job& job) {
  return job.array() ? "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}" : "$SLURM_JOB_ID";
}

/// How often a job whose workers checkpointed (exit 75) is requeued: requeue_on_timeout's max_restarts, else
/// default_preemption_restarts.
inline constexpr int default_preemption_restarts = 3;
inline int preemption_restarts(const Job& job) {
  return job.requeue() ? job.requeue()->max_restarts : default_preemption_restarts;
}

/// The GPU syntax of the script: the job's (or `--gpu-syntax`), else the site's, else gpus-per-node.
inline GpuSyntax effective_gpu_syntax(const Job& job, const RenderContext& context) {
  if (job.gpu_syntax()) return *job.gpu_syntax();
  return context.site.gpu_syntax.value_or(GpuSyntax::gpus_per_node);
}

/// The default cpus_per_task of a job that states none but asks for whole nodes (exclusive, or a fabric whose
/// recipe makes it so) or GPUs: the node's CPUs (the site file's cores_per_node, else sinfo's count for the
/// partition) divided among its tasks, and where that count came from. Nothing when the job states its own, asks
/// for neither, or the node's CPUs are unknown (Slurm's default of 1 CPU per task stands then, unbound).
struct DefaultCpus {
  int cpus_per_task;
  std::string reason;  ///< for the script's header
};
inline std::optional<DefaultCpus> default_cpus_per_task(const Job& job, const RenderContext& context) {
  if (job.cpus_per_task()) return std::nullopt;
  const bool whole_nodes =
      job.exclusive() || detail::has_option(job, "exclusive") || fabric_wants_exclusive(context.site.fabric);
  if (!whole_nodes && job.gpus_per_node_count() == 0) return std::nullopt;
  const auto node = context.site.cores_per_node ? context.site.cores_per_node : context.sinfo_node_cpus;
  if (!node) return std::nullopt;
  const int cpus = std::max(1, *node / job.tasks_per_node());
  return DefaultCpus{cpus, fmt::format("{} = {} CPUs per node ({}) / {} task(s) per node, for a job on {}", cpus, *node,
                                       context.site.cores_per_node ? "the site file's cores_per_node" : "sinfo",
                                       job.tasks_per_node(), whole_nodes ? "whole nodes" : "GPUs")};
}

/// `job` with default_cpus_per_task applied.
inline Job with_default_cpus(const Job& job, const RenderContext& context) {
  Job rendered = job;
  if (const auto cpus = default_cpus_per_task(job, context)) rendered.cpus_per_task(cpus->cpus_per_task);
  return rendered;
}

/// What is valid but likely wrong: printed on stderr by --dry-run/--submit and kept as comments in the script.
inline std::vector<std::string> job_warnings(const Job& job) {
  std::vector<std::string> warnings;
  const auto has_option = [&](std::string_view key) {
    for (const auto& [k, v] : job.sbatch_options())
      if (k == key) return true;
    for (const auto& [k, v] : job.srun_options())
      if (k == key) return true;
    return false;
  };
  // Lightning #16828: per-task GPU binding gives each rank a CUDA_VISIBLE_DEVICES of its own, so ranks on a
  // node no longer see each other's GPUs: NCCL loses peer-to-peer (NVLink) between them, and code that picks
  // cuda:<local rank> finds no such device.
  for (const auto* key : {"gpus-per-task", "gpu-bind"})
    if (has_option(key))
      warnings.push_back(fmt::format(
          "--{} hides the other GPUs of a node from each rank (CUDA_VISIBLE_DEVICES per task): NCCL cannot use "
          "peer-to-peer between ranks and cuda:<local rank> does not exist (Lightning #16828); prefer "
          "gpus_per_node with one task per GPU",
          key));
  // One rank per task, one GPU per rank: fewer tasks than GPUs on a node leaves the rest idle (an example's
  // tasks_per_node(1) copied beside gpus_per_node(8)).
  if (job.gpus_per_node_count() > job.tasks_per_node())
    warnings.push_back(
        fmt::format("{} GPUs per node but {} task(s) per node: hpctrain trains one rank per task on one GPU each, so "
                    "{} GPU(s) per node "
                    "would stay idle; leave tasks_per_node unset (one task per GPU) or give --tasks-per-node {}",
                    job.gpus_per_node_count(), job.tasks_per_node(), job.gpus_per_node_count() - job.tasks_per_node(),
                    job.gpus_per_node_count()));
  return warnings;
}

namespace detail {
/// The script's first lines: the shebang, what generated it, the program and its arguments, why cpus-per-task
/// has its value, and the description's warnings (as comments, made safe for one).
inline std::string script_header(const Job& job, const RenderContext& context,
                                 const std::optional<DefaultCpus>& default_cpus) {
  std::string s = "#!/bin/bash\n";
  s += fmt::format("# Generated by hpctrain {} at {}.\n", version, context.generated_at);
  s += fmt::format("# program: {}\n", comment_safe(shell_quote(context.program)));
  std::vector<std::string> quoted_argv;
  for (const auto& a : context.argv) quoted_argv.push_back(shell_quote(a));
  s += fmt::format("# argv: {}\n", comment_safe(join(quoted_argv, " ")));
  if (default_cpus) s += fmt::format("# cpus-per-task: {}\n", default_cpus->reason);
  for (const auto& warning : job_warnings(job)) s += fmt::format("# warning: {}\n", comment_safe(warning));
  return s;
}

/// The #SBATCH lines. An sbatch_option (`--sbatch KEY=VALUE`) naming a key that has its own directive replaces it
/// in place (sbatch would silently take the last of two lines); the others follow the job's own.
inline std::string sbatch_directives(const Job& job, const RenderContext& context) {
  std::string s;
  const auto& options = job.sbatch_options();
  std::vector<bool> option_used(options.size(), false);
  const auto directive = [&](std::string_view key, std::string_view value) {
    for (std::size_t i = 0; i < options.size(); ++i)
      if (!option_used[i] && options[i].first == key) {
        option_used[i] = true;
        value = options[i].second;
      }
    s +=
        value.empty() ? fmt::format("#SBATCH --{}\n", key) : fmt::format("#SBATCH --{}={}\n", key, sbatch_quote(value));
  };
  directive("job-name", job.name());
  directive("nodes", std::to_string(job.nodes()));
  directive("ntasks-per-node", std::to_string(job.tasks_per_node()));
  if (const auto& gpus = job.gpus(); gpus && gpus->count > 0) {
    const auto count = gpus->type.empty() ? std::to_string(gpus->count) : fmt::format("{}:{}", gpus->type, gpus->count);
    if (effective_gpu_syntax(job, context) == GpuSyntax::gres) directive("gres", "gpu:" + count);
    else directive("gpus-per-node", count);
  }
  if (job.cpus_per_task()) directive("cpus-per-task", std::to_string(*job.cpus_per_task()));
  if (slurm_flags(context.slurm_version).gpus_per_task_needs_ntasks && has_option(job, "gpus-per-task") &&
      !has_option(job, "ntasks"))
    directive("ntasks", std::to_string(job.nodes() * job.tasks_per_node()));
  if (job.memory()) directive("mem", to_slurm(*job.memory()));
  if (job.memory_per_gpu()) directive("mem-per-gpu", to_slurm(*job.memory_per_gpu()));
  if (job.time()) directive("time", format_slurm_time(*job.time()));
  if (job.partition()) directive("partition", *job.partition());
  if (job.account()) directive("account", *job.account());
  if (job.qos()) directive("qos", *job.qos());
  if (job.constraint()) directive("constraint", *job.constraint());
  if (job.reservation()) directive("reservation", *job.reservation());
  if (job.exclusive() || fabric_wants_exclusive(context.site.fabric)) directive("exclusive", "");
  if (fabric_wants_all_nodes_up(context.site.fabric)) directive("wait-all-nodes", "1");
  directive("output", job.output() ? *job.output() : default_output_pattern(job, context));
  if (job.error()) directive("error", *job.error());
  if (job.mail_user()) {
    directive("mail-user", *job.mail_user());
    directive("mail-type", join(job.mail_types(), ","));
  }
  if (job.chdir()) directive("chdir", *job.chdir());
  if (!job.dependencies().empty()) {
    std::vector<std::string> parts;
    for (const auto& [type, id] : job.dependencies())
      parts.push_back(fmt::format("{}:{}", dependency_keyword(type), id));
    directive("dependency", join(parts, ","));
  }
  if (job.array()) directive("array", job.array()->text);
  // Every job may be requeued: after requeue_on_timeout's signal, after a preemption, after a failure.
  directive("requeue", "");
  directive("open-mode", "append");  // a requeued run appends to the same log
  for (std::size_t i = 0; i < options.size(); ++i)
    if (!option_used[i]) directive(options[i].first, options[i].second);
  return s;
}

/// The training step `step` and what follows its exit: a requeue after a checkpoint for a stop (the requeue
/// code or the marker file), one after a failure while max_restarts allows, else the step's status.
inline std::string step_with_requeue(const Job& job, const std::string& step) {
  std::string s;
  // A preempted job comes back whether or not it asked for requeue_on_timeout: its workers handle SIGTERM by
  // checkpointing either way (train/preemption.hpp), and a user expects the work to resume, not a FAILED job
  // (without requeue_on_timeout the script used to end with 75, and Slurm did not requeue it).
  const auto why = job.requeue()
                       ? fmt::format("{} (requeue_on_timeout) or SIGTERM\n# (preemption)", job.requeue_signal())
                       : fmt::format("SIGTERM (preemption) or {}\n# (the preemption signal)", job.requeue_signal());
  s += fmt::format(
      "# Workers exit with {code} once they checkpointed after {why}; requeue then. srun --kill-on-bad-exit "
      "reports another code (143) when one rank exits\n"
      "# first and the others are killed: a rank that checkpointed also creates the marker file, which decides\n"
      "# as well.\n"
      "export HPCTRAIN_REQUEUE_MARKER=\"$HPCTRAIN_RUN_DIR/requeue-requested\"\n"
      "{apptainer_marker}"
      "rm -f \"$HPCTRAIN_REQUEUE_MARKER\"\n",
      fmt::arg("code", exit_requeue), fmt::arg("why", why),
      fmt::arg("apptainer_marker", apptainer_env_lines(job, {env::requeue_marker})));
  // One requeue per stop. Slurm requeues a preempted job itself (PreemptMode=REQUEUE) only when it is still
  // running at the end of GraceTime, and ours are done by then (seen on Slurm 22.05: a job whose step exits
  // within the grace ends COMPLETED, Restarts=0, unless the script requeues it). Should Slurm (or an admin)
  // have begun requeueing it anyway, the job is no longer RUNNING: a second `scontrol requeue` would count a
  // second restart or fail, so the script leaves it to Slurm then.
  s += "hpctrain_requeue() {\n"
       "  local state\n"
       "  state=$(scontrol --oneliner show job \"$1\" 2>/dev/null | sed -n 's/.* JobState=\\([A-Z_]*\\).*/\\1/p' | "
       "head -n 1) || state=\"\"\n"
       "  if [ -n \"$state\" ] && [ \"$state\" != RUNNING ] && [ \"$state\" != SIGNALING ]; then\n"
       "    echo \"hpctrain: job $1 is $state: Slurm requeues it already; not requeueing it a second time\"\n"
       "    return 0\n"
       "  fi\n"
       "  scontrol requeue \"$1\" || echo \"hpctrain: scontrol requeue $1 failed (exit $?)\" >&2\n"
       "}\n";
  s += fmt::format("status=0\n{} || status=$?\n", step);
  s += fmt::format(
      "if [ \"$status\" -eq {code} ] || [ -e \"$HPCTRAIN_REQUEUE_MARKER\" ]; then\n"
      "  rm -f \"$HPCTRAIN_REQUEUE_MARKER\"\n"
      "  if [ \"${{SLURM_RESTART_COUNT:-0}}\" -lt {max} ]; then\n"
      "    echo \"hpctrain: job {target} checkpointed; requeueing (restart $(( ${{SLURM_RESTART_COUNT:-0}} + 1 )) of "
      "{max})\"\n"
      "    hpctrain_requeue \"{target}\"\n"
      "    exit 0\n"
      "  fi\n"
      "  echo \"hpctrain: job {target} checkpointed but was restarted {max} times already; not requeueing\" >&2\n"
      "  exit \"$status\"\n"
      "fi\n",
      fmt::arg("code", exit_requeue), fmt::arg("max", preemption_restarts(job)),
      fmt::arg("target", requeue_target(job)));
  if (job.max_restarts() > 0)
    s += fmt::format(
        "# max_restarts: a rank failed (any other non-zero status: an error, a signal, a lost node); requeue the\n"
        "# job to resume from its last complete checkpoint, at most {max} times (counted in the run directory).\n"
        "if [ \"$status\" -ne 0 ] && [ \"$status\" -ne {code} ]; then\n"
        "  failures=$(cat \"$HPCTRAIN_RUN_DIR/failure-restarts\" 2>/dev/null || echo 0)\n"
        "  if [ \"$failures\" -lt {max} ]; then\n"
        "    echo $(( failures + 1 )) > \"$HPCTRAIN_RUN_DIR/failure-restarts\"\n"
        "    echo \"hpctrain: job {target}: the step failed (exit $status); requeueing to resume from the last "
        "checkpoint (failure restart $(( failures + 1 )) of {max})\"\n"
        "    hpctrain_requeue \"{target}\"\n"
        "    exit 0\n"
        "  fi\n"
        "  echo \"hpctrain: job {target}: the step failed (exit $status) after {max} failure restarts; giving up\" "
        ">&2\n"
        "fi\n",
        fmt::arg("code", exit_requeue), fmt::arg("max", job.max_restarts()), fmt::arg("target", requeue_target(job)));
  s += "exit \"$status\"\n";
  return s;
}
}  // namespace detail

/// The sbatch script for `job`, byte-for-byte stable for a given context.
inline std::string render_sbatch(const Job& described, const RenderContext& context) {
  described.validate();
  detail::require(context.program.starts_with("/"), "program", context.program, "must be an absolute path");
  const auto default_cpus = default_cpus_per_task(described, context);
  const Job job = with_default_cpus(described, context);
  std::string s = detail::script_header(job, context, default_cpus);
  s += detail::sbatch_directives(job, context);
  s += detail::script_setup(job, context);
  const auto step = detail::srun_step(job, context, detail::training_srun_options(job), worker_flag);
  s += detail::script_before_step(job, context);
  s += detail::step_with_requeue(job, step);
  return s;
}

/// The script `--run` runs with bash inside an allocation (salloc, an interactive job, a batch script of the
/// user's): what the batch script would do — the job's variables, the preparation step, then one srun step —
/// without the #SBATCH directives and without requeueing (an allocation is not requeued by its shell). The
/// step is given the job's geometry explicitly, since the allocation's variables (SLURM_NTASKS...) describe
/// what the user allocated, not what the job asks for. A SIGINT or SIGTERM to the script reaches the ranks
/// as the job's preemption signal (USR2 unless requeue_signal says otherwise): they checkpoint together and stop.
inline std::string render_allocation_script(const Job& described, const RenderContext& context) {
  described.validate();
  const Job job = with_default_cpus(described, context);
  detail::require(context.program.starts_with("/"), "program", context.program, "must be an absolute path");
  std::string s = "#!/bin/bash\n";
  s += fmt::format("# Generated by hpctrain {} at {} for --run inside allocation $SLURM_JOB_ID.\n", version,
                   context.generated_at);
  s += detail::script_setup(job, context);
  auto srun = detail::training_srun_options(job);
  srun.insert(srun.begin() + 1,
              {fmt::format("--nodes={}", job.nodes()), fmt::format("--ntasks={}", job.nodes() * job.tasks_per_node()),
               fmt::format("--ntasks-per-node={}", job.tasks_per_node())});
  const auto step = detail::srun_step(job, context, std::move(srun), worker_flag);
  s += detail::script_before_step(job, context);
  // The workers' marker, as in the batch script (the container flags name it); nothing requeues on it here.
  s += "export HPCTRAIN_REQUEUE_MARKER=\"$HPCTRAIN_RUN_DIR/requeue-requested\"\n" +
       detail::apptainer_env_lines(job, {env::requeue_marker}) + "rm -f \"$HPCTRAIN_REQUEUE_MARKER\"\n";
  // In the background so that the trap runs while the step runs (bash defers traps until a foreground
  // command ends); a background command of a non-interactive shell ignores SIGINT, so a terminal's Ctrl-C
  // reaches the ranks only as the preemption signal below, once. Not SIGTERM: srun answers SIGTERM by killing
  // the step (seen on Slurm 22.05: "forcing job termination", the ranks SIGKILLed), while it forwards USR1/USR2
  // (and the other requeue signals) to every task. An interrupted `wait` leaves the status unread: wait again.
  s += fmt::format(
      "hpctrain_signalled=0\n"
      "hpctrain_interrupted=0\n"
      "hpctrain_step=\n"
      "trap 'hpctrain_signalled=1; hpctrain_interrupted=1; echo \"hpctrain: interrupted: the ranks checkpoint and "
      "stop (SIG${{HPCTRAIN_PREEMPT_SIGNAL:-USR2}} to the step)\" >&2; [ -z \"$hpctrain_step\" ] || "
      "kill -s \"${{HPCTRAIN_PREEMPT_SIGNAL:-USR2}}\" \"$hpctrain_step\" 2>/dev/null || true' INT TERM\n"
      "{step} &\n"
      "hpctrain_step=$!\n"
      "status=0\n"
      "wait \"$hpctrain_step\" || status=$?\n"
      "while [ \"$hpctrain_signalled\" -ne 0 ]; do\n"
      "  hpctrain_signalled=0\n"
      "  again=0\n"
      "  wait \"$hpctrain_step\" || again=$?\n"
      "  [ \"$again\" -eq 127 ] || status=$again\n"
      "done\n"
      "if [ \"$status\" -eq {code} ]; then\n"
      "  echo \"hpctrain: the ranks checkpointed in $HPCTRAIN_RUN_DIR and stopped; --run again in this allocation "
      "resumes there (in another allocation: --run --resume $HPCTRAIN_RUN_DIR)\" >&2\n"
      "fi\n"
      "if [ \"$hpctrain_interrupted\" -ne 0 ]; then exit 130; fi\n"
      "exit \"$status\"\n",
      fmt::arg("step", step), fmt::arg("code", exit_requeue));
  return s;
}

}  // namespace hpctrain
