#pragma once
// The job description: what `sbatch` and `srun` are asked for. Options are plain data with chained
// setters (as torch::nn options are); every setter checks its value at once and throws SpecError naming
// the field and the value, so a wrong description fails before anything is rendered or submitted.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/job/array.hpp>
#include <hpctrain/job/container.hpp>
#include <hpctrain/job/prepare.hpp>
#include <hpctrain/job/shell.hpp>
#include <hpctrain/job/site.hpp>
#include <hpctrain/job/spec_error_exit.hpp>  // install_spec_error_exit(): a SpecError escaping main exits 2
#include <hpctrain/job/sweep.hpp>
#include <hpctrain/job/units.hpp>

namespace hpctrain {

/// GPUs per node, with an optional type (`a100:4`).
struct GpuRequest {
  std::string type;  ///< empty: any type
  int count = 0;
};

/// How an environment variable reaches the workers.
enum class EnvKind {
  literal,       ///< `export NAME=value` in the script
  pass_through,  ///< the submitting shell's value, written into the script at render time
  secret,        ///< travels in sbatch's environment only; the script checks it arrived, never holds it
  prepend,       ///< the value before the variable's own, ':' between (a path list: LD_LIBRARY_PATH, PATH)
  append,        ///< the value after the variable's own, ':' between
};

/// One environment variable of the job.
struct EnvVar {
  std::string name;
  std::string value;  ///< empty for pass_through and secret
  EnvKind kind = EnvKind::literal;
};

/// Slurm dependency types (`--dependency=<type>:<id>`).
enum class After { ok, any, not_ok, start };

/// Requeue on time limit: signal the step `grace` before the end, requeue when it checkpointed.
struct RequeuePolicy {
  std::chrono::seconds grace{0};
  int max_restarts = 0;
};

namespace detail {
inline bool is_env_name(std::string_view name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}
inline bool is_option_key(std::string_view key) {
  if (key.empty() || key[0] == '-') return false;
  for (char c : key)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
      return false;
  return true;
}
inline void require_directive_value(std::string_view field, std::string_view value) {
  require(!value.empty(), field, "\"\"", "must not be empty");
  require(fits_on_one_line(value), field, value, "an #SBATCH value cannot hold a newline or NUL");
}
inline std::string_view dependency_keyword(After type) {
  switch (type) {
    case After::ok: return "afterok";
    case After::any: return "afterany";
    case After::not_ok: return "afternotok";
    case After::start: return "after";
  }
  return "afterok";
}
}  // namespace detail

/// A Slurm job: resources, placement, container, environment and the escape hatches.
class Job {
 public:
  /// `name` becomes `--job-name` and the job directory `hpctrain-jobs/<name>/`.
  explicit Job(std::string name) { this->name(std::move(name)); }

