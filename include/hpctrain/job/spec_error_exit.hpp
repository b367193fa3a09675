#pragma once
// A user's main builds its Job (and Training) before it calls run(): a SpecError thrown by a setter there
// escapes main and would end in std::terminate and abort (exit 134, maybe a core file), while the
// command-line contract says "exit 2 and name the field". `install_spec_error_exit()` installs a terminate
// handler that turns an uncaught SpecError or UsageError into its message and exit 2, and leaves every
// other case to the handler that was there before (a runtime failure that escapes main, or a terminate for
// another reason, still aborts with its core file: a bug to look at). Whatever the program does, a program
// that can call hpctrain::run or run_job has it installed before main starts (job/cli.hpp), so a wrong
// setter exits 2 whether or not main calls anything first.
#include <cstdio>
#include <cstdlib>
#include <exception>

#include <hpctrain/error.hpp>

namespace hpctrain {

namespace detail {
inline std::terminate_handler previous_terminate_handler = nullptr;
inline bool spec_error_exit_installed = false;

[[noreturn]] inline void exit_on_uncaught_spec_error() {
  if (const auto current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const std::exception& error) {
      if (exit_code_of(error) == exit_usage) {
        std::fprintf(stderr, "%s\n", error.what());
        std::_Exit(exit_usage);
      }
    } catch (...) {
    }
  }
  if (previous_terminate_handler != nullptr) previous_terminate_handler();
  std::abort();
}
}  // namespace detail

/// From now on, a SpecError or UsageError that escapes main prints its message and exits 2. A program that
/// includes job/cli.hpp (run_job) or run.hpp has it from before main; calling it again does nothing.
inline void install_spec_error_exit() {
  if (detail::spec_error_exit_installed) return;
  detail::previous_terminate_handler = std::set_terminate(detail::exit_on_uncaught_spec_error);
  detail::spec_error_exit_installed = true;
}

}  // namespace hpctrain
