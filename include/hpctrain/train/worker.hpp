#pragma once
// Worker mode: what one rank runs under srun or `--local N`. The knob table of a Training — the built-in rows
// (train/builtin_knobs.hpp) and the program's own (`Training::knob`) — is the same one the login command checked; the
// worker reads its forwarded arguments with it, applies them, finds its place in the world from the environment,
// trains, and maps errors to the exit codes of DESIGN.md.
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/dist/fabric_check.hpp>
#include <hpctrain/dist/process_group.hpp>
#include <hpctrain/dist/simulated_link.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/job/fabric.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/job/nccl_network.hpp>
#include <hpctrain/job/process.hpp>  // restart_this_program
#include <hpctrain/job/run_placement.hpp>
#include <hpctrain/names.hpp>
#include <hpctrain/slurm/environment.hpp>
#include <hpctrain/slurm/world.hpp>
#include <hpctrain/train/builtin_knobs.hpp>
#include <hpctrain/train/run_directory.hpp>
#include <hpctrain/train/trainer.hpp>
#include <hpctrain/train/training.hpp>

namespace hpctrain {

namespace detail {
/// A whole number of seconds in [0, 86400] from variable `name` of `environment`, or nothing when it is unset;
/// RuntimeError(rendezvous) naming the variable and its value otherwise.
inline std::optional<std::int64_t> seconds_from_environment(const Environment& environment, const char* name) {
  const auto text = environment.get(name);
  if (!text) return std::nullopt;
  std::int64_t seconds = -1;
  const auto [end, error] = std::from_chars(text->data(), text->data() + text->size(), seconds);
  if (error != std::errc() || end != text->data() + text->size() || seconds < 0 || seconds > 86400)
    throw RuntimeError(errors::runtime_rendezvous,
                       fmt::format("{}={:?} is not a whole number of seconds in [0, 86400]", name, *text));
  return seconds;
}

/// The distributed runtime's settings from the rank's `environment`: the rendezvous, collective and checkpoint
/// timeouts from HPCTRAIN_RENDEZVOUS_TIMEOUT_S, HPCTRAIN_COLLECTIVE_TIMEOUT_S and HPCTRAIN_CHECKPOINT_TIMEOUT_S where
/// set (the script exports the site file's; the submitting shell's win there), Gloo's interfaces
/// (GLOO_SOCKET_IFNAME), the check of NCCL's network (job/nccl_network.hpp) and the simulated link a test asks for.
inline dist::Options dist_options_from_environment(const Environment& environment) {
  dist::Options options;
  const std::pair<const char*, std::chrono::milliseconds*> timeouts[] = {
      {env::rendezvous_timeout, &options.rendezvous_timeout},
      {env::collective_timeout, &options.collective_timeout},
      {env::checkpoint_timeout, &options.checkpoint_timeout}};
  for (const auto& [name, timeout] : timeouts)
    if (auto seconds = seconds_from_environment(environment, name)) {
      if (*seconds == 0)
        throw RuntimeError(errors::runtime_rendezvous, fmt::format("{}=0: the timeout must be positive", name));
      *timeout = std::chrono::seconds(*seconds);
    }
  options.gloo_interfaces = dist::detail::split_commas(environment.get("GLOO_SOCKET_IFNAME").value_or(""));
  options.nccl_network = nccl_network_settings(environment);
  options.simulated_link = dist::simulated_link_of(environment);
  return options;
}

/// A positive number from variable `name` of `environment` (`what` it measures, for the error), or none when unset.
inline std::optional<double> positive_from_environment(const Environment& environment, const char* name,
                                                       std::string_view what) {
  return positive_number_from_environment(environment, name, [&](const std::string& value) {
    throw RuntimeError(errors::runtime_fabric, fmt::format("{}={:?} is not a positive {}", name, value, what));
  });
}

/// `--check-fabric`'s request, as the login command exported it: HPCTRAIN_CHECK_FABRIC_MAX_BYTES (the largest
/// message, 0 for the backend's default), the fabric's figure between nodes (the site's HPCTRAIN_EXPECTED_BUSBW_GBPS,
/// else the preset of HPCTRAIN_FABRIC) and HPCTRAIN_CHECK_FABRIC_MIN_FRACTION, and the nodes' names (Slurm's node
/// list under srun). None: train.
inline std::optional<dist::FabricCheckRequest> check_fabric_request(const Environment& environment,
                                                                    const slurm::World& world) {
  const auto text = environment.get(env::check_fabric);
  if (!text) return std::nullopt;
  dist::FabricCheckRequest request;
  const auto [end, error] = std::from_chars(text->data(), text->data() + text->size(), request.max_bytes);
  if (error != std::errc() || end != text->data() + text->size() || request.max_bytes < 0)
    throw RuntimeError(errors::runtime_fabric,
                       fmt::format("{}={:?} is not a number of bytes", env::check_fabric, *text));
  const auto fabric = environment.get(env::fabric);
  request.between_nodes =
      fabric_bandwidth(fabric ? std::optional(parse_fabric(*fabric, env::fabric)) : std::nullopt,
                       positive_from_environment(environment, env::expected_busbw, "number of GB/s"));
  request.min_fraction = positive_from_environment(environment, env::check_fabric_min_fraction, "fraction");
  if (world.under_slurm) request.node_names = slurm::read_slurm_environment(slurm::lookup_in(environment)).nodes;
  return request;
}

}  // namespace detail

/// One rank: applies the knobs, trains, returns exit_ok, exit_requeue, exit_usage or exit_failure.
/// `placement`: where the login side put the run and the environment the rank began with (job/run_placement.hpp):
/// everything the rank reads of its environment is read from that value, here and in the Trainer.
inline int run_worker(const Training& training, const Knobs& knobs, const RunPlacement& placement = {}) {
  int rank = 0;
  try {
    const auto world = slurm::world_from_environment(slurm::lookup_in(placement.environment));
    rank = world.rank;
    const auto options = detail::dist_options_from_environment(placement.environment);
    // Before anything else: NCCL reads its logging from the environment the process began with.
    if (const auto restart = dist::environment_for_nccl_check(world, options, placement.environment))
      restart_this_program(*restart);
    const auto configured = with_knobs(training, knobs);
    if (rank == 0) fmt::print("hpctrain: {}\n", resolve_run_directory(configured.run_dir(), placement).describe());
    std::fflush(stdout);
    if (const auto request =
            detail::check_fabric_request(placement.environment, world))  // --check-fabric: measure, do not train
      return dist::check_fabric(world, options, *request);
    // Refused alike on every rank, before any rank connects; at one rank hsdp trains as Replicated (no groups).
    if (configured.sharding() == hsdp &&
        !sharded_stage_runs_replicated(ZeroStage::hsdp, world.world_size, configured.shard_at_one_rank()))
      hsdp_shard_group_size(configured.hsdp_group_size(), world.world_size, world.local_world_size);
    return train(configured, world, options, placement).exit_code;
  } catch (const std::exception& error) {  // hpctrain's errors, and c10::Error from LibTorch
    fmt::print(stderr, "rank {}: {}\n", rank, error.what());
    return exit_code_of(error);
  }
}

}  // namespace hpctrain