  /// `--job-name`. Any characters but a newline.
  Job& name(std::string value) {
    detail::require_directive_value("name", value);
    name_ = std::move(value);
    return *this;
  }
  /// `--nodes`. Default: 1.
  Job& nodes(int count) {
    detail::require(count >= 1, "nodes", count, "must be at least 1");
    nodes_ = count;
    return *this;
  }
  /// `--ntasks-per-node`. Default: GPUs per node when GPUs are requested, else 1.
  Job& tasks_per_node(int count) {
    detail::require(count >= 1, "tasks_per_node", count, "must be at least 1");
    tasks_per_node_ = count;
    return *this;
  }
  /// `--gpus-per-node=<count>`; 0 requests none. Default: none.
  Job& gpus_per_node(int count) { return gpus_per_node("", count); }
  /// `--gpus-per-node=<type>:<count>`.
  Job& gpus_per_node(std::string type, int count) {
    detail::require(count >= 0, "gpus_per_node", count, "must not be negative");
    detail::require(type.empty() || count > 0, "gpus_per_node", type, "a GPU type needs a count (a100:4)");
    detail::require(type.find_first_of(" \t\n\r:,\"'\\#") == std::string::npos, "gpus_per_node", type,
                    "a GPU type is one word");
    gpus_ = GpuRequest{std::move(type), count};
    return *this;
  }
  /// `--gpus-per-node` from text: `4` or `a100:4`.
  Job& gpus_per_node(std::string_view spec) {
    const auto colon = spec.rfind(':');
    long long count = 0;
    if (colon == std::string_view::npos) {
      detail::require(detail::parse_unsigned(spec, count), "gpus_per_node", spec, "a GPU type needs a count (a100:4)");
      return gpus_per_node(static_cast<int>(count));
    }
    detail::require(detail::parse_unsigned(spec.substr(colon + 1), count), "gpus_per_node", spec,
                    "a GPU type needs a count (a100:4)");
    return gpus_per_node(std::string(spec.substr(0, colon)), static_cast<int>(count));
  }
  /// How the GPU request is written: `--gpus-per-node=[type:]N` or `--gres=gpu[:type]:N`.
  /// Default: the site's (`HPCTRAIN_GPU_SYNTAX`, the site file; job/site.hpp), else gpus-per-node.
  Job& gpu_syntax(GpuSyntax syntax) {
    gpu_syntax_ = syntax;
    return *this;
  }
  /// Same, from text: `gpus-per-node` or `gres`.
  Job& gpu_syntax(std::string_view syntax) { return gpu_syntax(parse_gpu_syntax(syntax)); }
  /// `--cpus-per-task`. Default: Slurm's (1).
  Job& cpus_per_task(int count) {
    detail::require(count >= 1, "cpus_per_task", count, "must be at least 1");
    cpus_per_task_ = count;
    return *this;
  }
  /// `--mem`: memory per node. Default: the partition's.
  Job& memory(Memory amount) {
    detail::require(amount.mebibytes > 0, "memory", to_slurm(amount), "must be positive");
    detail::require(!memory_per_gpu_, "memory", to_slurm(amount), "memory_per_gpu is already set; pick one");
    memory_ = amount;
    return *this;
  }
  /// `--mem-per-gpu`. Default: none.
  Job& memory_per_gpu(Memory amount) {
    detail::require(amount.mebibytes > 0, "memory_per_gpu", to_slurm(amount), "must be positive");
    detail::require(!memory_, "memory_per_gpu", to_slurm(amount), "memory (per node) is already set; pick one");
    memory_per_gpu_ = amount;
    return *this;
  }
  /// `--time` in D-HH:MM:SS. Default: the partition's.
  template <class Rep, class Period>
  Job& time(std::chrono::duration<Rep, Period> limit) {
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(limit);
    detail::require(seconds.count() > 0, "time", fmt::format("{}s", seconds.count()), "must be positive");
    time_ = seconds;
    return *this;
  }
  /// `--partition`.
  Job& partition(std::string value) { return set_directive("partition", partition_, std::move(value)); }
  /// `--account`.
  Job& account(std::string value) { return set_directive("account", account_, std::move(value)); }
  /// `--qos`.
  Job& qos(std::string value) { return set_directive("qos", qos_, std::move(value)); }
  /// `--constraint` (node features, e.g. `a100&ib`).
  Job& constraint(std::string value) { return set_directive("constraint", constraint_, std::move(value)); }
  /// `--reservation`.
  Job& reservation(std::string value) { return set_directive("reservation", reservation_, std::move(value)); }
  /// `--exclusive`. Default: false.
  Job& exclusive(bool on = true) {
    exclusive_ = on;
    return *this;
  }
  /// `--output` pattern (`%j.out`). Default: `hpctrain-jobs/<name>/%j/slurm-%j.out` in the working directory.
  Job& output(std::string pattern) { return set_directive("output", output_, std::move(pattern)); }
  /// `--error` pattern. Default: with the output.
  Job& error(std::string pattern) { return set_directive("error", error_, std::move(pattern)); }
  /// `--mail-user` and `--mail-type` (BEGIN, END, FAIL, REQUEUE, ALL, TIME_LIMIT_80...).
  Job& mail(std::string user, std::vector<std::string> types) {
    detail::require_directive_value("mail_user", user);
    static constexpr std::string_view known[] = {
        "NONE",      "BEGIN",      "END",           "FAIL",          "REQUEUE",       "ALL",        "INVALID_DEPEND",
        "STAGE_OUT", "TIME_LIMIT", "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS"};
    detail::require(!types.empty(), "mail_type", "\"\"", "name at least one of BEGIN, END, FAIL, ALL...");
    for (const auto& type : types) {
      bool ok = false;
      for (auto k : known) ok = ok || type == k;
      detail::require(ok, "mail_type", type, "expected BEGIN, END, FAIL, REQUEUE, ALL, TIME_LIMIT[_50|_80|_90]...");
    }
    mail_user_ = std::move(user);
    mail_types_ = std::move(types);
    return *this;
  }
  /// `--chdir`: the working directory of the job (and of the container). Default: where it is submitted.
  Job& chdir(std::string directory) {
    set_directive("chdir", chdir_, std::move(directory));
    detail::require(chdir_->starts_with("/"), "chdir", *chdir_, "must be an absolute path");
    return *this;
  }
  /// `--dependency=<type>:<job id>`; several are joined with `,` (all must hold).
  Job& after(std::string job_id, After type = After::ok) {
    long long id = 0;
    detail::require(detail::parse_unsigned(job_id, id) && id > 0, "dependency", job_id, "expected a job id");
    dependencies_.emplace_back(type, std::move(job_id));
    return *this;
  }
  /// Before the time limit, send USR2 to the step `grace` early; workers checkpoint and exit with
  /// exit_requeue, and the script requeues the job, at most `max_restarts` times.
  template <class Rep, class Period>
  Job& requeue_on_timeout(std::chrono::duration<Rep, Period> grace, int max_restarts = 3) {
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(grace);
    detail::require(seconds.count() > 0 && seconds.count() <= 65535, "requeue_on_timeout",
                    fmt::format("{}s", seconds.count()), "the grace must be between 1 s and 65535 s (srun --signal)");
    detail::require(max_restarts >= 1, "requeue_on_timeout.max_restarts", max_restarts, "must be at least 1");
    requeue_ = RequeuePolicy{seconds, max_restarts};
    return *this;
  }
  /// The signal sent `grace` before the time limit (`srun --signal=<name>@grace`): USR2, USR1, URG, ALRM, HUP,
  /// INT. Default: USR2 (NCCL may use USR1). Workers also treat SIGTERM, a preempting partition's signal, alike.
  Job& requeue_signal(std::string name) {
    if (name.starts_with("SIG")) name.erase(0, 3);
    static constexpr std::string_view known[] = {"USR2", "USR1", "URG", "ALRM", "HUP", "INT"};
    bool ok = false;
    for (auto k : known) ok = ok || name == k;
    detail::require(ok, "requeue_signal", name, "expected USR2, USR1, URG, ALRM, HUP or INT");
    requeue_signal_ = std::move(name);
    return *this;
  }
  /// When the step fails (a rank exits non-zero other than exit_requeue, is killed, or loses its node),
  /// requeue the job to resume from its last complete checkpoint, at most `count` times (like torchrun
  /// --max-restarts); the log says why. Default: 0 (a failure ends the job).
  Job& max_restarts(int count) {
    detail::require(count >= 0 && count <= 100, "max_restarts", count, "must be between 0 and 100");
    max_restarts_ = count;
    return *this;
  }
  /// `export NAME=value` in the script (quoted; the value arrives byte for byte).
  Job& env(std::string name, std::string value) {
    check_env(name, value);
    env_.push_back({std::move(name), std::move(value), EnvKind::literal});
    return *this;
  }
  /// `entry` put before what the variable holds where the job runs, ':' between (the entry alone where it is unset
  /// or empty): a library or program directory that must win over the node's, `prepend_env("LD_LIBRARY_PATH",
  /// "/opt/amazon/efa/lib")`, without replacing the path list the node's modules and the site set up.
  Job& prepend_env(std::string name, std::string entry) {
    return add_path_entry(std::move(name), std::move(entry), EnvKind::prepend);
  }
  /// `entry` put after what the variable holds where the job runs, ':' between (the entry alone where it is unset).
  Job& append_env(std::string name, std::string entry) {
    return add_path_entry(std::move(name), std::move(entry), EnvKind::append);
  }
  /// Pass the submitting shell's value of `name` (read when the script is rendered).
  Job& pass_env(std::string name) {
    check_env(name, "");
    env_.push_back({std::move(name), "", EnvKind::pass_through});
    return *this;
  }
  /// A secret from the submitting environment: it reaches the workers through sbatch's environment and
  /// is never written into the script or the job directory.
  Job& secret_env(std::string name) {
    check_env(name, "");
    env_.push_back({std::move(name), "", EnvKind::secret});
    return *this;
  }
  /// `module load <name>` before the step.
  Job& module(std::string name) {
    detail::require(!name.empty() && name.find_first_of(" \t\n\r") == std::string::npos, "module", name,
                    "a module name is one word");
    modules_.push_back(std::move(name));
    return *this;
  }
  /// A raw shell line run before the step: the one place where the user writes shell. Not quoted.
  Job& setup(std::string line) {
    detail::require(line.find('\0') == std::string::npos, "setup", "<NUL>", "a setup line cannot hold NUL");
    setup_.push_back(std::move(line));
    return *this;
  }
  /// Any other sbatch option: `#SBATCH --<key>=<value>`, or `--<key>` when value is empty. A key that has its
  /// own directive (`time`, `partition`, `nodes`...) replaces that directive's value on its line.
  Job& sbatch_option(std::string key, std::string value = "") {
    detail::require(detail::is_option_key(key), "sbatch_option", key, "expected an option name without dashes");
    detail::require(fits_on_one_line(value), "sbatch_option", value, "an #SBATCH value cannot hold a newline");
    for (auto& [existing, existing_value] : sbatch_options_)
      if (existing == key) {  // the later value wins, on one line
        existing_value = std::move(value);
        return *this;
      }
    sbatch_options_.emplace_back(std::move(key), std::move(value));
    return *this;
  }
  /// Any other srun option: `--<key>=<value>` (quoted), or `--<key>` when value is empty.
  Job& srun_option(std::string key, std::string value = "") {
    detail::require(detail::is_option_key(key), "srun_option", key, "expected an option name without dashes");
    detail::require(value.find('\0') == std::string::npos, "srun_option", key, "a value cannot hold NUL");
    srun_options_.emplace_back(std::move(key), std::move(value));
    return *this;
  }
  /// The container the step runs in. Default: none.
  Job& container(Container runtime) {
    for (const auto& m : mounts_) detail::check_mount_for(runtime, m);
    container_ = std::move(runtime);
    return *this;
  }
  /// Make host `source` visible at `target` inside the container.
  Job& mount(std::string source, std::string target) {
    return add_mount({std::move(source), std::move(target), false});
  }
  /// Same, read-only.
  Job& mount(std::string source, std::string target, ReadOnly) {
    return add_mount({std::move(source), std::move(target), true});
  }
  /// Mount the binary's directory and the working directory at the same paths inside. Default: true.
  Job& mount_program(bool on) {
    mount_program_ = on;
    return *this;
  }

