// Single-process behaviour of the dist layer: world size 1 is free of sockets and exact, rendezvous
// failures name host, port and rank, and the bucket planner follows DDP's rules.
#include <catch2/catch.hpp>

#include <hpctrain/slurm/local_launch.hpp>  // detail::free_local_port

#include <torch/torch.h>

#include <sys/socket.h>
#include <unistd.h>

#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/dist/dist.hpp>

namespace dist = hpctrain::dist;

namespace {

hpctrain::slurm::World world_of(int rank, int world_size, int port) {
  hpctrain::slurm::World world;
  world.rank = rank;
  world.world_size = world_size;
  world.local_rank = rank;
  world.local_world_size = world_size;
  world.master_addr = "127.0.0.1";
  world.master_port = port;
  return world;
}

}  // namespace

TEST_CASE("A world of one has no store and no backend, and every collective is the identity", "[dist]") {
  auto group = dist::init_process_group(world_of(0, 1, 0));
  CHECK(group->rank() == 0);
  CHECK(group->world_size() == 1);
  CHECK(group->backend() == nullptr);
  CHECK(group->store() == nullptr);
  CHECK(group->backend_name() == "none");
  auto tensor = torch::arange(4, torch::kFloat32);
  CHECK(torch::equal(dist::all_reduce_sum(*group, tensor), torch::arange(4, torch::kFloat32)));
  CHECK(dist::all_reduce_sum(*group, 2.5) == 2.5);
  CHECK(dist::any_rank(*group, true));
  CHECK_FALSE(dist::any_rank(*group, false));
  dist::barrier(*group);
}

TEST_CASE("At world size 1 GradientSync leaves gradients exactly as backward computed them", "[dist][gradient_sync]") {
  auto group = dist::init_process_group(world_of(0, 1, 0));
  torch::manual_seed(3);
  torch::nn::Linear model(5, 3);
  dist::GradientSync sync(group, *model);
  auto loss = model->forward(torch::randn({4, 5})).pow(2).sum();
  loss.backward();
  const auto expected = model->weight.grad().clone();
  sync.finish();
  CHECK(torch::equal(model->weight.grad(), expected));
  CHECK(sync.launched_bucket_count() == 0);
  CHECK(sync.bucket_count() == 1);
}

namespace {
/// init_process_group as rank `rank` of `world` alone on a free port fails within the 1500 ms rendezvous timeout of
/// `options`, with the message that names the rank, the address and the timeout's two settings.
void check_rendezvous_refused(int rank, int world, dist::Options options) {
  const int port = hpctrain::detail::free_local_port();
  const std::string expected = fmt::format(
      "[hpctrain.runtime.rendezvous] rank {} of {} could not rendezvous at 127.0.0.1:{} within 1500 ms (the "
      "rendezvous timeout: HPCTRAIN_RENDEZVOUS_TIMEOUT_S, site file rendezvous_timeout_s): ",
      rank, world, port);
  REQUIRE_THROWS_MATCHES(
      dist::init_process_group(world_of(rank, world, port), options), hpctrain::RuntimeError,
      Catch::Matchers::Predicate<hpctrain::RuntimeError>(
          [&](const hpctrain::RuntimeError& e) { return std::string(e.what()).rfind(expected, 0) == 0; },
          "message starts with: " + expected));
}
}  // namespace

TEST_CASE("A rank that finds no rendezvous server fails naming host, port and rank", "[dist][rendezvous]") {
  dist::Options options;
  options.timeouts(std::chrono::minutes(10));
  options.rendezvous_timeout = std::chrono::milliseconds(1500);  // the one that governs a rendezvous
  check_rendezvous_refused(1, 2, options);
}

TEST_CASE("Rank 0 gives up when the other ranks never arrive, naming itself", "[dist][rendezvous]") {
  dist::Options options;
  options.timeouts(std::chrono::milliseconds(1500));
  check_rendezvous_refused(0, 3, options);
}

