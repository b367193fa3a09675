#pragma once
// The names that cross layers: the login side (job/), the launchers (the sbatch script, slurm/'s --local)
// and the workers (train/) agree on them here, once. Torch-free, standard library only.
#include <cmath>  // HUGE_VAL
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <unistd.h>  // environ (_GNU_SOURCE): read by Environment::of_this_process alone

namespace hpctrain {

/// The first argument that the generated script (and `--local`) gives the binary: it enters worker mode
/// (DESIGN.md: an explicit marker, never a guess from SLURM_* variables).
inline constexpr std::string_view worker_flag = "--hpctrain-worker";

/// `--resume DIR`, first among the workers' arguments when a run starts from another's checkpoints
/// (job/run_placement.hpp).
inline constexpr std::string_view resume_flag = "--resume";

/// True when argv carries the worker marker as its first argument.
inline bool is_worker_invocation(int argc, char** argv) { return argc >= 2 && argv[1] == worker_flag; }

/// Environment variables set by a launcher for the workers.
namespace env {
/// The run's directory: checkpoints, metrics.jsonl, TensorBoard events. Set by the script
/// (`<job directory>`, i.e. `hpctrain-jobs/<name>/$SLURM_JOB_ID`) and by `--local` (a new directory per run).
inline constexpr const char* run_dir = "HPCTRAIN_RUN_DIR";
/// With requeue_on_timeout, the script exports this variable: a worker that checkpointed for a requeue
/// creates the file it names (rank 0 suffices) before it exits with exit_requeue.
inline constexpr const char* requeue_marker = "HPCTRAIN_REQUEUE_MARKER";
/// Set (to 1) by `--local`: the ranks come from torchrun's variables, not from Slurm's.
inline constexpr const char* local = "HPCTRAIN_LOCAL";
/// The signal Slurm sends before a preemption or the time limit when it is not SIGUSR2 (Job::requeue_signal):
/// exported by the script, read by the workers' preemption handler (train/preemption.hpp).
inline constexpr const char* preempt_signal = "HPCTRAIN_PREEMPT_SIGNAL";
/// Seconds a rendezvous waits for the other ranks before failing (default 300, dist::Options). Read by the
/// worker; the site file (`rendezvous_timeout_s`), or the submitting shell (sbatch passes it on), sets it.
inline constexpr const char* rendezvous_timeout = "HPCTRAIN_RENDEZVOUS_TIMEOUT_S";
/// Seconds one collective of the training (a gradient all-reduce, a barrier) may wait for its peers (default:
/// the rendezvous timeout's default, 300). Site file `collective_timeout_s`.
inline constexpr const char* collective_timeout = "HPCTRAIN_COLLECTIVE_TIMEOUT_S";
/// Seconds the ranks wait for each other around a checkpoint's writing (its files on a slow file system)
/// (default 300). Site file `checkpoint_timeout_s`.
inline constexpr const char* checkpoint_timeout = "HPCTRAIN_CHECKPOINT_TIMEOUT_S";
/// A directory of text files the examples train on instead of Debian's fortunes (text::default_corpus).
inline constexpr const char* corpus = "HPCTRAIN_CORPUS";
/// GPT-2's tokenizer file elsewhere than ~/.cache/hpctrain/gpt2.tiktoken (text::gpt2_tokenizer).
inline constexpr const char* gpt2_tokenizer = "HPCTRAIN_GPT_TOKENIZER";
/// The RoBERTa tokenizer.json elsewhere than ~/.cache/hpctrain/roberta-fortunes/ (text::roberta_tokenizer).
inline constexpr const char* roberta_tokenizer = "HPCTRAIN_ROBERTA_TOKENIZER";
/// Where Job::prepare left its results when that is not `$HPCTRAIN_RUN_DIR/prepare`: set by `--local`, whose
/// preparation runs once in `hpctrain-jobs/<name>/local` while each run gets its own `local-<time>` directory.
inline constexpr const char* prepare_dir = "HPCTRAIN_PREPARE_DIR";
/// The name of the chain stage (Job::then) a job's workers run: set by each stage's script.
inline constexpr const char* stage = "HPCTRAIN_STAGE";
/// The run directories of the stages before this one, a line `<stage>=<directory>` each: set by a later stage's
/// script (and by `--local` for a chain), read through stage_dir("sft") (job/setting.hpp).
inline constexpr const char* stage_dirs = "HPCTRAIN_STAGE_DIRS";
/// The site's network (site file `fabric`: efa, infiniband or ethernet), exported by the script: rank 0 checks
/// that NCCL uses it (job/nccl_network.hpp).
inline constexpr const char* fabric = "HPCTRAIN_FABRIC";
/// 1: a job whose NCCL fell back to TCP sockets on an efa or infiniband site runs anyway, with a warning
/// (`--allow-socket-fallback`).
inline constexpr const char* allow_socket_fallback = "HPCTRAIN_ALLOW_SOCKET_FALLBACK";
/// The bus bandwidth in GB/s the site expects of its fabric (site file `expected_busbw_gbps`): --check-fabric
/// prints its measurement against it.
inline constexpr const char* expected_busbw = "HPCTRAIN_EXPECTED_BUSBW_GBPS";
/// Set by `--check-fabric`: the workers run an all-reduce sweep up to this many bytes instead of training.
inline constexpr const char* check_fabric = "HPCTRAIN_CHECK_FABRIC_MAX_BYTES";
/// Set by `--check-fabric-min-fraction F`: the check exits 1 when the slowest group across nodes reaches less than F
/// of the fabric's bus bandwidth (the site's expected_busbw_gbps, else the preset's: job/fabric.hpp).
inline constexpr const char* check_fabric_min_fraction = "HPCTRAIN_CHECK_FABRIC_MIN_FRACTION";
/// Seconds after a SIGTERM without a completed step before the termination watchdog ends a rank (default 30).
inline constexpr const char* term_stall_seconds = "HPCTRAIN_TERM_STALL_SECONDS";
/// The site file's path (job/site.hpp), else `~/.config/hpctrain/site.toml`.
inline constexpr const char* site_config = "HPCTRAIN_SITE_CONFIG";
/// How a GPU request is written, `gpus-per-node` or `gres` (job/site.hpp), over the site file's.
inline constexpr const char* gpu_syntax = "HPCTRAIN_GPU_SYNTAX";
/// Under pyxis and Apptainer, whose images' own values of a variable win or are replaced, a path variable's entries
/// (Job::prepend_env, append_env) travel in `HPCTRAIN_PREPEND_<NAME>` / `HPCTRAIN_APPEND_<NAME>` and are added
/// to the image's value inside the container (job/render.hpp, path_entries_inside).
inline constexpr std::string_view prepend_prefix = "HPCTRAIN_PREPEND_";
inline constexpr std::string_view append_prefix = "HPCTRAIN_APPEND_";
/// The test seams: variables the tests and benches set to simulate or measure what this machine cannot run or a
/// user's run does not report (docs/seams.md, "Test seams"). A job never needs them; each is read in one place.
namespace test_seam {
/// Every rank's collectives cross a simulated link of this many GB/s of bus bandwidth, one after another
/// (dist/simulated_link.hpp), and --plan of a CPU job states its step time at that link: what checks the plan's step
/// time on a machine without a cluster's links.
inline constexpr const char* simulated_link = "HPCTRAIN_SIMULATED_LINK_GBPS";
/// With simulated_link: the TFLOP/s this CPU reaches on the planned model (measured at one rank), which --plan of a
/// CPU job computes at.
inline constexpr const char* plan_cpu_tflops = "HPCTRAIN_PLAN_CPU_TFLOPS";
/// Set: the Trainer restarts each rank's peak-memory count before the hooks at the end, so that `time` reports
/// theirs (bench/export_memory.sh).
inline constexpr const char* measure_finish_hooks = "HPCTRAIN_MEASURE_FINISH_HOOKS";
/// Set: `--float8` runs on any device with its products emulated (the same float8 quantisation, the products in
/// fp32: models/kernels/float8_projections.hpp) instead of being refused off a CUDA GPU of compute capability 8.9: how
/// the CPU tests run a Trainer in float8.
inline constexpr const char* float8_emulated = "HPCTRAIN_FLOAT8_EMULATED";
}  // namespace test_seam
}  // namespace env

/// Whether a variable set to the empty string counts as set (`kept`: pass_env and secret_env, which export what
/// the shell has, empty or not) or as unset (`unset`: every setting).
enum class EmptyValue { unset, kept };

/// An environment as a value: this process's, read whole here (the one reader of the process's environment: the
/// library has no getenv), and what a child is started with (the job's environment under `--local`, a Slurm
/// command's without this job's SLURM_*), built before fork and given to exec. It is read where a process begins
/// (worker mode in run_job, the login command's RenderContext, the preparation step) and passed down as a value; the
/// library never sets a variable in its own process (a rank that must give NCCL a setting starts again with it:
/// job/nccl_network.hpp).
class Environment {
 public:
  /// This process's environment now, in its order.
  static Environment of_this_process() {
    Environment environment;
    for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
      const std::string_view text(*entry);
      const auto equals = text.find('=');
      if (equals != std::string_view::npos)
        environment.variables_.emplace_back(std::string(text.substr(0, equals)), std::string(text.substr(equals + 1)));
    }
    return environment;
  }

