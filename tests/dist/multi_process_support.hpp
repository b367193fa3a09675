#pragma once
// Starting ranks of a worker program for the multi-process dist tests: each rank a child process with
// RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set and its stdout/stderr in files of a fresh directory.
// Shared by multi_process_test.cpp (dist_worker) and zero_test.cpp (zero_worker).
#include <hpctrain/slurm/local_launch.hpp>  // detail::free_local_port

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace hpctrain_test {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

inline std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// tests/integration builds the worker; test_dist lives in <build>/tests, the worker in <build>/tests/integration.
/// Found from our own path: ctest's ENVIRONMENT currently carries only the first of the HPCTRAIN_* variables.
inline std::string worker_path(const std::string& program = "hpctrain_dist_worker") {
  return (fs::read_symlink("/proc/self/exe").parent_path() / "integration" / program).string();
}

/// The value of `key=value` on a line of `text`, if any.
inline std::optional<std::string> value_of(const std::string& text, const std::string& key) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind(key + "=", 0) == 0) return line.substr(key.size() + 1);
  return std::nullopt;
}

/// Two (or more) ranks of dist_worker, each with its stdout/stderr in a file of a fresh directory.
class Ranks {
 public:
  Ranks(int world_size, const std::vector<std::string>& arguments, std::chrono::milliseconds timeout = 60s,
        const std::string& program = "hpctrain_dist_worker")
      : directory_(fs::temp_directory_path() /
                   ("hpctrain-dist-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++))) {
    fs::create_directories(directory_);
    const int port = hpctrain::detail::free_local_port();
    for (int rank = 0; rank < world_size; ++rank) {
      std::vector<std::string> environment{"RANK=" + std::to_string(rank),
                                           "WORLD_SIZE=" + std::to_string(world_size),
                                           "LOCAL_RANK=" + std::to_string(rank),
                                           "LOCAL_WORLD_SIZE=" + std::to_string(world_size),
                                           "MASTER_ADDR=127.0.0.1",
                                           "MASTER_PORT=" + std::to_string(port),
                                           "HPCTRAIN_DIST_TIMEOUT_MS=" + std::to_string(timeout.count()),
                                           "PATH=/usr/bin:/bin",
                                           "OMP_NUM_THREADS=1"};
      std::vector<std::string> argv{worker_path(program)};
      argv.insert(argv.end(), arguments.begin(), arguments.end());
      std::vector<char*> argv_pointers, environment_pointers;
      for (auto& a : argv) argv_pointers.push_back(a.data());
      argv_pointers.push_back(nullptr);
      for (auto& e : environment) environment_pointers.push_back(e.data());
      environment_pointers.push_back(nullptr);
      const auto out = output_path(rank), err = error_path(rank);
      const pid_t pid = ::fork();
      if (pid == 0) {
        const int out_fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        const int err_fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ::dup2(out_fd, 1);
        ::dup2(err_fd, 2);
        ::execve(argv_pointers[0], argv_pointers.data(), environment_pointers.data());
        ::_exit(127);
      }
      pids_.push_back(pid);
      statuses_.push_back(std::nullopt);
    }
  }
  Ranks(const Ranks&) = delete;
  Ranks& operator=(const Ranks&) = delete;
  ~Ranks() {
    for (std::size_t rank = 0; rank < pids_.size(); ++rank) {
      if (!statuses_[rank]) {
        ::kill(pids_[rank], SIGKILL);
        ::waitpid(pids_[rank], nullptr, 0);
      }
    }
    // Not fs::remove_all: libtorch.so exports its own std::filesystem::remove_all, which crashes when called
    // from code built by this GCC (a null call inside); the files are known, remove them one by one.
    for (std::size_t rank = 0; rank < pids_.size(); ++rank) {
      ::unlink(output_path(static_cast<int>(rank)).c_str());
      ::unlink(error_path(static_cast<int>(rank)).c_str());
    }
    ::rmdir(directory_.c_str());
  }

  /// Waits for `rank` to exit; std::nullopt if it is still running after `limit` (a hang guard, not a timing).
  std::optional<int> wait(int rank, std::chrono::milliseconds limit = 120s) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!statuses_[rank]) {
      int status = 0;
      if (::waitpid(pids_[rank], &status, WNOHANG) == pids_[rank]) {
        statuses_[rank] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      } else if (std::chrono::steady_clock::now() > deadline) {
        return std::nullopt;
      } else {
        std::this_thread::sleep_for(20ms);
      }
    }
    return statuses_[rank];
  }
  /// Waits until `rank` printed `text` (or exited, or the hang guard passed); whether it did.
  bool wait_for_output(int rank, const std::string& text, std::chrono::milliseconds limit = 120s) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (output(rank).find(text) != std::string::npos) return true;
      int status = 0;
      if (::waitpid(pids_[rank], &status, WNOHANG) == pids_[rank]) {
        statuses_[rank] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return output(rank).find(text) != std::string::npos;
      }
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }
  void kill(int rank) { ::kill(pids_[rank], SIGKILL); }
  std::string output(int rank) const { return read_file(output_path(rank)); }
  std::string errors(int rank) const { return read_file(error_path(rank)); }

 private:
  static int& counter() {
    static int value = 0;
    return value;
  }
  fs::path output_path(int rank) const { return directory_ / ("rank" + std::to_string(rank) + ".out"); }
  fs::path error_path(int rank) const { return directory_ / ("rank" + std::to_string(rank) + ".err"); }

  fs::path directory_;
  std::vector<pid_t> pids_;
  std::vector<std::optional<int>> statuses_;
};

}  // namespace hpctrain_test