TEST_CASE(
    "A collective waits up to the collective timeout, around a checkpoint up to the checkpoint timeout, and the error "
    "names which",
    "[dist][timeout]") {
  // Two ranks as two threads of this process (Gloo over loopback). Rank 1 enters a barrier that rank 0 never
  // enters: the wait fails after the timeout of its kind, and the message names that timeout and its knobs.
  auto [in_checkpoint, expected] = GENERATE(table<bool, std::string>({
      {false,
       "[hpctrain.runtime.collective] rank 1 of 2: barrier failed (collective timeout 1 s: "
       "HPCTRAIN_COLLECTIVE_TIMEOUT_S, site file collective_timeout_s): "},
      {true,
       "[hpctrain.runtime.collective] rank 1 of 2: barrier failed (checkpoint timeout 2 s: "
       "HPCTRAIN_CHECKPOINT_TIMEOUT_S, site file checkpoint_timeout_s): "},
  }));
  CAPTURE(in_checkpoint);
  const int port = hpctrain::detail::free_local_port();
  dist::Options options;
  options.rendezvous_timeout = std::chrono::seconds(20);
  options.collective_timeout = std::chrono::seconds(1);
  options.checkpoint_timeout = std::chrono::seconds(2);
  std::shared_ptr<dist::ProcessGroup> rank0;
  std::thread starting([&] { rank0 = dist::init_process_group(world_of(0, 2, port), options); });
  auto rank1 = dist::init_process_group(world_of(1, 2, port), options);
  starting.join();
  std::string message;
  {
    std::optional<dist::CheckpointWaits> waits;
    if (in_checkpoint) waits.emplace(*rank1);
    CHECK(rank1->wait_kind() == (in_checkpoint ? dist::WaitKind::checkpoint : dist::WaitKind::collective));
    try {
      dist::barrier(*rank1);
    } catch (const hpctrain::RuntimeError& error) {
      message = error.what();
    }
  }
  CHECK(rank1->wait_kind() == dist::WaitKind::collective);  // the scope ended
  CHECK(message.rfind(expected, 0) == 0);
  CAPTURE(message);
  rank0->mark_failed();  // rank 1 left without checking out: rank 0 must not wait for it
}

TEST_CASE("An impossible world is refused before any socket is opened", "[dist][rendezvous]") {
  using Row = std::tuple<int, int, std::string, int, std::string>;
  auto [rank, world_size, address, port, message] = GENERATE(table<int, int, std::string, int, std::string>({
      Row{2, 2, "127.0.0.1", 29500, "[hpctrain.runtime.rendezvous] rank 2 is outside world size 2"},
      Row{0, 2, "", 29500, "[hpctrain.runtime.rendezvous] rank 0 of 2: no master address (MASTER_ADDR is empty)"},
      Row{1, 2, "127.0.0.1", 70000, "[hpctrain.runtime.rendezvous] rank 1 of 2: master port 70000 is outside 1..65535"},
  }));
  CAPTURE(rank, world_size, address, port);
  auto world = world_of(rank, world_size, port);
  world.master_addr = address;
  REQUIRE_THROWS_WITH(dist::init_process_group(world), message);
}

TEST_CASE("Buckets are filled in reverse registration order, the first one smaller", "[dist][gradient_sync]") {
  dist::GradientSyncOptions options;
  options.first_bucket_bytes = 100;
  options.bucket_bytes = 250;
  const int f32 = static_cast<int>(torch::kFloat32), f64 = static_cast<int>(torch::kFloat64);
  using Shapes = std::vector<dist::detail::ParameterShape>;
  using Plan = std::vector<std::vector<std::size_t>>;
  auto [name, shapes, expected] = GENERATE_COPY(table<std::string, Shapes, Plan>({
      {"first bucket closes at its smaller capacity",
       Shapes{{100, f32, "cpu"}, {100, f32, "cpu"}, {60, f32, "cpu"}, {40, f32, "cpu"}}, Plan{{3, 2}, {1, 0}}},
      {"a parameter larger than any capacity gets a bucket of its own",
       Shapes{{40, f32, "cpu"}, {1000, f32, "cpu"}, {40, f32, "cpu"}}, Plan{{2}, {1}, {0}}},
      {"a dtype change closes the bucket", Shapes{{8, f32, "cpu"}, {8, f64, "cpu"}, {8, f64, "cpu"}},
       Plan{{2, 1}, {0}}},
      {"a device change closes the bucket", Shapes{{8, f32, "cuda:0"}, {8, f32, "cpu"}}, Plan{{1}, {0}}},
      {"no parameters, no buckets", Shapes{}, Plan{}},
  }));
  CAPTURE(name);
  CHECK(dist::detail::plan_buckets(shapes, options) == expected);
}

TEST_CASE("GradientSync names the parameters of each bucket, last layer first", "[dist][gradient_sync]") {
  auto group = dist::init_process_group(world_of(0, 1, 0));
  torch::nn::Sequential model(torch::nn::Linear(4, 4), torch::nn::Linear(4, 2));
  dist::GradientSyncOptions options;
  options.first_bucket_bytes = 40;  // 2x4 + 2 floats = 40 bytes: the last layer alone
  dist::GradientSync sync(group, *model, options);
  const std::vector<std::vector<std::string>> expected{{"1.bias", "1.weight"}, {"0.bias", "0.weight"}};
  CHECK(sync.bucket_parameter_names() == expected);
}
