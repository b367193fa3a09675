#pragma once
// `./train --local N`: N copies of the binary on this machine with torchrun's rank variables, like
// `torchrun --standalone --nproc-per-node N`. fork/exec, never a shell. Each child leads its own process
// group so that a stop reaches whatever it started too; the launcher forwards SIGINT/SIGTERM, and the first
// rank to fail decides the exit code and stops the others (SIGTERM, then SIGKILL after a grace).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/names.hpp>

namespace hpctrain {

/// How launch_local stops ranks.
struct LocalLaunchOptions {
  /// Time between SIGTERM (or a forwarded SIGINT) and SIGKILL. Default: 10 s.
  std::chrono::milliseconds grace{std::chrono::seconds(10)};
  /// The ranks' HPCTRAIN_RUN_DIR. Default: the launcher's HPCTRAIN_RUN_DIR, else `<cwd>/hpctrain-jobs/local`.
  /// (The login command gives every `--local` run a new one.)
  std::optional<std::filesystem::path> run_directory;
  /// The ranks' HPCTRAIN_PREPARE_DIR: where the job's preparation left its results (job/prepare.hpp). Default:
  /// the launcher's own, if any.
  std::optional<std::filesystem::path> prepare_directory;
  /// The environment the ranks start from, before their rank variables (`--local`: the job's, as its script
  /// exports it). Default: this process's.
  std::optional<Environment> environment;
};

namespace detail {

// A port nobody listens on now: bind port 0 and ask the kernel which one it chose. Rank 0 binds it again a
// moment later (the usual small race torchrun --standalone also accepts).
inline int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw RuntimeError(errors::runtime_local_launch, fmt::format("socket: {}", std::strerror(errno)));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  const int saved = errno;
  ::close(fd);
  if (!ok)
    throw RuntimeError(errors::runtime_local_launch, fmt::format("cannot find a free port: {}", std::strerror(saved)));
  return ntohs(address.sin_port);
}

// `base` (the job's environment) with the rank's own variables, which replace any of the same name.
inline std::vector<std::string> rank_environment(Environment base, int rank, int world_size, int master_port,
                                                 const std::string& run_dir,
                                                 const std::optional<std::filesystem::path>& prepare_dir) {
  base.set("RANK", std::to_string(rank));
  base.set("LOCAL_RANK", std::to_string(rank));
  base.set("WORLD_SIZE", std::to_string(world_size));
  base.set("LOCAL_WORLD_SIZE", std::to_string(world_size));
  base.set("GROUP_RANK", "0");
  base.set("MASTER_ADDR", "127.0.0.1");
  base.set("MASTER_PORT", std::to_string(master_port));
  base.set(env::local, "1");
  base.set(env::run_dir, run_dir);
  if (prepare_dir) base.set(env::prepare_dir, prepare_dir->string());
  return base.entries();
}

inline std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (auto& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// Shell convention for a child's status: its exit code, or 128 + the signal that ended it.
inline int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return exit_failure;
}

// Blocks SIGCHLD/SIGINT/SIGTERM for the launcher's lifetime (they are taken with sigtimedwait, no handler
// runs) and restores the caller's mask when done. SIGCHLD gets its default action meanwhile: a caller that
// ignores it would have the kernel reap our ranks before waitpid could read their exit codes.
class BlockedSignals {
 public:
  BlockedSignals() {
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    ::sigaction(SIGCHLD, &default_action, &previous_sigchld_);
    sigemptyset(&set_);
    for (int signal : {SIGCHLD, SIGINT, SIGTERM}) sigaddset(&set_, signal);
    pthread_sigmask(SIG_BLOCK, &set_, &previous_);
  }
  ~BlockedSignals() {
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
    ::sigaction(SIGCHLD, &previous_sigchld_, nullptr);
  }
  BlockedSignals(const BlockedSignals&) = delete;
  BlockedSignals& operator=(const BlockedSignals&) = delete;
  const sigset_t& set() const { return set_; }
  const sigset_t& previous() const { return previous_; }

 private:
  sigset_t set_{}, previous_{};
  struct sigaction previous_sigchld_ {};
};

struct Child {
  pid_t pid = -1;
  bool running = false;
};

}  // namespace detail