  /// The value of `name`, or nothing when it is not set (or empty, unless `empty` keeps it), as getenv reads it.
  std::optional<std::string> get(std::string_view name, EmptyValue empty = EmptyValue::unset) const {
    for (const auto& [variable, value] : variables_)
      if (variable == name) return value.empty() && empty == EmptyValue::unset ? std::nullopt : std::optional(value);
    return std::nullopt;
  }
  /// Sets `name` (in its place when it is set, else last).
  Environment& set(std::string_view name, std::string value) {
    for (auto& [variable, old] : variables_)
      if (variable == name) {
        old = std::move(value);
        return *this;
      }
    variables_.emplace_back(std::string(name), std::move(value));
    return *this;
  }
  Environment& remove(std::string_view name) {
    std::erase_if(variables_, [&](const auto& variable) { return variable.first == name; });
    return *this;
  }
  /// The variables, name and value, in order.
  const std::vector<std::pair<std::string, std::string>>& variables() const { return variables_; }
  /// `NAME=value` for each variable, as exec takes them.
  std::vector<std::string> entries() const {
    std::vector<std::string> entries;
    for (const auto& [name, value] : variables_) entries.push_back(name + "=" + value);
    return entries;
  }

 private:
  std::vector<std::pair<std::string, std::string>> variables_;
};

