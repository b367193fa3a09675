// Test helper: prints this process's hpctrain::slurm::World as one JSON line, for the srun and --local
// launcher tests (tests/slurm). Options:
//   --write DIR            also write DIR/rank-<rank>.json (atomically: written, then renamed)
//   --fail-rank R CODE     rank R waits until every other rank wrote its file, then exits with CODE
//   --hang                 the other ranks then wait to be stopped
//   --ignore-sigterm       ...and ignore SIGTERM, so only SIGKILL stops them
// Any other argument is echoed in "args" (the launcher must forward it).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <hpctrain/slurm/world.hpp>

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::string write_dir;
  int fail_rank = -1, fail_code = 0;
  bool hang = false, ignore_sigterm = false;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--write" && i + 1 < argc) {
      write_dir = argv[++i];
    } else if (arg == "--fail-rank" && i + 2 < argc) {
      fail_rank = std::stoi(argv[++i]);
      fail_code = std::stoi(argv[++i]);
    } else if (arg == "--hang") {
      hang = true;
    } else if (arg == "--ignore-sigterm") {
      ignore_sigterm = true;
    } else {
      args.push_back(arg);
    }
  }
  if (ignore_sigterm) ::signal(SIGTERM, SIG_IGN);

  hpctrain::slurm::World world;
  try {
    world = hpctrain::slurm::world_from_environment();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  auto env = [](const char* name) -> nlohmann::json {
    const char* value = std::getenv(name);
    return value ? nlohmann::json(value) : nlohmann::json(nullptr);
  };
  const nlohmann::json line = {
      {"rank", world.rank},
      {"world_size", world.world_size},
      {"local_rank", world.local_rank},
      {"local_world_size", world.local_world_size},
      {"node_rank", world.node_rank},
      {"master_addr", world.master_addr},
      {"master_port", world.master_port},
      {"job_id", world.job_id},
      {"restart_count", world.restart_count},
      {"under_slurm", world.under_slurm},
      {"node", env("SLURMD_NODENAME")},
      {"hpctrain_local", env("HPCTRAIN_LOCAL")},
      {"run_dir", env("HPCTRAIN_RUN_DIR")},
      {"pid", ::getpid()},
      {"args", args},
  };
  const std::string text = line.dump() + "\n";
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);

  auto file_of = [&](int rank) { return fs::path(write_dir) / ("rank-" + std::to_string(rank) + ".json"); };
  if (!write_dir.empty()) {
    const auto temporary = file_of(world.rank).string() + ".tmp";
    std::ofstream(temporary) << text;
    fs::rename(temporary, file_of(world.rank));
  }
  if (world.rank == fail_rank) {
    for (int rank = 0; rank < world.world_size; ++rank)
      while (!write_dir.empty() && !fs::exists(file_of(rank)))
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return fail_code;
  }
  if (hang)
    for (;;) ::pause();
  return 0;
}