  /// `--array=<spec>`: a job array (`0-15`, `1,3,5`, `0-30:10`, `0-15%4`), one task per id; each task gets its
  /// own log and run directory, and a requeue targets the task only (job/array.hpp).
  Job& array(std::string_view spec) {
    array_ = parse_array_spec(spec);
    return *this;
  }
  /// A hyper-parameter sweep: one array task per combination (`--array=0-<n-1>[%max_parallel]`, generated); each
  /// task's workers get that combination's knob values. An explicit `array(...)`/`--array` still applies (a
  /// throttle, or a subset of the tasks to run again) when its ids are combinations (job/sweep.hpp).
  Job& sweep(Sweep sweep) {
    sweep_array_ = sweep.array();
    sweep_ = std::move(sweep);
    return *this;
  }
  /// A preparation step: `prepare` runs once per job, on one task (`srun -N1 -n1 --exclusive`), before the
  /// training step; a requeued job skips it once it completed; when it throws, the job fails before any
  /// training rank starts (job/prepare.hpp).
  Job& prepare(PrepareFunction function) {
    detail::require(static_cast<bool>(function), "prepare", "<empty function>", "needs a callable");
    prepare_ = std::move(function);
    prepare_check_ = {};
    return *this;
  }
  /// The same, with the checks the login node runs on this command's knob values before anything is queued.
  Job& prepare(PrepareStep step) {
    prepare(std::move(step.run));
    prepare_check_ = std::move(step.check_at_login);
    return *this;
  }

