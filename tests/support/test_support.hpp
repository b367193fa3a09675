#pragma once
// What the tests of every folder share (torch-free): the message of an hpctrain error, and running a command
// with its stdout and stderr captured — through hpctrain::run_process, the library's one fork/exec.
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

/// A finished command: exit code (128 + signal when killed), stdout, stderr.
using CommandResult = hpctrain::ProcessResult;

/// Runs `command` (looked up in PATH, no shell) and captures its two streams.
inline CommandResult run_command(const std::vector<std::string>& command) { return hpctrain::run_process(command); }

}  // namespace hpctrain::test
