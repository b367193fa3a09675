#pragma once
// The one call a user's main makes: checks the training description and its knob table, then dispatches on
// the mode — login-node commands (--dry-run, --submit, --status, ...) through job/, worker mode to the
// training loop. The knob table travels from here into the job layer, which never sees a Training.
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <hpctrain/compiled_runtime.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/job/job.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/job/run_placement.hpp>
#include <hpctrain/train/training.hpp>
#if HPCTRAIN_RUNTIME_DEFINITIONS  // the command line and the worker: not parsed by a program that links the runtime
#include <hpctrain/job/cli.hpp>
#include <hpctrain/job/spec_error_exit.hpp>
#include <hpctrain/train/batch_fit.hpp>
#include <hpctrain/train/worker.hpp>
#endif

namespace hpctrain {

/// Runs the program described by `job` and `training` for this command line; returns the exit code.
HPCTRAIN_RUNTIME_INLINE int run(int argc, char** argv, const Job& job, const Training& training);

#if HPCTRAIN_RUNTIME_DEFINITIONS
namespace detail {
/// `job` with the Training's data preparation (lm::sft_jsonl's tokenization) in its preparation step, after the
/// job's own, read with the knob values the step is given (run_job gives them).
inline Job with_data_preparation(const Job& job, const Training& training) {
  if (!training.prepares_data()) return job;
  Job prepared = job;
  prepared.prepare(PrepareStep{[own = job.preparation(), &training](const PrepareContext& context) {
                                 if (own) own(context);
                                 training.prepare_data(context.knobs, context.output_dir);
                               },
                               job.preparation_check()});
  return prepared;
}
}  // namespace detail

HPCTRAIN_RUNTIME_INLINE int run(int argc, char** argv, const Job& job, const Training& training) {
  Knobs knobs;
  const int refused = with_exit_codes([&] {
    training.validate();                           // a broken description fails here, before anything is submitted
    knobs = training_knobs(training, job.name());  // a bare --wandb logs to the project named after the job
    return exit_ok;
  });
  if (refused != exit_ok) return refused;
  Planner planner;
  if (training.memory_planner())
    planner = [&training](const Knobs& values, const PlanRequest& request, std::ostream& out) {
      return training.memory_planner()(training, values, request, out);
    };
  return run_job(
      argc, argv, detail::with_data_preparation(job, training), knobs,
      [&training](const Knobs& values, const RunPlacement& placement) {
        return run_worker(training, values, placement);
      },
      [&training](const Knobs& values, const LoginCheckFacts& facts) {
        check_training_at_login(training, values, facts);
      },
      planner);
}
#endif

}  // namespace hpctrain
