#pragma once
// Renders a Job as an sbatch script. The script stays on the host: `#SBATCH` directives, modules,
// setup lines and exports, then one `srun` step that starts this same binary in worker mode, inside
// the container when there is one. Every user string is quoted for the language of its line (bash, or
// sbatch's directive parser); only `setup` lines are raw shell, by design.
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/job/container.hpp>
#include <hpctrain/job/job.hpp>
#include <hpctrain/job/shell.hpp>
#include <hpctrain/job/units.hpp>
#include <hpctrain/names.hpp>  // worker_flag, the job-directory layout
#include <hpctrain/version.hpp>

namespace hpctrain {

/// Everything a rendering needs besides the Job: fixed by tests, taken from the process otherwise.
struct RenderContext {
  std::string program;                     ///< absolute path of the binary the step runs
  std::vector<std::string> argv;           ///< the login-node invocation, for the header comment
  std::vector<std::string> worker_args;    ///< forwarded to the workers after the marker
  std::string workdir;                     ///< absolute; the job's working directory unless Job::chdir
  std::string generated_at;                ///< header timestamp
  /// Looks up the submitting shell's variables (pass_env). Default: std::getenv.
  std::function<std::optional<std::string>(const std::string&)> lookup_env;
};

namespace detail {
inline std::optional<std::string> process_env(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

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
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '-' || c == '.';
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

/// The context of this process: /proc/self/exe, the current directory, now, std::getenv.
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
  context.lookup_env = detail::process_env;
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
    // The job's variables win over the image's ENV lines.
    std::vector<std::string> names;
    for (const auto& var : job.environment()) names.push_back(var.name);
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
}  // namespace detail

/// The sbatch script for `job`, byte-for-byte stable for a given context.
inline std::string render_sbatch(const Job& job, const RenderContext& context) {
  job.validate();
  detail::require(context.program.starts_with("/"), "program", context.program, "must be an absolute path");
  std::string s = "#!/bin/bash\n";
  s += fmt::format("# Generated by hpctrain {} at {}.\n", version, context.generated_at);
  s += fmt::format("# program: {}\n", detail::comment_safe(shell_quote(context.program)));
  std::vector<std::string> quoted_argv;
  for (const auto& a : context.argv) quoted_argv.push_back(shell_quote(a));
  s += fmt::format("# argv: {}\n", detail::comment_safe(detail::join(quoted_argv, " ")));

  const auto directive = [&](std::string_view key, std::string_view value) {
    s += value.empty() ? fmt::format("#SBATCH --{}\n", key) : fmt::format("#SBATCH --{}={}\n", key, sbatch_quote(value));
  };
  directive("job-name", job.name());
  directive("nodes", std::to_string(job.nodes()));
  directive("ntasks-per-node", std::to_string(job.tasks_per_node()));
  if (const auto& gpus = job.gpus(); gpus && gpus->count > 0)
    directive("gpus-per-node", gpus->type.empty() ? std::to_string(gpus->count)
                                                   : fmt::format("{}:{}", gpus->type, gpus->count));
  if (job.cpus_per_task()) directive("cpus-per-task", std::to_string(*job.cpus_per_task()));
  if (job.memory()) directive("mem", to_slurm(*job.memory()));
  if (job.memory_per_gpu()) directive("mem-per-gpu", to_slurm(*job.memory_per_gpu()));
  if (job.time()) directive("time", format_slurm_time(*job.time()));
  if (job.partition()) directive("partition", *job.partition());
  if (job.account()) directive("account", *job.account());
  if (job.qos()) directive("qos", *job.qos());
  if (job.constraint()) directive("constraint", *job.constraint());
  if (job.reservation()) directive("reservation", *job.reservation());
  if (job.exclusive()) directive("exclusive", "");
  directive("output", job.output() ? *job.output() : (job_root(job, context) / "%j" / "slurm-%j.out").string());
  if (job.error()) directive("error", *job.error());
  if (job.mail_user()) {
    directive("mail-user", *job.mail_user());
    directive("mail-type", detail::join(job.mail_types(), ","));
  }
  if (job.chdir()) directive("chdir", *job.chdir());
  if (!job.dependencies().empty()) {
    std::vector<std::string> parts;
    for (const auto& [type, id] : job.dependencies()) parts.push_back(fmt::format("{}:{}", detail::dependency_keyword(type), id));
    directive("dependency", detail::join(parts, ","));
  }
  if (job.requeue()) {
    directive("requeue", "");
    directive("open-mode", "append");  // a requeued run appends to the same log
  }
  for (const auto& [key, value] : job.sbatch_options()) directive(key, value);

  s += "\nset -euo pipefail\n";
  if (!job.modules().empty()) {
    s += "# Module scripts read unset variables.\nset +u\n";
    for (const auto& m : job.modules()) s += fmt::format("module load {}\n", shell_quote(m));
    s += "set -u\n";
  }
  for (const auto& line : job.setup_lines()) s += line + "\n";
  bool secret_comment = false;
  for (const auto& var : job.environment()) {
    switch (var.kind) {
      case EnvKind::literal:
        s += fmt::format("export {}={}\n", var.name, shell_quote(var.value));
        break;
      case EnvKind::pass_through: {
        const auto lookup = context.lookup_env ? context.lookup_env : detail::process_env;
        const auto value = lookup(var.name);
        detail::require(value.has_value(), "env", var.name, "is not set in the submitting environment (pass_env)");
        s += fmt::format("export {}={}  # from the submitting shell\n", var.name, shell_quote(*value));
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
  s += fmt::format("export {}={}/\"$SLURM_JOB_ID\"\n", env::run_dir, shell_quote(job_root(job, context).string()));

  std::vector<std::string> srun = {"srun --kill-on-bad-exit=1 --unbuffered"};
  // Slurm 22.05's srun stopped reading SLURM_CPUS_PER_TASK from the allocation: say it again for the step.
  if (job.cpus_per_task()) srun.push_back(fmt::format("--cpus-per-task={}", *job.cpus_per_task()));
  if (job.requeue()) srun.push_back(fmt::format("--signal=USR2@{}", job.requeue()->grace.count()));
  for (const auto& [key, value] : job.srun_options())
    srun.push_back(shell_quote(value.empty() ? "--" + key : fmt::format("--{}={}", key, value)));
  std::vector<std::string> container_line;
  for (const auto& word : detail::container_words(job, context)) container_line.push_back(shell_quote(word));
  if (!container_line.empty()) srun.push_back(detail::join(container_line, " "));
  std::string command = shell_quote(context.program) + " " + std::string(worker_flag);
  for (const auto& a : context.worker_args) command += " " + shell_quote(a);
  srun.push_back(command);
  const auto step = detail::join(srun, " \\\n  ");

  if (!job.requeue()) {
    s += step + "\n";
    return s;
  }
  const int max = job.requeue()->max_restarts;
  s += fmt::format(
      "# Workers exit with {code} once they checkpointed after USR2 (requeue_on_timeout); requeue then.\n"
      "# srun --kill-on-bad-exit reports another code (143) when one rank exits first and the others are\n"
      "# killed: a rank that checkpointed also creates the marker file, which decides as well.\n"
      "export HPCTRAIN_REQUEUE_MARKER=\"$HPCTRAIN_RUN_DIR/requeue-requested\"\n"
      "rm -f \"$HPCTRAIN_REQUEUE_MARKER\"\n"
      "status=0\n"
      "{step} || status=$?\n"
      "if [ \"$status\" -eq {code} ] || [ -e \"$HPCTRAIN_REQUEUE_MARKER\" ]; then\n"
      "  rm -f \"$HPCTRAIN_REQUEUE_MARKER\"\n"
      "  if [ \"${{SLURM_RESTART_COUNT:-0}}\" -lt {max} ]; then\n"
      "    echo \"hpctrain: job $SLURM_JOB_ID checkpointed; requeueing (restart $(( ${{SLURM_RESTART_COUNT:-0}} + 1 )) of {max})\"\n"
      "    scontrol requeue \"$SLURM_JOB_ID\"\n"
      "    exit 0\n"
      "  fi\n"
      "  echo \"hpctrain: job $SLURM_JOB_ID checkpointed but was restarted {max} times already; not requeueing\" >&2\n"
      "fi\n"
      "exit \"$status\"\n",
      fmt::arg("code", exit_requeue), fmt::arg("step", step), fmt::arg("max", max));
  return s;
}

}  // namespace hpctrain