  /// A later stage of this program (SFT after pretraining, evaluation after training): `--submit` submits this
  /// job and then every stage as a job of its own, with its own resources, each `afterok` the one before, so a
  /// stage starts only when the previous one completed successfully. The stage's workers find its name in
  /// HPCTRAIN_STAGE (current_stage(), job/chain.hpp). A stage's own stages are not followed.
  Job& then(Job stage) {
    for (const auto& existing : stages_)
      detail::require(existing.name() != stage.name(), "then", stage.name(),
                      "every stage of a chain needs a name of its own (its job directory and HPCTRAIN_STAGE)");
    detail::require(stage.name() != name_, "then", stage.name(),
                    "every stage of a chain needs a name of its own (its job directory and HPCTRAIN_STAGE)");
    stage.stages_.clear();
    stages_.push_back(std::move(stage));
    return *this;
  }

  /// Checks what only the whole description can tell; render_sbatch calls it.
  void validate() const {
    if (memory_per_gpu_)
      detail::require(gpus_ && gpus_->count > 0, "memory_per_gpu", to_slurm(*memory_per_gpu_), "needs gpus_per_node");
    if (requeue_ && time_)
      detail::require(requeue_->grace < *time_, "requeue_on_timeout", fmt::format("{}s", requeue_->grace.count()),
                      fmt::format("the grace must be shorter than the time limit ({})", format_slurm_time(*time_)));
    detail::require(!(std::holds_alternative<NoContainer>(container_) && !mounts_.empty()), "mount",
                    mounts_.empty() ? "" : mounts_.front().source, "mounts need a container");
    if (sweep_ && array_)
      detail::require(array_->max_index() < static_cast<int>(sweep_->size()), errors::spec_sweep,
                      fmt::format("--array={}", array_->text),
                      fmt::format("task {} has no combination: the sweep has {} (0-{})", array_->max_index(),
                                  sweep_->size(), sweep_->size() - 1));
  }

