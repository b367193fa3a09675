#pragma once
// The one call a user's main makes: checks the training description and its knob table, then dispatches on
// the mode — login-node commands (--dry-run, --submit, --status, ...) through job/, worker mode to the
// training loop. The knob table travels from here into the job layer, which never sees a Training.
#include <iostream>
#include <string>
#include <vector>

#include <hpctrain/compiled_runtime.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/job/cli.hpp>
#include <hpctrain/job/job.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/job/spec_error_exit.hpp>
#include <hpctrain/train/training.hpp>
#include <hpctrain/train/worker.hpp>

namespace hpctrain {

/// Runs the program described by `job` and `training` for this command line; returns the exit code.
HPCTRAIN_RUNTIME_INLINE int run(int argc, char** argv, const Job& job, const Training& training);

#if HPCTRAIN_RUNTIME_DEFINITIONS
HPCTRAIN_RUNTIME_INLINE int run(int argc, char** argv, const Job& job, const Training& training) {
  install_spec_error_exit();  // from here on, a SpecError that escapes exits 2 with its message
  Knobs knobs;
  try {
    training.validate();  // a broken description fails here, before anything is submitted
    knobs = training_knobs(training, job.name());  // a bare --wandb logs to the project named after the job
  } catch (const SpecError& error) {
    std::cerr << error.what() << "\n";
    return exit_usage;
  }
  Planner planner;
  if (training.memory_planner())
    planner = [&training](const Knobs& values, const PlanRequest& request, std::ostream& out) {
      return training.memory_planner()(training, values, request, out);
    };
  return run_job(argc, argv, job, knobs, [&training](const Knobs& values) { return run_worker(training, values); },
                 [&training](const Knobs& values) { training.check_at_login(values); }, planner);
}
#endif

}  // namespace hpctrain
