#pragma once
// Rendezvous and process groups: what torchrun + `dist.init_process_group` do, in-process.
// Rank 0 serves a c10d::TCPStore at MASTER_ADDR:MASTER_PORT; every rank connects to it and builds a
// c10d backend over it: NCCL when CUDA is available (and hpctrain was compiled with USE_C10D_NCCL, see
// docs/distributed.md), Gloo on CPU otherwise. At world size 1 there is neither store nor backend.
// A group can be split into subgroups (ProcessGroup::subgroup, as torch.distributed.new_group): each gets its own
// backend over a prefix of the same store, for hybrid sharding's shard and replica groups.
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(USE_C10D_NCCL)
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <hpctrain/dist/simulated_link.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/job/nccl_network.hpp>  // rank 0 checks NCCL's network against the site's fabric
#include <hpctrain/names.hpp>
#include <hpctrain/slurm/devices.hpp>
#include <hpctrain/slurm/world.hpp>

namespace hpctrain::dist {

/// Settings of the distributed runtime: how long each kind of wait may last before it fails naming itself, and what
/// the rank's launcher gave its network (a worker's: train/worker.hpp reads them from its environment).
struct Options {
  /// The rendezvous: rank 0's store, every rank's connection to it, the backend's connections (and the store's
  /// later waits). Default: 5 minutes (HPCTRAIN_RENDEZVOUS_TIMEOUT_S, site file `rendezvous_timeout_s`).
  std::chrono::milliseconds rendezvous_timeout{std::chrono::minutes(5)};
  /// One collective of the training (gradient all-reduce, broadcast, barrier). Default: 5 minutes
  /// (HPCTRAIN_COLLECTIVE_TIMEOUT_S, site file `collective_timeout_s`).
  std::chrono::milliseconds collective_timeout{std::chrono::minutes(5)};
  /// A collective around a checkpoint's writing, where ranks wait for others' files (CheckpointWaits). Default:
  /// 5 minutes (HPCTRAIN_CHECKPOINT_TIMEOUT_S, site file `checkpoint_timeout_s`).
  std::chrono::milliseconds checkpoint_timeout{std::chrono::minutes(5)};
  /// The network interfaces Gloo uses (GLOO_SOCKET_IFNAME's, comma-separated); none: the address this node's name
  /// resolves to (loopback when every rank is on this node).
  std::vector<std::string> gloo_interfaces;
  /// What rank 0 of a job over several nodes checks of NCCL's network (job/nccl_network.hpp).
  NcclNetworkSettings nccl_network;
  /// A test seam (docs/seams.md): every collective of the group and its subgroups crosses this simulated link
  /// (dist/simulated_link.hpp); none in a real run.
  std::shared_ptr<SimulatedLink> simulated_link;
  /// All three timeouts at once.
  Options& timeouts(std::chrono::milliseconds all) {
    rendezvous_timeout = collective_timeout = checkpoint_timeout = all;
    return *this;
  }
};

/// Which timeout a collective honours: the training's, or a checkpoint's (CheckpointWaits).
enum class WaitKind { collective, checkpoint };

/// One rank's membership in the job: the TCPStore and the c10d backend (Gloo or NCCL).
class ProcessGroup {
 public:
  /// Rendezvouses with the other ranks of `world` and builds the backend; throws
  /// RuntimeError(errors::runtime_rendezvous).
  ProcessGroup(const slurm::World& world, const Options& options);
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;
  /// Orderly shutdown: rank 0 keeps the store up until every rank has checked out (skipped after a failure).
  /// A subgroup only shuts its backend down: the store is its root group's.
  ~ProcessGroup();

  /// The subgroup of this group's ranks `ranks` (ascending, this rank among them), with its own backend over
  /// the same store; its rank is this rank's index in `ranks`. Collective over the members: every member calls
  /// it with the same `ranks` and `tag`, and every rank makes its subgroups in the same order (the n-th call of
  /// every rank shares a key space; `tag` names the group within it, e.g. "shard/1"). A subgroup of one rank has
  /// no backend. Same device, timeout and failure flag as this group (a failed collective in either marks both).
  /// Throws RuntimeError(errors::runtime_rendezvous) when the backend cannot connect, SpecError
  /// `[hpctrain.spec.sharding]` for a list of ranks that is not ascending, lies outside this group or leaves this rank
  /// out.
  std::shared_ptr<ProcessGroup> subgroup(const std::vector<int>& ranks, const std::string& tag);

