#pragma once
// A preparation step in the same job (seed 002 runs `srun --exclusive -n 1 preprocess.sh` before
// training): the program registers a callable with `Job::prepare`; the generated script runs this same
// binary once, on one task, as its own srun step (`<binary> --hpctrain-prepare <forwarded args>`) before the
// training step. When the step succeeds the script creates `$HPCTRAIN_RUN_DIR/prepare.done`, so a requeued
// job (same job id, same run directory) skips it; when it fails, the script exits with its status and no
// training rank starts.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/names.hpp>

namespace hpctrain {

/// The first argument the generated script gives the binary for the preparation step.
inline constexpr std::string_view prepare_flag = "--hpctrain-prepare";

/// The file in the run directory that says the preparation completed (created by the script).
inline constexpr std::string_view prepare_done_file = "prepare.done";

/// What a preparation callable knows about its job.
struct PrepareContext {
  std::string job_id;                ///< `SLURM_JOB_ID` (`local` under `--local`)
  std::string task_id;               ///< `SLURM_ARRAY_TASK_ID`, empty outside an array
  int restart_count = 0;             ///< `SLURM_RESTART_COUNT`: > 0 when a requeued job prepares again
  std::filesystem::path run_dir;     ///< `HPCTRAIN_RUN_DIR`: the run's directory, shared by the workers
  std::filesystem::path output_dir;  ///< `<run_dir>/prepare`, created before the call: put results here
  std::vector<std::string> args;     ///< the arguments forwarded to the workers (training knobs)
  Knobs knobs;  ///< the knob table with this run's values, in a program with one (hpctrain::run); else empty
  Environment environment;  ///< the step's environment, as the script gave it (HPCTRAIN_STAGE: the stage it prepares)
};

/// Runs once per job before the training step; throws to fail the job (its message goes to the log).
using PrepareFunction = std::function<void(const PrepareContext&)>;
/// A preparation's checks on the login node, with this command's knob values: a SpecError refuses the command
/// (exit 2) before anything is written or queued.
using PrepareLoginCheck = std::function<void(const Knobs&)>;

/// A preparation step whose inputs may come from knobs (`--data`): what runs in the job, and what the login node
/// checks first.
struct PrepareStep {
  PrepareFunction run;
  PrepareLoginCheck check_at_login;
};

/// True when argv carries the preparation marker as its first argument.
inline bool is_prepare_invocation(int argc, char** argv) { return argc >= 2 && argv[1] == prepare_flag; }

/// The context of a preparation step from the environment the script gives it (`environment`, the step's).
inline PrepareContext prepare_context_from_environment(Environment environment, std::vector<std::string> args) {
  PrepareContext context;
  context.job_id = environment.get("SLURM_JOB_ID").value_or("local");
  context.task_id = environment.get("SLURM_ARRAY_TASK_ID").value_or("");
  try {
    context.restart_count = std::stoi(environment.get("SLURM_RESTART_COUNT").value_or("0"));
  } catch (const std::exception&) {
    context.restart_count = 0;
  }
  const auto run_dir = environment.get(env::run_dir).value_or("");
  if (run_dir.empty())
    throw RuntimeError(errors::runtime_prepare,
                       "HPCTRAIN_RUN_DIR is not set: the preparation step runs from the generated script");
  context.run_dir = run_dir;
  context.output_dir = context.run_dir / layout::prepare_output;
  context.args = std::move(args);
  context.environment = std::move(environment);
  return context;
}

/// In a training rank: where the job's preparation step left its results. `$HPCTRAIN_PREPARE_DIR` where
/// `--local` set it (the preparation ran once in `hpctrain-jobs/<name>/local`, and each local run has a run
/// directory of its own), else `$HPCTRAIN_RUN_DIR/prepare`, as `environment` (the rank's) says; nothing outside a job.
inline std::optional<std::filesystem::path> prepared_output_dir(const Environment& environment) {
  if (auto dir = environment.get(env::prepare_dir)) return std::filesystem::path(*dir);
  if (auto run_dir = environment.get(env::run_dir)) return std::filesystem::path(*run_dir) / layout::prepare_output;
  return std::nullopt;
}

/// Runs `prepare` for this process (the `--hpctrain-prepare` step): creates the output directory, calls it,
/// and maps failures to exit codes (a SpecError or UsageError: 2, anything else: 1) with the message on stderr.
inline int run_preparation(const PrepareFunction& prepare, const PrepareContext& context) {
  try {
    if (!prepare)
      throw RuntimeError(errors::runtime_prepare, "the script asked for a preparation step but the job registers none");
    std::filesystem::create_directories(context.output_dir);
    prepare(context);
    return exit_ok;
  } catch (const SpecError& error) {
    std::fprintf(stderr, "hpctrain: preparation failed: %s\n", error.what());
    return exit_usage;
  } catch (const UsageError& error) {
    std::fprintf(stderr, "hpctrain: preparation failed: %s\n", error.what());
    return exit_usage;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "hpctrain: preparation failed: %s\n", error.what());
    return exit_failure;
  }
}

}  // namespace hpctrain
