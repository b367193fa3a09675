#pragma once
// What the tests of every folder share (torch-free): the message of an hpctrain error, and running a command
// with its stdout and stderr captured — through hpctrain::run_process, the library's one fork/exec.
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <hpctrain/error.hpp>
#include <hpctrain/job/process.hpp>

namespace hpctrain::test {

/// The message of the hpctrain::Error that `action` throws, or "(no error)".
inline std::string message_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const hpctrain::Error& error) {
    return error.what();
  }
  return "(no error)";
}

/// How many times `needle` occurs in `text`, without overlaps.
inline std::size_t count_occurrences(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

/// A finished command: exit code (128 + signal when killed), stdout, stderr.
using CommandResult = hpctrain::ProcessResult;

/// Runs `command` (looked up in PATH, no shell) and captures its two streams.
inline CommandResult run_command(const std::vector<std::string>& command) { return hpctrain::run_process(command); }

#ifdef HPCTRAIN_PRINT_WORLD
/// Path of tests/slurm/programs/print_world (tests/integration/CMakeLists.txt defines it for test_slurm).
inline std::string print_world_program() { return HPCTRAIN_PRINT_WORLD; }
#endif

}  // namespace hpctrain::test