  const std::string& name() const { return name_; }
  int nodes() const { return nodes_; }
  /// The effective tasks per node (the default resolved).
  int tasks_per_node() const {
    return tasks_per_node_ ? *tasks_per_node_ : (gpus_ && gpus_->count > 0 ? gpus_->count : 1);
  }
  const std::optional<GpuRequest>& gpus() const { return gpus_; }
  int gpus_per_node_count() const { return gpus_ ? gpus_->count : 0; }
  /// The syntax the program chose; empty: the site's default.
  const std::optional<GpuSyntax>& gpu_syntax() const { return gpu_syntax_; }
  const std::optional<int>& cpus_per_task() const { return cpus_per_task_; }
  const std::optional<Memory>& memory() const { return memory_; }
  const std::optional<Memory>& memory_per_gpu() const { return memory_per_gpu_; }
  const std::optional<std::chrono::seconds>& time() const { return time_; }
  const std::optional<std::string>& partition() const { return partition_; }
  const std::optional<std::string>& account() const { return account_; }
  const std::optional<std::string>& qos() const { return qos_; }
  const std::optional<std::string>& constraint() const { return constraint_; }
  const std::optional<std::string>& reservation() const { return reservation_; }
  bool exclusive() const { return exclusive_; }
  const std::optional<std::string>& output() const { return output_; }
  const std::optional<std::string>& error() const { return error_; }
  const std::optional<std::string>& mail_user() const { return mail_user_; }
  const std::vector<std::string>& mail_types() const { return mail_types_; }
  const std::optional<std::string>& chdir() const { return chdir_; }
  const std::vector<std::pair<After, std::string>>& dependencies() const { return dependencies_; }
  const std::optional<RequeuePolicy>& requeue() const { return requeue_; }
  const std::vector<EnvVar>& environment() const { return env_; }
  const std::vector<std::string>& modules() const { return modules_; }
  const std::vector<std::string>& setup_lines() const { return setup_; }
  const std::vector<std::pair<std::string, std::string>>& sbatch_options() const { return sbatch_options_; }
  const std::vector<std::pair<std::string, std::string>>& srun_options() const { return srun_options_; }
  const Container& container() const { return container_; }
  const std::vector<Mount>& mounts() const { return mounts_; }
  bool mount_program() const { return mount_program_; }
  const std::string& requeue_signal() const { return requeue_signal_; }
  int max_restarts() const { return max_restarts_; }
  /// The array spec: the one set, else the sweep's; empty for a single job.
  const std::optional<ArraySpec>& array() const { return array_ ? array_ : sweep_array_; }
  /// The sweep; empty without one.
  const std::optional<Sweep>& sweep() const { return sweep_; }
  /// The preparation callable; empty without one.
  const PrepareFunction& preparation() const { return prepare_; }
  /// The preparation's login-node checks; empty without any.
  const PrepareLoginCheck& preparation_check() const { return prepare_check_; }
  /// The later stages (then), in order; empty for a single job.
  const std::vector<Job>& stages() const { return stages_; }
  /// This job alone, its stages left out.
  Job without_stages() const {
    Job alone = *this;
    alone.stages_.clear();
    return alone;
  }

