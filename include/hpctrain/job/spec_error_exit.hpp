#pragma once
// A user's main builds its Job (and Training) before it calls run(): a SpecError thrown by a setter there
// escapes main. Without this, it would end in std::terminate and abort (exit 134, maybe a core file);
// the command-line contract says "exit 2 and name the field". Any program that includes the job layer
// gets a terminate handler that turns an uncaught SpecError or UsageError into its message and exit 2,
// and leaves every other case to the handler that was there before.
#include <cstdio>
#include <cstdlib>
#include <exception>

#include <hpctrain/error.hpp>

namespace hpctrain::detail {

inline std::terminate_handler previous_terminate_handler = nullptr;

[[noreturn]] inline void exit_on_uncaught_spec_error() {
  if (const auto current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const SpecError& error) {
      std::fprintf(stderr, "%s\n", error.what());
      std::_Exit(exit_usage);
    } catch (const UsageError& error) {
      std::fprintf(stderr, "%s\n", error.what());
      std::_Exit(exit_usage);
    } catch (...) {
    }
  }
  if (previous_terminate_handler != nullptr) previous_terminate_handler();
  std::abort();
}

/// Installed once per program, before main, by whichever translation unit initializes it first.
inline const bool spec_error_exit_installed = [] {
  previous_terminate_handler = std::set_terminate(exit_on_uncaught_spec_error);
  return true;
}();

}  // namespace hpctrain::detail