  /// This process's rank in [0, world_size).
  int rank() const { return rank_; }
  /// Number of ranks in the job.
  int world_size() const { return world_size_; }
  /// Rank on this node; selects the GPU.
  int local_rank() const { return local_rank_; }
  /// Ranks on this node (LOCAL_WORLD_SIZE; the whole job on one node).
  int local_world_size() const { return local_world_size_; }
  /// Whether this group is a subgroup of another (its ranks are indices into the members' list).
  bool is_subgroup() const { return subgroup_; }
  /// Where this rank's model and collectives live: cuda:<n> with NCCL, else CPU.
  torch::Device device() const { return device_; }
  /// The c10d backend; null when world_size == 1.
  c10::intrusive_ptr<c10d::Backend> backend() const { return backend_; }
  /// The rendezvous store; null when world_size == 1.
  c10::intrusive_ptr<c10d::Store> store() const { return store_; }
  /// "gloo", "nccl" or "none" (world size 1).
  std::string backend_name() const { return backend_ ? backend_->getBackendName() : "none"; }
  /// The timeout the collectives of this group honour now: the checkpoint timeout inside CheckpointWaits, the
  /// collective timeout elsewhere.
  std::chrono::milliseconds timeout() const {
    return wait_kind_ == WaitKind::checkpoint ? options_.checkpoint_timeout : options_.collective_timeout;
  }
  /// What the collectives of this group wait for now, and the timeout's name for an error message:
  /// "collective timeout 300 s (HPCTRAIN_COLLECTIVE_TIMEOUT_S)".
  WaitKind wait_kind() const { return wait_kind_; }
  std::string describe_timeout() const;
  /// The timeouts this group was made with.
  const Options& options() const { return options_; }
  /// The simulated link its collectives cross (a test seam: Options::simulated_link), or nullptr.
  SimulatedLink* simulated_link() const { return options_.simulated_link.get(); }
  /// Records that a collective failed: the peers may be gone, so the destructor must not wait for them.
  void mark_failed() noexcept { *failed_ = true; }
  /// Whether a collective of this group (or of its root group or a sibling subgroup) has failed.
  bool failed() const noexcept { return *failed_; }

 private:
  struct SubgroupTag {};
  /// A subgroup's shell: the parent's device, timeout and failure flag; connect() gives it its backend.
  ProcessGroup(SubgroupTag, const ProcessGroup& parent, int rank, int size);
  /// Builds this group's backend (NCCL on a GPU, else Gloo) over `store` at rank_ of world_size_.
  void connect(const c10::intrusive_ptr<c10d::Store>& store);

  int rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  int local_world_size_ = 1;
  bool subgroup_ = false;
  torch::Device device_{torch::kCPU};
  Options options_;
  WaitKind wait_kind_ = WaitKind::collective;
  friend class CheckpointWaits;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  std::vector<std::shared_ptr<::gloo::transport::Device>> gloo_devices_;  // Gloo's transports, shared with subgroups
  int subgroups_made_ = 0;                    // subgroup() calls so far: each call gets its own key space in the store
  std::string key_space_ = "hpctrain/group";  // where this group's subgroups put their keys
  std::shared_ptr<std::atomic<bool>> failed_ = std::make_shared<std::atomic<bool>>(false);
};

/// While it lives, the collectives of `group` wait up to the checkpoint timeout instead of the collective one:
/// the ranks around a checkpoint wait for each other's files, on a file system that may be slow.
class CheckpointWaits {
 public:
  explicit CheckpointWaits(ProcessGroup& group) : group_(group), previous_(group.wait_kind_) {
    group_.wait_kind_ = WaitKind::checkpoint;
  }
  ~CheckpointWaits() { group_.wait_kind_ = previous_; }
  CheckpointWaits(const CheckpointWaits&) = delete;
  CheckpointWaits& operator=(const CheckpointWaits&) = delete;