 private:
  Job& set_directive(std::string_view field, std::optional<std::string>& slot, std::string value) {
    detail::require_directive_value(field, value);
    slot = std::move(value);
    return *this;
  }
  Job& add_mount(Mount m) {
    detail::check_mount_for(container_, m);
    mounts_.push_back(std::move(m));
    return *this;
  }
  Job& add_path_entry(std::string name, std::string entry, EnvKind kind) {
    check_env(name, entry);
    detail::require(!entry.empty(), "env", name,
                    fmt::format("{}: the entry is empty (an empty entry of a path list is the current directory)",
                                kind == EnvKind::prepend ? "prepend_env" : "append_env"));
    env_.push_back({std::move(name), std::move(entry), kind});
    return *this;
  }
  static void check_env(std::string_view name, std::string_view value) {
    detail::require(detail::is_env_name(name), "env", name, "an environment variable name is [A-Za-z_][A-Za-z0-9_]*");
    detail::require(value.find('\0') == std::string_view::npos, "env", name, "a value cannot hold NUL");
  }

  std::string name_;
  int nodes_ = 1;
  std::optional<int> tasks_per_node_;
  std::optional<GpuRequest> gpus_;
  std::optional<GpuSyntax> gpu_syntax_;
  std::optional<int> cpus_per_task_;
  std::optional<Memory> memory_, memory_per_gpu_;
  std::optional<std::chrono::seconds> time_;
  std::optional<std::string> partition_, account_, qos_, constraint_, reservation_;
  bool exclusive_ = false;
  std::optional<std::string> output_, error_, mail_user_;
  std::vector<std::string> mail_types_;
  std::optional<std::string> chdir_;
  std::vector<std::pair<After, std::string>> dependencies_;
  std::optional<RequeuePolicy> requeue_;
  std::vector<EnvVar> env_;
  std::vector<std::string> modules_, setup_;
  std::vector<std::pair<std::string, std::string>> sbatch_options_, srun_options_;
  Container container_ = NoContainer{};
  std::vector<Mount> mounts_;
  bool mount_program_ = true;
  PrepareFunction prepare_;
  PrepareLoginCheck prepare_check_;
  std::optional<ArraySpec> array_, sweep_array_;
  std::optional<Sweep> sweep_;
  std::string requeue_signal_ = "USR2";
  int max_restarts_ = 0;
  std::vector<Job> stages_;  // a vector of the incomplete Job: allowed since C++17
};

}  // namespace hpctrain
