#pragma once
// The one call a user's main makes: checks the training description, then dispatches on the mode —
// login-node commands (--dry-run, --submit, --status, ...) through job/, worker mode to the training loop.
#include <iostream>
#include <string>
#include <vector>

#include <hpctrain/error.hpp>
#include <hpctrain/job/cli.hpp>
#include <hpctrain/job/job.hpp>
#include <hpctrain/train/training.hpp>
#include <hpctrain/train/worker.hpp>

namespace hpctrain {

/// Runs the program described by `job` and `training` for this command line; returns the exit code.
inline int run(int argc, char** argv, const Job& job, const Training& training) {
  try {
    training.validate();  // a broken description fails here, before anything is submitted
  } catch (const SpecError& error) {
    std::cerr << error.what() << "\n";
    return exit_usage;
  }
  return run_job(argc, argv, job, [&training](const std::vector<std::string>& args) { return run_worker(training, args); });
}

}  // namespace hpctrain
