#pragma once
// Runs Slurm's commands (sbatch, squeue, sacct, scontrol, scancel) by fork/exec with an argv vector:
// no shell ever sees a user string, so nothing in a job name or value can be executed. And starts this program
// again in its own process with another environment (restart_this_program).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hpctrain/error.hpp>
#include <hpctrain/files.hpp>
#include <hpctrain/names.hpp>

namespace hpctrain {

/// What a finished command left: its exit code (128 + signal when killed) and its two streams.
struct ProcessResult {
  int exit_code = 0;
  std::string out;
  std::string err;
};

namespace detail {
inline void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}
/// `argv` (or an environment's entries) as exec takes it: pointers into the strings, null-terminated. Built before
/// fork: only async-signal-safe calls may follow it in the child.
inline std::vector<char*> exec_arguments(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  return args;
}

/// In a forked child: tells the parent `error` (an errno) through the close-on-exec pipe and exits 127.
[[noreturn]] inline void report_exec_failure(int exec_pipe, int error) {
  [[maybe_unused]] auto n = ::write(exec_pipe, &error, sizeof error);
  ::_exit(127);
}

/// The exit code (128 + signal when killed) of child `pid`, started by fork + execvp after a close-on-exec pipe
/// whose read end is `exec_pipe`: the child writes its errno there when the exec fails, and that is a
/// RuntimeError(errors::runtime_exec) naming `program`.
inline int wait_for_exec(pid_t pid, int exec_pipe, const std::string& program) {
  int exec_error = 0;
  const bool exec_failed = ::read(exec_pipe, &exec_error, sizeof exec_error) == sizeof exec_error;
  ::close(exec_pipe);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (exec_failed)
    throw RuntimeError(errors::runtime_exec, fmt::format("cannot run {}: {}", program, std::strerror(exec_error)));
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
}  // namespace detail

/// Runs `argv` (looked up in PATH) with `extra_env` added to this process's environment and the variables
/// named in `removed_env` removed, in `working_directory` when given; collects stdout and stderr. Throws
/// RuntimeError(errors::runtime_exec, ...) when the program cannot be started.
inline ProcessResult run_process(const std::vector<std::string>& argv,
                                 const std::vector<std::pair<std::string, std::string>>& extra_env = {},
                                 const std::string& working_directory = "",
                                 const std::vector<std::string>& removed_env = {}) {
  if (argv.empty()) throw RuntimeError(errors::runtime_exec, "empty command");
  auto environment = Environment::of_this_process();
  for (const auto& name : removed_env) environment.remove(name);
  for (const auto& [name, value] : extra_env) environment.set(name, value);
  int out_pipe[2], err_pipe[2], exec_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0 || ::pipe2(exec_pipe, O_CLOEXEC) != 0)
    throw RuntimeError(errors::runtime_exec, fmt::format("pipe: {}", std::strerror(errno)));
  const auto args = detail::exec_arguments(argv);
  const auto entries = environment.entries();
  const auto envp = detail::exec_arguments(entries);
  const pid_t pid = ::fork();
  if (pid < 0) throw RuntimeError(errors::runtime_exec, fmt::format("fork: {}", std::strerror(errno)));
  if (pid == 0) {
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    if (!working_directory.empty() && ::chdir(working_directory.c_str()) != 0)
      detail::report_exec_failure(exec_pipe[1], errno);
    ::execvpe(args[0], args.data(), envp.data());
    detail::report_exec_failure(exec_pipe[1], errno);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  ::close(exec_pipe[1]);
  ProcessResult result;
  int fds[2] = {out_pipe[0], err_pipe[0]};
  std::string* sinks[2] = {&result.out, &result.err};
  while (fds[0] >= 0 || fds[1] >= 0) {
    pollfd polled[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
    if (::poll(polled, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i] < 0 || polled[i].revents == 0) continue;
      char buffer[4096];
      const auto n = ::read(fds[i], buffer, sizeof buffer);
      if (n > 0) sinks[i]->append(buffer, static_cast<std::size_t>(n));
      else if (n == 0 || errno != EINTR) detail::close_fd(fds[i]);
    }
  }
  result.exit_code = detail::wait_for_exec(pid, exec_pipe[0], argv[0]);
  return result;
}

/// Runs `argv` (looked up in PATH) on this process's own stdin, stdout and stderr — a command whose progress the
/// user watches (`wandb sync`), `--local`'s preparation step — with `environment` (default: this process's), and
/// returns its exit code (128 + signal when killed). Throws RuntimeError(errors::runtime_exec, ...) when the
/// program cannot be started.
inline int run_attached(const std::vector<std::string>& argv,
                        const Environment& environment = Environment::of_this_process()) {
  if (argv.empty()) throw RuntimeError(errors::runtime_exec, "empty command");
  int exec_pipe[2];
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0)
    throw RuntimeError(errors::runtime_exec, fmt::format("pipe: {}", std::strerror(errno)));
  const auto args = detail::exec_arguments(argv);
  const auto entries = environment.entries();
  const auto envp = detail::exec_arguments(entries);
  const pid_t pid = ::fork();
  if (pid < 0) throw RuntimeError(errors::runtime_exec, fmt::format("fork: {}", std::strerror(errno)));
  if (pid == 0) {
    ::execvpe(args[0], args.data(), envp.data());
    detail::report_exec_failure(exec_pipe[1], errno);
  }
  ::close(exec_pipe[1]);
  return detail::wait_for_exec(pid, exec_pipe[0], argv[0]);
}

/// This program's own command line, as the kernel keeps it (/proc/self/cmdline): what it was started with, argv[0]
/// included, whatever main did to its argv since.
inline std::vector<std::string> this_program_arguments() {
  const auto text = detail::read_file("/proc/self/cmdline", errors::runtime_exec);
  std::vector<std::string> args;
  for (std::size_t begin = 0; begin < text.size();) {
    const auto end = text.find('\0', begin);
    args.push_back(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return args;
}

/// Replaces this process by this very program (/proc/self/exe, so a binary rebuilt or moved since still runs as
/// itself), started again with its own arguments and `environment`: the same pid, so Slurm's step and its signals
/// keep it. How a rank hands a library that reads its configuration from the process's environment only when it
/// initialises (NCCL) a setting it was not started with, without setting a variable in a running process. Returns
/// only by throwing RuntimeError(errors::runtime_exec, ...) when the exec fails.
[[noreturn]] inline void restart_this_program(const Environment& environment) {
  const auto arguments = this_program_arguments();
  const auto args = detail::exec_arguments(arguments);
  const auto entries = environment.entries();
  const auto envp = detail::exec_arguments(entries);
  std::fflush(stdout);
  std::fflush(stderr);
  ::execve("/proc/self/exe", args.data(), envp.data());
  throw RuntimeError(errors::runtime_exec,
                     fmt::format("cannot start {} again: {}", arguments.empty() ? "this program" : arguments[0],
                                 std::strerror(errno)));
}

}  // namespace hpctrain
