#pragma once
// Which network NCCL chose, read from its own log, and the check that it is the site's fabric. NCCL picks
// its network when a communicator is created: the net plugin (aws-ofi-nccl for EFA), else InfiniBand, else
// TCP sockets, and says so only at NCCL_DEBUG=INFO. Rank 0 of a multi-node job on an efa or infiniband site
// has NCCL write those lines to a file (nccl_network_check, nccl_capture_environment), reads the choice back once the
// communicator exists, and fails naming the fix when NCCL fell back to sockets (check_nccl_network).
//
// The lines, as NCCL 2.18-2.27 and aws-ofi-nccl 1.x print them (after `host:pid:tid [dev] NCCL INFO `):
//   Using network Socket | Using network IB | Using network AWS Libfabric | Using network Libfabric
//   Assigned NET plugin Socket to comm                      (NCCL >= 2.23, before "Using network")
//   NET/Socket : Using [0]eth0:10.0.0.1<0>                  NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:...
//   NET/IB : No device found.                              NET/OFI Selected Provider is efa (found 4 nics)
//   NET/Plugin: Could not find: libnccl-net.so             NET/Plugin : dlerror=libnccl-net.so: cannot open ...
// Torch-free, so that the job layer's tests read captured logs; dist/process_group.hpp calls it.
#include <unistd.h>  // getpid, gethostname

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/files.hpp>
#include <hpctrain/job/fabric.hpp>
#include <hpctrain/names.hpp>

namespace hpctrain {

/// The kind of network NCCL moves data over between nodes.
enum class NcclTransport { socket, infiniband, libfabric, other };

/// NCCL's choice as its log states it.
struct NcclNetwork {
  std::string name;  ///< as NCCL names it: "Socket", "IB", "AWS Libfabric"
  NcclTransport transport = NcclTransport::other;
  std::string provider;        ///< libfabric's provider, when aws-ofi-nccl names it ("efa", "tcp")
  std::string provider_line;   ///< the line naming it
  std::string evidence;        ///< the line that decided, from "NCCL INFO" on
  std::string plugin_failure;  ///< a line saying why the net plugin did not load, if the log has one
  std::string ib_failure;      ///< "NET/IB : No device found.", if the log has it