 private:
  ProcessGroup& group_;
  WaitKind previous_;
};

/// The environment this rank must start again with before it builds its process group, so that NCCL logs the network
/// it chooses where rank 0's check reads it (job/nccl_network.hpp), or none: a rank that checks nothing, one that
/// began with NCCL's logging set, one whose backend is Gloo (NCCL is the backend only with CUDA, as connect decides).
inline std::optional<Environment> environment_for_nccl_check(const slurm::World& world, const Options& options,
                                                             const Environment& environment) {
  const auto check = nccl_network_check(world.rank, world.world_size > world.local_world_size, options.nccl_network);
#if defined(USE_C10D_NCCL)
  if (check && torch::cuda::is_available()) return nccl_capture_environment(*check, options.nccl_network, environment);
#else
  (void)check, (void)environment;
#endif
  return std::nullopt;
}

/// Rendezvouses and returns this rank's process group (world size 1: no store, no backend, no sockets).
inline std::shared_ptr<ProcessGroup> init_process_group(const slurm::World& world, const Options& options = {}) {
  return std::make_shared<ProcessGroup>(world, options);
}

namespace detail {

inline std::string this_hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

/// Splits "eth0,eth1" (GLOO_SOCKET_IFNAME's syntax, as torch reads it) into interface names.
inline std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= text.size()) {
    const auto comma = text.find(',', start);
    const auto end = comma == std::string::npos ? text.size() : comma;
    if (end > start) parts.push_back(text.substr(start, end - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return parts;
}

/// Gloo's transport devices: `interfaces` (GLOO_SOCKET_IFNAME's), else the address this node's hostname resolves
/// to. When every rank is on this node, loopback: nothing leaves the machine then, and hosts whose name resolves
/// to an unbindable address (common on laptops and in containers) still work.
inline std::vector<std::shared_ptr<::gloo::transport::Device>> gloo_devices(
    const slurm::World& world, const std::vector<std::string>& interfaces) {
  std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
  for (const auto& interface : interfaces) {
    try {
      devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(interface));
    } catch (const std::exception& e) {
      throw RuntimeError(errors::runtime_gloo,
                         fmt::format("rank {}: GLOO_SOCKET_IFNAME names interface '{}' that Gloo cannot use: {}",
                                     world.rank, interface, e.what()));
    }
  }
  if (!devices.empty()) return devices;
  const bool single_node = world.local_world_size == world.world_size;
  const std::string host = single_node ? std::string("127.0.0.1") : this_hostname();
  try {
    devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
  } catch (const std::exception& e) {
    throw RuntimeError(errors::runtime_gloo,
                       fmt::format("rank {}: host '{}' does not resolve to an address Gloo can bind "
                                   "(set GLOO_SOCKET_IFNAME to the interface to use): {}",
                                   world.rank, host, e.what()));
  }
  return devices;
}

/// The GPU of this rank among those CUDA_VISIBLE_DEVICES leaves it (slurm/devices.hpp).
inline int cuda_device_index(const slurm::World& world) {
  return slurm::cuda_device_for(world.local_rank, static_cast<int>(torch::cuda::device_count()));
}

inline void check_world(const slurm::World& world) {
  if (world.world_size < 1 || world.rank < 0 || world.rank >= world.world_size)
    throw RuntimeError(errors::runtime_rendezvous,
                       fmt::format("rank {} is outside world size {}", world.rank, world.world_size));
  if (world.world_size > 1 && world.master_addr.empty())
    throw RuntimeError(
        errors::runtime_rendezvous,
        fmt::format("rank {} of {}: no master address (MASTER_ADDR is empty)", world.rank, world.world_size));
  if (world.world_size > 1 && (world.master_port < 1 || world.master_port > 65535))
    throw RuntimeError(errors::runtime_rendezvous, fmt::format("rank {} of {}: master port {} is outside 1..65535",
                                                               world.rank, world.world_size, world.master_port));
}

/// Whether a TCP connection to host:port can be opened within `limit` (connection refused: at once).
inline bool accepts_connections(const std::string& host, int port, std::chrono::milliseconds limit) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addresses = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &addresses) != 0) return false;
  bool connected = false;
  for (auto* address = addresses; address && !connected; address = address->ai_next) {
    const int fd =
        ::socket(address->ai_family, address->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, address->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, address->ai_addr, address->ai_addrlen) == 0) {
      connected = true;
    } else if (errno == EINPROGRESS) {
      pollfd waiting{fd, POLLOUT, 0};
      int error = 0;
      socklen_t length = sizeof error;
      connected = ::poll(&waiting, 1, static_cast<int>(limit.count())) == 1 &&
                  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0;
    }
    ::close(fd);
  }
  ::freeaddrinfo(addresses);
  return connected;
}