/// Runs `binary args...` world_size times with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK=0,
/// MASTER_ADDR=127.0.0.1, MASTER_PORT=<a free port>, HPCTRAIN_LOCAL=1 and HPCTRAIN_RUN_DIR (kept if set, else
/// `<cwd>/hpctrain-jobs/local`). Returns 0 when every rank succeeds; else the first failing rank's exit code
/// (128 + signal when a signal ended it), after stopping the others; 128 + signal when SIGINT/SIGTERM stopped
/// the launcher. Throws RuntimeError `[hpctrain.runtime.local_launch]` when a rank cannot be started.
inline int launch_local(int world_size, const std::string& binary, const std::vector<std::string>& args,
                        const LocalLaunchOptions& options = {}) {
  detail::require(world_size >= 1, errors::spec_local, world_size, "needs at least 1 rank");
  const int master_port = detail::free_local_port();
  const auto base = options.environment ? *options.environment : Environment::of_this_process();
  const std::string run_dir =
      options.run_directory
          ? options.run_directory->string()
          : base.get(env::run_dir).value_or((std::filesystem::current_path() / layout::jobs_root / "local").string());

  // Everything the children need is built before fork: after fork only async-signal-safe calls are allowed.
  std::vector<std::string> argv_strings{binary};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv = detail::c_strings(argv_strings);
  std::vector<std::vector<std::string>> env_strings;
  std::vector<std::vector<char*>> envs;
  for (int rank = 0; rank < world_size; ++rank)
    env_strings.push_back(
        detail::rank_environment(base, rank, world_size, master_port, run_dir, options.prepare_directory));
  for (auto& env : env_strings) envs.push_back(detail::c_strings(env));

  const detail::BlockedSignals blocked;
  const pid_t launcher = ::getpid();
  std::vector<detail::Child> children(static_cast<std::size_t>(world_size));
  std::optional<int> result;  // decided by the first failure or signal
  std::optional<std::string> start_error;
  std::optional<std::chrono::steady_clock::time_point> kill_at;

  auto signal_all = [&](int signal) {
    for (const auto& child : children)
      if (child.running) ::kill(-child.pid, signal);
  };
  auto begin_stop = [&](int signal) {
    if (kill_at) return;
    signal_all(signal);
    kill_at = std::chrono::steady_clock::now() + options.grace;
  };

  for (int rank = 0; rank < world_size && !start_error; ++rank) {
    // exec failure is reported through a close-on-exec pipe: EOF means exec succeeded.
    int report[2];
    if (::pipe2(report, O_CLOEXEC) != 0) {
      start_error = fmt::format("pipe: {}", std::strerror(errno));
      break;
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      start_error = fmt::format("fork: {}", std::strerror(errno));
      ::close(report[0]);
      ::close(report[1]);
      break;
    }
    if (pid == 0) {
      ::setpgid(0, 0);
      // Die with the launcher even when it is SIGKILLed (it is then our only link to the terminal's Ctrl-C).
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) ::_exit(128 + SIGTERM);
      struct sigaction default_action {};
      default_action.sa_handler = SIG_DFL;
      for (int signal : {SIGCHLD, SIGINT, SIGTERM}) ::sigaction(signal, &default_action, nullptr);
      ::sigprocmask(SIG_SETMASK, &blocked.previous(), nullptr);
      ::execve(binary.c_str(), argv.data(), envs[static_cast<std::size_t>(rank)].data());
      const int error = errno;
      [[maybe_unused]] const auto written = ::write(report[1], &error, sizeof error);
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here: whichever of parent and child runs first, the group exists before kill()
    children[static_cast<std::size_t>(rank)] = {pid, true};
    ::close(report[1]);
    int error = 0;
    ssize_t got;
    do got = ::read(report[0], &error, sizeof error);
    while (got < 0 && errno == EINTR);
    ::close(report[0]);
    if (got == static_cast<ssize_t>(sizeof error)) {
      start_error = fmt::format("cannot execute {}: {}", binary, std::strerror(error));
    }
  }
  if (start_error) begin_stop(SIGTERM);

  for (;;) {
    // Reap whichever ranks ended (only ours: the caller may have other children).
    for (auto& child : children) {
      int status = 0;
      if (!child.running || ::waitpid(child.pid, &status, WNOHANG) != child.pid) continue;
      child.running = false;
      const int code = detail::exit_code_of(status);
      if (code != 0 && !result) {
        result = code;
        begin_stop(SIGTERM);
      }
    }
    bool any_running = false;
    for (const auto& child : children) any_running = any_running || child.running;
    if (!any_running) break;

    // Wait for the next signal, at most until the grace ends.
    timespec timeout{1, 0};
    if (kill_at) {
      const auto left = std::max(std::chrono::nanoseconds(0), *kill_at - std::chrono::steady_clock::now());
      timeout.tv_sec = static_cast<std::time_t>(left.count() / 1'000'000'000);
      timeout.tv_nsec = static_cast<long>(left.count() % 1'000'000'000);
      if (left.count() == 0) {
        signal_all(SIGKILL);
        timeout = {1, 0};
      }
    }
    siginfo_t info{};
    const int signal = ::sigtimedwait(&blocked.set(), &info, &timeout);
    if (signal == SIGINT || signal == SIGTERM) {
      if (!result) result = 128 + signal;
      if (!kill_at) {
        begin_stop(signal);  // the ranks see the same signal a terminal's Ctrl-C would have sent them
      } else {
        signal_all(SIGKILL);  // a second Ctrl-C: stop waiting
      }
    }
  }
  if (start_error) throw RuntimeError(errors::runtime_local_launch, *start_error);
  return result.value_or(exit_ok);
}

}  // namespace hpctrain
