#pragma once
// Who am I in the job, and where do we meet: rank, world size, local rank, node rank and the rendezvous
// address, from either the torchrun-style variables that `--local N` (or torchrun) sets, or from srun's
// SLURM_*. This replaces `scontrol show hostnames | head -1` and a random MASTER_PORT in sbatch scripts.
#include <netdb.h>
#include <sys/socket.h>

#include <charconv>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/names.hpp>
#include <hpctrain/slurm/environment.hpp>

namespace hpctrain::slurm {

/// One process's place in a distributed run.
struct World {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1, node_rank = 0;
  /// Where rank 0 listens for the rendezvous (a host name or address).
  std::string master_addr;
  int master_port = 0;
  /// SLURM_JOB_ID under Slurm; "local" for `--local` and plain runs.
  std::string job_id;
  /// How often the job was requeued (SLURM_RESTART_COUNT), 0 on the first run.
  int restart_count = 0;
  /// True when the ranks come from srun's SLURM_* variables.
  bool under_slurm = false;
};

/// Derived rendezvous ports lie in [master_port_base, master_port_base + master_port_span): below Linux's
/// ephemeral range (32768-60999), so a port cannot be taken by some outgoing connection.
inline constexpr int master_port_base = 20000;
/// Size of the derived port range.
inline constexpr int master_port_span = 10000;
/// Port used outside Slurm when MASTER_PORT is unset (torchrun's default).
inline constexpr int default_master_port = 29500;

/// MASTER_PORT for a Slurm job: base + (job id mod 1000) * 10 + (restart count mod 10). Jobs whose ids differ
/// by less than 1000 never share a port, and each of the first 10 runs of a requeued job gets its own port,
/// so a restart never meets the previous run's socket in TIME_WAIT.
inline int derive_master_port(long job_id, int restart_count) {
  return master_port_base + static_cast<int>(job_id % 1000) * 10 + restart_count % 10;
}

namespace detail {

inline int parse_port(std::string_view name, std::string_view text) {
  int port = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), port);
  if (error != std::errc() || end != text.data() + text.size() || port < 1 || port > 65535) {
    bad_variable(name, text, "not a port number (1-65535)");
  }
  return port;
}

// MASTER_ADDR / MASTER_PORT set by the user win over what we derive.
inline void apply_master_overrides(World& world, const EnvironmentLookup& lookup) {
  if (auto addr = lookup("MASTER_ADDR")) world.master_addr = *addr;
  if (auto port = lookup("MASTER_PORT")) world.master_port = parse_port("MASTER_PORT", *port);
}

// torchrun's contract: RANK and WORLD_SIZE, LOCAL_RANK/LOCAL_WORLD_SIZE (a single node when unset),
// MASTER_ADDR/MASTER_PORT (needed once there is more than one rank).
inline World world_from_torchrun_variables(const EnvironmentLookup& lookup) {
  const auto rank = lookup("RANK");
  const auto world_size = lookup("WORLD_SIZE");
  if (!rank || !world_size) {
    std::string missing = !rank && !world_size ? "RANK, WORLD_SIZE" : !rank ? "RANK" : "WORLD_SIZE";
    throw RuntimeError(errors::runtime_slurm_env,
                       fmt::format("missing {} (HPCTRAIN_LOCAL or RANK says the ranks come from "
                                   "torchrun-style variables)",
                                   missing));
  }
  World world;
  world.rank = parse_int("RANK", *rank);
  world.world_size = parse_int("WORLD_SIZE", *world_size, 1);
  world.local_rank = world.rank;
  world.local_world_size = world.world_size;
  if (auto local_rank = lookup("LOCAL_RANK")) world.local_rank = parse_int("LOCAL_RANK", *local_rank);
  if (auto local_size = lookup("LOCAL_WORLD_SIZE"))
    world.local_world_size = parse_int("LOCAL_WORLD_SIZE", *local_size, 1);
  world.node_rank = world.rank / world.local_world_size;
  if (auto group_rank = lookup("GROUP_RANK")) world.node_rank = parse_int("GROUP_RANK", *group_rank);
  world.job_id = lookup("SLURM_JOB_ID").value_or("local");
  if (auto restarts = lookup("TORCHELASTIC_RESTART_COUNT"))
    world.restart_count = parse_int("TORCHELASTIC_RESTART_COUNT", *restarts);
  world.master_addr = "127.0.0.1";
  world.master_port = default_master_port;
  apply_master_overrides(world, lookup);

  auto contradiction = [](const std::string& message) { throw RuntimeError(errors::runtime_slurm_env, message); };
  if (world.rank >= world.world_size) {
    contradiction(fmt::format("RANK = {} is not below WORLD_SIZE = {}", world.rank, world.world_size));
  }
  if (world.local_world_size > world.world_size) {
    contradiction(
        fmt::format("LOCAL_WORLD_SIZE = {} exceeds WORLD_SIZE = {}", world.local_world_size, world.world_size));
  }
  if (world.local_rank >= world.local_world_size) {
    contradiction(
        fmt::format("LOCAL_RANK = {} is not below LOCAL_WORLD_SIZE = {}", world.local_rank, world.local_world_size));
  }
  if (world.world_size > 1 && (!lookup("MASTER_ADDR") || !lookup("MASTER_PORT"))) {
    contradiction(
        fmt::format("WORLD_SIZE = {} needs MASTER_ADDR and MASTER_PORT for the rendezvous", world.world_size));
  }
  return world;
}