  /// True when the bytes between nodes go over TCP: NCCL's sockets, or libfabric's TCP provider.
  bool uses_sockets() const {
    return transport == NcclTransport::socket ||
           (transport == NcclTransport::libfabric &&
            (provider == "tcp" || provider.starts_with("tcp;") || provider == "sockets" || provider == "udp"));
  }
};

namespace detail {
inline NcclTransport transport_of(std::string_view name) {
  if (name == "Socket") return NcclTransport::socket;
  if (name.starts_with("IB")) return NcclTransport::infiniband;  // IB, and the SHARP plugin's IBext / IBext_v8
  if (name.find("Libfabric") != std::string_view::npos || name.find("OFI") != std::string_view::npos)
    return NcclTransport::libfabric;
  return NcclTransport::other;
}

inline std::string_view trim_line_end(std::string_view text) {
  while (!text.empty() && (text.back() == ' ' || text.back() == '\r' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

/// The text after "NCCL INFO " on `line`, or empty for another line.
inline std::string_view nccl_info_text(std::string_view line) {
  const auto at = line.find("NCCL INFO ");
  return at == std::string_view::npos ? std::string_view() : trim_line_end(line.substr(at + 10));
}
}  // namespace detail

/// The network NCCL chose, from its INFO lines: "Using network X" decides, else "Assigned NET plugin X to comm",
/// else the last transport that listed a device (NET/OFI's provider, `NET/IB : Using [n]`, `NET/Socket : Using
/// [n]`). Nothing when the log holds none of these (NCCL_DEBUG below INFO, or no communicator yet).
inline std::optional<NcclNetwork> nccl_network_from_log(std::string_view log) {
  NcclNetwork found;
  std::optional<std::string> using_network, assigned, device_transport;
  std::string using_line, assigned_line, device_line;
  std::istringstream lines{std::string(log)};
  for (std::string line; std::getline(lines, line);) {
    const auto text = detail::nccl_info_text(line);
    if (text.empty()) continue;
    if (text.starts_with("Using network ")) {
      using_network = std::string(text.substr(14)), using_line = std::string(text);
    } else if (text.starts_with("Assigned NET plugin ") && text.ends_with(" to comm")) {
      assigned = std::string(text.substr(20, text.size() - 20 - 8)), assigned_line = std::string(text);
    } else if (text.starts_with("NET/OFI ")) {
      const auto at = text.find("elected Provider is ") != std::string_view::npos ? text.find("elected Provider is ")
                                                                                  : text.find("elected provider is ");
      if (at != std::string_view::npos) {
        const auto rest = text.substr(at + 20);
        found.provider = std::string(rest.substr(0, rest.find_first_of(" ,")));
        found.provider_line = std::string(text);
        device_transport = "AWS Libfabric", device_line = std::string(text);
      }
    } else if (text.starts_with("NET/IB : Using [") && text.size() > 16 && text[16] >= '0' && text[16] <= '9') {
      device_transport = "IB", device_line = std::string(text);
    } else if (text.starts_with("NET/Socket : Using [") && text.size() > 20 && text[20] >= '0' && text[20] <= '9') {
      if (!device_transport || *device_transport == "Socket")
        device_transport = "Socket", device_line = std::string(text);
    } else if (text.starts_with("NET/IB : No device found")) {
      found.ib_failure = std::string(text);
    } else if (text.starts_with("NET/Plugin") &&
               (text.find("Could not find") != std::string_view::npos ||
                text.find("dlerror") != std::string_view::npos || text.find("cannot open") != std::string_view::npos)) {
      if (found.plugin_failure.empty()) found.plugin_failure = std::string(text);
    }
  }
  if (using_network) found.name = *using_network, found.evidence = using_line;
  else if (assigned) found.name = *assigned, found.evidence = assigned_line;
  else if (device_transport) found.name = *device_transport, found.evidence = device_line;
  else return std::nullopt;
  found.transport = detail::transport_of(found.name);
  return found;
}

/// The error when the site's `fabric` wants a fast network and NCCL chose sockets; nothing when it is fine.
inline std::optional<std::string> socket_fallback_error(Fabric fabric, const NcclNetwork& network) {
  if (!fabric_needs_check(fabric) || !network.uses_sockets()) return std::nullopt;
  const auto chose = network.provider.empty() ? fmt::format("NCCL chose TCP sockets (`{}`)", network.evidence)
                                              : fmt::format("NCCL chose libfabric's {} provider (`{}`)",
                                                            network.provider, network.provider_line);
  std::string why;
  if (!network.plugin_failure.empty()) why += fmt::format("; `{}`", network.plugin_failure);
  if (!network.ib_failure.empty()) why += fmt::format("; `{}`", network.ib_failure);
  const auto fix =
      fabric == Fabric::efa
          ? "NCCL needs the aws-ofi-nccl plugin (libnccl-net.so) on LD_LIBRARY_PATH, libfabric's EFA provider and "
            "the EFA devices (/dev/infiniband/uverbs*) in the container: use an image built with the EFA installer "
            "and aws-ofi-nccl, or add the plugin's lib directory (often /opt/amazon/ofi-nccl/lib or "
            "/opt/aws-ofi-nccl/lib) to LD_LIBRARY_PATH with Job::env"
          : "NCCL found no usable InfiniBand adapter: check that the site file's ib_hca (NCCL_IB_HCA) names adapters "
            "`ibv_devices` lists on the compute nodes, and that the container sees /dev/infiniband";
  return fmt::format(
      "the site's fabric is {} but {}{}, so the job would run many times slower than it should. {}; "
      "or run over sockets anyway with --allow-socket-fallback",
      to_string(fabric), chose, why, fix);
}

namespace detail {
/// NCCL_DEBUG_FILE's pattern with %h (host) and %p (pid) filled in, as NCCL fills them.
inline std::string expand_nccl_debug_file(std::string_view pattern) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::string path;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && (pattern[i + 1] == 'h' || pattern[i + 1] == 'p')) {
      path += pattern[i + 1] == 'h' ? std::string(host) : std::to_string(::getpid());
      ++i;
    } else {
      path += pattern[i];
    }
  }
  return path;
}

}  // namespace detail

/// What a rank's check of NCCL's network is given, read from its environment by nccl_network_settings: the site's
/// fabric (HPCTRAIN_FABRIC, exported by the script), whether a fallback to sockets is allowed
/// (HPCTRAIN_ALLOW_SOCKET_FALLBACK=1), where the run writes, and the user's own NCCL debug variables.
struct NcclNetworkSettings {
  std::optional<Fabric> fabric;
  bool allow_socket_fallback = false;
  std::filesystem::path run_dir{"."};
  std::optional<std::string> debug_file;        ///< NCCL_DEBUG_FILE
  std::optional<std::string> debug_level;       ///< NCCL_DEBUG
  std::optional<std::string> debug_subsystems;  ///< NCCL_DEBUG_SUBSYS
};

/// The settings `environment` (a worker's) gives. Throws RuntimeError `[hpctrain.runtime.fabric]` for a fabric
/// that is not one.
inline NcclNetworkSettings nccl_network_settings(const Environment& environment) {
  NcclNetworkSettings settings;
  if (const auto text = environment.get(env::fabric)) try {
      settings.fabric = parse_fabric(*text, env::fabric);
    } catch (const SpecError& error) {
      throw RuntimeError(errors::runtime_fabric, error.what());
    }
  settings.allow_socket_fallback = environment.get(env::allow_socket_fallback) == "1";
  settings.run_dir = environment.get(env::run_dir).value_or(".");
  settings.debug_file = environment.get("NCCL_DEBUG_FILE");
  settings.debug_level = environment.get("NCCL_DEBUG");
  settings.debug_subsystems = environment.get("NCCL_DEBUG_SUBSYS");
  return settings;
}

/// What rank 0 checks after its communicator exists: the site's fabric and where NCCL's lines go.
struct NcclNetworkCheck {
  Fabric fabric;
  std::filesystem::path log;
  bool allow_socket_fallback = false;
};

/// On rank 0 of a job over several nodes whose site fabric is efa or infiniband: what to check once the NCCL
/// communicator exists, with NCCL's INFO lines of the INIT and NET subsystems in `<run dir>/nccl-rank0-<pid>.log`
/// (or in the user's own NCCL_DEBUG_FILE). Nothing on any other rank (they, and this rank's standard output, keep
/// the user's NCCL_DEBUG) or job.
inline std::optional<NcclNetworkCheck> nccl_network_check(int rank, bool several_nodes,
                                                          const NcclNetworkSettings& settings) {
  if (rank != 0 || !several_nodes) return std::nullopt;
  if (!settings.fabric || !fabric_needs_check(*settings.fabric)) return std::nullopt;
  const auto log = settings.debug_file ? std::filesystem::path(detail::expand_nccl_debug_file(*settings.debug_file))
                                       : settings.run_dir / fmt::format("nccl-rank0-{}.log", ::getpid());
  return NcclNetworkCheck{*settings.fabric, log, settings.allow_socket_fallback};
}

/// The environment NCCL must begin with for `check` — `environment` with NCCL_DEBUG_FILE at the check's log,
/// NCCL_DEBUG raised to INFO (TRACE kept) and NCCL_DEBUG_SUBSYS INIT,NET unless the user chose subsystems — or
/// nothing when `environment` already says all that. NCCL reads its configuration from the process's environment
/// only, when it initialises, and the library sets no variable in a running process: a rank given this starts
/// again with it (restart_this_program, train/worker.hpp) before it does anything else, with the same pid, so the
/// log's name holds.
inline std::optional<Environment> nccl_capture_environment(const NcclNetworkCheck& check,
                                                           const NcclNetworkSettings& settings,
                                                           Environment environment) {
  bool changed = false;
  const auto require = [&](const char* name, const std::string& value) {
    environment.set(name, value);
    changed = true;
  };
  if (!settings.debug_file) require("NCCL_DEBUG_FILE", check.log.string());
  const auto level = settings.debug_level.value_or("");
  if (level != "INFO" && level != "TRACE") require("NCCL_DEBUG", "INFO");
  if (!settings.debug_subsystems) require("NCCL_DEBUG_SUBSYS", "INIT,NET");
  if (!changed) return std::nullopt;
  return environment;
}

/// After the communicator exists: the network NCCL chose, read from the captured log. Throws
/// RuntimeError `[hpctrain.runtime.fabric]` when it fell back to sockets and that is not allowed
/// (HPCTRAIN_ALLOW_SOCKET_FALLBACK); returns the line to print otherwise (a warning when the log says nothing).
inline std::string check_nccl_network(const NcclNetworkCheck& check) {
  const auto network = nccl_network_from_log(hpctrain::detail::read_file_if_present(check.log).value_or(""));
  if (!network)
    return fmt::format(
        "hpctrain: warning: cannot tell which network NCCL chose: {} holds no \"Using network\" line "
        "(the site's fabric is {}; --check-fabric measures it)",
        check.log.string(), to_string(check.fabric));
  if (const auto error = socket_fallback_error(check.fabric, *network)) {
    if (!check.allow_socket_fallback) throw RuntimeError(errors::runtime_fabric, *error);
    return fmt::format("hpctrain: warning: {} (allowed by --allow-socket-fallback)", *error);
  }
  return fmt::format("hpctrain: NCCL uses network {}{} (the site's fabric is {})", network->name,
                     network->provider.empty() ? "" : fmt::format(", provider {}", network->provider),
                     to_string(check.fabric));
}

}  // namespace hpctrain