/// Waits until rank 0's store listens, polling every few milliseconds. c10d's own client retries a refused
/// connection only after about a second, and ranks usually start before rank 0 listens: this saves that
/// second (or two) of every launch. Returns false when `timeout` passes first.
inline bool wait_until_listening(const std::string& host, int port, std::chrono::milliseconds timeout) {
  using namespace std::chrono;
  const auto deadline = steady_clock::now() + timeout;
  auto pause = milliseconds(5);
  while (true) {
    const auto left = duration_cast<milliseconds>(deadline - steady_clock::now());
    if (left <= milliseconds(0)) return false;
    if (accepts_connections(host, port, std::min(left, milliseconds(1000)))) return true;
    std::this_thread::sleep_for(std::min(pause, left));
    pause = std::min(pause * 2, milliseconds(100));
  }
}

/// The backends' own limit: the longest of the collective and checkpoint timeouts, so that each wait's own
/// (Work::wait with the group's current timeout) is the one that fires, naming itself.
inline std::chrono::milliseconds backend_timeout(const Options& options) {
  return std::max(options.collective_timeout, options.checkpoint_timeout);
}

inline std::string seconds_text(std::chrono::milliseconds timeout) {
  return timeout.count() % 1000 == 0 ? fmt::format("{} s", timeout.count() / 1000)
                                     : fmt::format("{} ms", timeout.count());
}

inline const std::string& checkout_prefix() {
  static const std::string prefix = "hpctrain/checked_out/";
  return prefix;
}

}  // namespace detail

inline ProcessGroup::ProcessGroup(const slurm::World& world, const Options& options)
    : rank_(world.rank),
      world_size_(world.world_size),
      local_rank_(world.local_rank),
      local_world_size_(world.local_world_size),
      options_(options) {
  detail::check_world(world);
  const bool use_cuda = torch::cuda::is_available();
  if (use_cuda) device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(detail::cuda_device_index(world)));
  if (world_size_ == 1) return;

  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(world.master_port);
  store_options.isServer = rank_ == 0;
  store_options.numWorkers = static_cast<std::size_t>(world_size_);
  store_options.waitWorkers = true;  // rank 0 returns only once everyone has connected: a rendezvous
  const auto rendezvous = options_.rendezvous_timeout;
  store_options.timeout = rendezvous;
  // The limit's name, for the messages: which knob to turn.
  const std::string which = "the rendezvous timeout: HPCTRAIN_RENDEZVOUS_TIMEOUT_S, site file rendezvous_timeout_s";
  if (rank_ != 0 && !detail::wait_until_listening(world.master_addr, world.master_port, rendezvous)) {
    throw RuntimeError(
        errors::runtime_rendezvous,
        fmt::format("rank {} of {} could not rendezvous at {}:{} within {} ms ({}): nothing "
                    "accepted a connection there (is rank 0 running?)",
                    rank_, world_size_, world.master_addr, world.master_port, rendezvous.count(), which));
  }
  try {
    store_ = c10::make_intrusive<c10d::TCPStore>(world.master_addr, store_options);
  } catch (const std::exception& e) {
    throw RuntimeError(
        errors::runtime_rendezvous,
        fmt::format("rank {} of {} could not rendezvous at {}:{} within {} ms ({}): {}", rank_, world_size_,
                    world.master_addr, world.master_port, rendezvous.count(), which, e.what()));
  }
  // Backends get their own key space, so that ours (checkout) cannot collide with theirs.
  try {
#if defined(USE_C10D_NCCL)
    if (!use_cuda) gloo_devices_ = detail::gloo_devices(world, options_.gloo_interfaces);
#else
    gloo_devices_ = detail::gloo_devices(world, options_.gloo_interfaces);
#endif
    connect(c10::make_intrusive<c10d::PrefixStore>("hpctrain/backend", store_));
  } catch (const RuntimeError&) {
    throw;
  } catch (const std::exception& e) {
    throw RuntimeError(errors::runtime_rendezvous,
                       fmt::format("rank {} of {} could not connect its backend through {}:{}: {}", rank_, world_size_,
                                   world.master_addr, world.master_port, e.what()));
  }
}

inline void ProcessGroup::connect(const c10::intrusive_ptr<c10d::Store>& store) {
#if defined(USE_C10D_NCCL)
  if (device_.is_cuda()) {
    c10::cuda::set_device(device_.index());
    // On an efa or infiniband site, rank 0 of a job over several nodes reads the network NCCL logged choosing (it
    // began with NCCL's logging set: environment_for_nccl_check), and fails if that is TCP sockets.
    const auto network_check =
        subgroup_ ? std::nullopt : nccl_network_check(rank_, world_size_ > local_world_size_, options_.nccl_network);
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = detail::backend_timeout(options_);
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank_, world_size_, nccl_options);
    // Bound device + eager connect (as torch.distributed does with device_id=): the communicator is built
    // now, inside the rendezvous timeout, instead of at the first collective.
    nccl->setBoundDeviceId(device_);
    nccl->eagerConnectSingleDevice(device_);
    if (network_check) {
      fmt::print("{}\n", check_nccl_network(*network_check));
      std::fflush(stdout);
    }
    backend_ = nccl;
    return;
  }