inline World world_from_slurm_variables(const EnvironmentLookup& lookup) {
  const StepEnvironment env = read_slurm_environment(lookup);
  World world;
  world.rank = env.proc_id;
  world.world_size = env.num_tasks;
  world.local_rank = env.local_id;
  world.local_world_size = env.local_num_tasks();
  world.node_rank = env.node_id;
  world.job_id = env.job_id;
  world.restart_count = env.restart_count;
  world.under_slurm = true;
  // The step's first node hosts rank 0: Slurm's block distribution starts there, and srun -m cyclic too.
  world.master_addr = env.nodes.front();
  world.master_port = derive_master_port(parse_long("SLURM_JOB_ID", env.job_id), env.restart_count);
  apply_master_overrides(world, lookup);
  return world;
}

}  // namespace detail

/// This process's World: torchrun-style RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/MASTER_ADDR/MASTER_PORT
/// when HPCTRAIN_LOCAL or RANK is set; else srun's SLURM_* when SLURM_PROCID is set; else a world of one.
/// MASTER_ADDR / MASTER_PORT override the derived address and port. Throws RuntimeError `[hpctrain.runtime.slurm_env]`.
inline World world_from_environment(const EnvironmentLookup& lookup) {
  if (lookup(env::local) || lookup("RANK")) return detail::world_from_torchrun_variables(lookup);
  if (in_slurm_step(lookup)) return detail::world_from_slurm_variables(lookup);
  World world;
  world.job_id = "local";
  world.master_addr = "127.0.0.1";
  world.master_port = default_master_port;
  detail::apply_master_overrides(world, lookup);
  return world;
}

/// The same from the environment this process began with: what a program's own worker (run_job's Worker) calls.
inline World world_from_environment() { return world_from_environment(lookup_in(Environment::of_this_process())); }

/// Resolves a host name to a numeric address (IPv4 preferred), e.g. World::master_addr before binding.
/// Throws RuntimeError `[hpctrain.runtime.resolve]` naming the host.
inline std::string resolve_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  std::string fallback;
  for (int family : {AF_INET, AF_UNSPEC}) {
    hints.ai_family = family;
    addrinfo* found = nullptr;
    const int status = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
    if (status != 0) {
      fallback = ::gai_strerror(status);
      continue;
    }
    const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owner(found, &::freeaddrinfo);
    char text[NI_MAXHOST];
    if (::getnameinfo(found->ai_addr, found->ai_addrlen, text, sizeof text, nullptr, 0, NI_NUMERICHOST) == 0) {
      return text;
    }
  }
  throw RuntimeError(errors::runtime_resolve, fmt::format("cannot resolve host \"{}\": {}", host, fallback));
}

}  // namespace hpctrain::slurm
