// launch_local (`./train --local N`) with print_world as the rank program: rank variables, first failure
// wins, SIGTERM then SIGKILL, and SIGINT to the launcher stopping every rank.
#include <hpctrain/slurm/local_launch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "test_support.hpp"

namespace fs = std::filesystem;

namespace {

// A fresh directory for the ranks' files; removed afterwards.
class LaunchFixture {
 public:
  LaunchFixture() : dir_(fs::temp_directory_path() / fmt::format("hpctrain-local-launch-{}", ::getpid())) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~LaunchFixture() { fs::remove_all(dir_); }
  LaunchFixture(const LaunchFixture&) = delete;
  LaunchFixture& operator=(const LaunchFixture&) = delete;

 protected:
  fs::path rank_file(int rank) const { return dir_ / fmt::format("rank-{}.json", rank); }
  nlohmann::json rank_json(int rank) const {
    std::ifstream in(rank_file(rank));
    return nlohmann::json::parse(in);
  }
  // Waits until every rank wrote its file (true), or until `gave_up()` says the launch is over (false).
  // No deadline: a failure ends the launch, and ctest's timeout bounds the rest.
  template <class GaveUp>
  bool wait_for_ranks(int world_size, GaveUp gave_up) const {
    for (int rank = 0; rank < world_size; ++rank)
      while (!fs::exists(rank_file(rank))) {
        if (gave_up()) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    return true;
  }
  static bool alive(int pid) { return ::kill(pid, 0) == 0; }

  fs::path dir_;
};

// Restores an environment variable when the test ends.
class ScopedVariable {
 public:
  ScopedVariable(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedVariable() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedVariable(const ScopedVariable&) = delete;
  ScopedVariable& operator=(const ScopedVariable&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE_METHOD(LaunchFixture, "Every local rank gets torchrun's variables, one free port and the forwarded arguments",
                 "[local_launch]") {
  const ScopedVariable no_run_dir("HPCTRAIN_RUN_DIR", nullptr);
  const ScopedVariable stale_rank("RANK", "7");  // the launcher's own rank variables must not leak through
  const int world_size = GENERATE(1, 2, 3);
  CAPTURE(world_size);
  fs::remove_all(dir_);
  fs::create_directories(dir_);
  REQUIRE(hpctrain::launch_local(world_size, hpctrain::test::print_world_program(),
                                 {"--write", dir_.string(), "--epochs", "3", "a b;$(x)"}) == 0);
  const auto first = rank_json(0);
  for (int rank = 0; rank < world_size; ++rank) {
    CAPTURE(rank);
    const auto world = rank_json(rank);
    CHECK(world["rank"] == rank);
    CHECK(world["world_size"] == world_size);
    CHECK(world["local_rank"] == rank);
    CHECK(world["local_world_size"] == world_size);
    CHECK(world["node_rank"] == 0);
    CHECK(world["master_addr"] == "127.0.0.1");
    CHECK(world["master_port"] == first["master_port"]);
    CHECK(world["master_port"].get<int>() > 0);
    CHECK(world["under_slurm"] == false);
    CHECK(world["hpctrain_local"] == "1");
    CHECK(world["run_dir"] == (fs::current_path() / "hpctrain-jobs" / "local").string());
    CHECK(world["args"] == nlohmann::json({"--epochs", "3", "a b;$(x)"}));
  }
}

TEST_CASE_METHOD(LaunchFixture, "A run directory set by the caller is kept", "[local_launch]") {
  const ScopedVariable run_dir("HPCTRAIN_RUN_DIR", "/somewhere/runs/7");
  REQUIRE(hpctrain::launch_local(2, hpctrain::test::print_world_program(), {"--write", dir_.string()}) == 0);
  CHECK(rank_json(0)["run_dir"] == "/somewhere/runs/7");
  CHECK(rank_json(1)["run_dir"] == "/somewhere/runs/7");
}

TEST_CASE_METHOD(LaunchFixture, "The first failing rank's exit code wins and stops the hanging ranks",
                 "[local_launch]") {
  const int failing_rank = GENERATE(0, 2);
  CAPTURE(failing_rank);
  fs::remove_all(dir_);
  fs::create_directories(dir_);
  // The failing rank exits 7 once all three ranks are up; the others would hang forever.
  const int code =
      hpctrain::launch_local(3, hpctrain::test::print_world_program(),
                             {"--write", dir_.string(), "--fail-rank", std::to_string(failing_rank), "7", "--hang"});
  CHECK(code == 7);
  for (int rank = 0; rank < 3; ++rank) {
    CAPTURE(rank);
    CHECK_FALSE(alive(rank_json(rank)["pid"].get<int>()));
  }
}

TEST_CASE_METHOD(LaunchFixture, "A rank that ignores SIGTERM is killed when the grace ends", "[local_launch]") {
  hpctrain::LocalLaunchOptions options;
  options.grace = std::chrono::milliseconds(200);
  const int code = hpctrain::launch_local(
      2, hpctrain::test::print_world_program(),
      {"--write", dir_.string(), "--fail-rank", "1", "3", "--hang", "--ignore-sigterm"}, options);
  CHECK(code == 3);
  CHECK_FALSE(alive(rank_json(0)["pid"].get<int>()));
}

TEST_CASE_METHOD(LaunchFixture, "A rank ended by a signal reports 128 plus the signal", "[local_launch]") {
  // Rank 1 hangs; rank 0 is killed from outside: its SIGKILL is the first failure.
  std::atomic<bool> launch_over{false};
  std::thread killer([this, &launch_over] {
    if (wait_for_ranks(2, [&] { return launch_over.load(); })) ::kill(rank_json(0)["pid"].get<int>(), SIGKILL);
  });
  int code = -1;
  try {
    code = hpctrain::launch_local(2, hpctrain::test::print_world_program(), {"--write", dir_.string(), "--hang"});
  } catch (...) {
    launch_over = true;
    killer.join();
    throw;
  }
  launch_over = true;
  killer.join();
  CHECK(code == 128 + SIGKILL);
  CHECK_FALSE(alive(rank_json(1)["pid"].get<int>()));
}

TEST_CASE_METHOD(LaunchFixture, "SIGINT or SIGTERM to the launcher stops every rank", "[local_launch]") {
  const int signal = GENERATE(SIGINT, SIGTERM);
  CAPTURE(signal);
  fs::remove_all(dir_);
  fs::create_directories(dir_);
  // The launcher runs in a child process, as `./train --local 2` would, so the signal is the process's own.
  const std::string program = hpctrain::test::print_world_program();
  const std::vector<std::string> args{"--write", dir_.string(), "--hang"};
  const pid_t launcher = ::fork();
  REQUIRE(launcher >= 0);
  if (launcher == 0) {
    int code = 1;
    try {
      code = hpctrain::launch_local(2, program, args);
    } catch (...) {
    }
    ::_exit(code);
  }
  int status = 0;
  const bool ranks_up = wait_for_ranks(2, [&] { return ::waitpid(launcher, &status, WNOHANG) == launcher; });
  REQUIRE(ranks_up);
  ::kill(launcher, signal);
  REQUIRE(::waitpid(launcher, &status, 0) == launcher);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 128 + signal);
  CHECK_FALSE(alive(rank_json(0)["pid"].get<int>()));
  CHECK_FALSE(alive(rank_json(1)["pid"].get<int>()));
}

TEST_CASE_METHOD(LaunchFixture, "A caller that ignores SIGCHLD still gets the ranks' exit codes", "[local_launch]") {
  struct sigaction ignore {
  }, previous{};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGCHLD, &ignore, &previous);
  const int code = hpctrain::launch_local(2, hpctrain::test::print_world_program(),
                                          {"--write", dir_.string(), "--fail-rank", "1", "5"});
  struct sigaction after {};
  ::sigaction(SIGCHLD, &previous, &after);
  CHECK(code == 5);
  CHECK(after.sa_handler == SIG_IGN);  // the caller's disposition is back
}

TEST_CASE("A program that cannot be executed is an error naming it", "[local_launch]") {
  try {
    hpctrain::launch_local(2, "/nonexistent/train", {"--hpctrain-worker"});
    FAIL("launched");
  } catch (const hpctrain::RuntimeError& e) {
    CHECK(std::string(e.what()) ==
          "[hpctrain.runtime.local_launch] cannot execute /nonexistent/train: No such file or directory");
  }
}

TEST_CASE("Fewer than one local rank is a spec error", "[local_launch]") {
  CHECK_THROWS_WITH(hpctrain::launch_local(0, "/bin/true", {}),
                    "[hpctrain.spec.local] local = 0: needs at least 1 rank");
}