#endif
  device_ = torch::Device(torch::kCPU);  // no NCCL compiled in: Gloo, on CPU tensors
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(detail::backend_timeout(options_));
  gloo_options->devices = gloo_devices_;
  backend_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank_, world_size_, gloo_options);
}

inline ProcessGroup::ProcessGroup(SubgroupTag, const ProcessGroup& parent, int rank, int size)
    : rank_(rank),
      world_size_(size),
      local_rank_(parent.local_rank_),
      local_world_size_(parent.local_world_size_),
      subgroup_(true),
      device_(parent.device_),
      options_(parent.options_),
      store_(parent.store_),
      gloo_devices_(parent.gloo_devices_),
      failed_(parent.failed_) {}

inline std::shared_ptr<ProcessGroup> ProcessGroup::subgroup(const std::vector<int>& ranks, const std::string& tag) {
  const auto here = std::find(ranks.begin(), ranks.end(), rank_);
  const bool ascending =
      std::adjacent_find(ranks.begin(), ranks.end(), [](int a, int b) { return a >= b; }) == ranks.end();
  if (here == ranks.end() || !ascending || ranks.front() < 0 || ranks.back() >= world_size_)
    throw SpecError(
        errors::spec_sharding, fmt::format("subgroup ranks [{}]", fmt::join(ranks, ", ")),
        fmt::format("a subgroup of rank {} of {} lists ranks in ascending order within [0, {}), this rank among them",
                    rank_, world_size_, world_size_));
  const int call = subgroups_made_++;
  auto group = std::shared_ptr<ProcessGroup>(
      new ProcessGroup(SubgroupTag{}, *this, static_cast<int>(here - ranks.begin()), static_cast<int>(ranks.size())));
  group->key_space_ = fmt::format("{}/{}/{}", key_space_, call, tag);
  if (group->world_size_ == 1) return group;
  try {
    group->connect(c10::make_intrusive<c10d::PrefixStore>(group->key_space_ + "/backend", store_));
  } catch (const std::exception& e) {
    throw RuntimeError(errors::runtime_rendezvous,
                       fmt::format("rank {} of {} could not connect subgroup '{}' (ranks {}): {}", rank_, world_size_,
                                   tag, fmt::join(ranks, ", "), e.what()));
  }
  return group;
}

inline std::string ProcessGroup::describe_timeout() const {
  return wait_kind_ == WaitKind::checkpoint
             ? fmt::format("checkpoint timeout {}: HPCTRAIN_CHECKPOINT_TIMEOUT_S, site file checkpoint_timeout_s",
                           detail::seconds_text(timeout()))
             : fmt::format("collective timeout {}: HPCTRAIN_COLLECTIVE_TIMEOUT_S, site file collective_timeout_s",
                           detail::seconds_text(timeout()));
}

inline ProcessGroup::~ProcessGroup() {
  if (world_size_ == 1) return;
  if (subgroup_) {  // the root group keeps the store and checks out; a subgroup's peers may have left already
    try {
      if (backend_) backend_->shutdown();
    } catch (const std::exception&) {
    }
    return;
  }
  // Rank 0 hosts the store: if it left first, a slower rank's last store access would fail. So every rank
  // checks out and rank 0 waits for all of them. After a failure (or while an exception unwinds) peers
  // may be dead: waiting would only delay the exit that --kill-on-bad-exit needs.
  if (!*failed_ && std::uncaught_exceptions() == 0 && store_) {
    try {
      store_->set(detail::checkout_prefix() + std::to_string(rank_), std::vector<std::uint8_t>{1});
      if (rank_ == 0) {
        std::vector<std::string> keys;
        for (int r = 0; r < world_size_; ++r) keys.push_back(detail::checkout_prefix() + std::to_string(r));
        store_->wait(keys, options_.rendezvous_timeout);
      }
    } catch (const std::exception&) {
      // A peer left without checking out; it has failed on its own and reports that itself.
    }
  }
  try {
    if (backend_) backend_->shutdown();
  } catch (const std::exception&) {
  }
  backend_.reset();
  store_.reset();
}

}  // namespace hpctrain::dist