/// The number above 0 that variable `name` holds, nothing when it is unset; for any other value, what
/// `refuse(value)` throws (each caller its own error: a test switch is a spec error, a job's setting a runtime one).
template <class Refuse>
std::optional<double> positive_number_from_environment(const Environment& environment, const std::string& name,
                                                       Refuse refuse) {
  const auto text = environment.get(name);
  if (!text) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text->c_str(), &end);
  if (end != text->c_str() + text->size() || !(value > 0) || value == HUGE_VAL) refuse(*text);
  return value;
}

/// The layout of what a program keeps under its working directory.
namespace layout {
/// `<workdir>/hpctrain-jobs/<job name>/`: one directory per program (job name).
inline constexpr std::string_view jobs_root = "hpctrain-jobs";
/// Inside it, `<job id>/` per submitted job (job.sbatch, job.json, the log, and the run's files) and
/// `local-<UTC time>/` per `--local` run; `last` names the last submitted job.
inline constexpr std::string_view local_run_prefix = "local-";
/// The directory of a run directory where Job::prepare leaves its results (PrepareContext::output_dir).
inline constexpr std::string_view prepare_output = "prepare";
inline constexpr std::string_view last_job_file = "last";
inline constexpr std::string_view job_script = "job.sbatch";
inline constexpr std::string_view job_record = "job.json";
/// Inside a run directory: the checkpoints a run resumes from.
inline constexpr std::string_view checkpoints = "checkpoints";
/// Inside a run directory: W&B's offline runs (`wandb/offline-run-<time>-<id>/`, what `wandb sync` uploads),
/// written by the W&B logger (train/loggers/wandb.hpp) and found by `--wandb-sync` (job/wandb_sync.hpp).
inline constexpr std::string_view wandb = "wandb";
/// The prefix of an offline run's directory, as wandb names it.
inline constexpr std::string_view wandb_offline_run_prefix = "offline-run-";
/// The run directory of a worker started without a launcher (no HPCTRAIN_RUN_DIR): `<cwd>/hpctrain-run`.
inline constexpr std::string_view default_run = "hpctrain-run";

/// True when `run_directory/checkpoints` holds anything: the run can be resumed (the checkpoint format is
/// the training layer's; a corrupt one is skipped there with a warning).
inline bool has_checkpoints(const std::filesystem::path& run_directory) {
  std::error_code error;
  const auto directory = run_directory / checkpoints;
  if (!std::filesystem::is_directory(directory, error)) return false;
  return std::filesystem::directory_iterator(directory, error) != std::filesystem::directory_iterator();
}
}  // namespace layout

}  // namespace hpctrain
