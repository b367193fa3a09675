// One rank of the multi-process dist tests (tests/dist/multi_process_test.cpp starts two of these with
// RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set). Each mode checks its property inside the ranks and
// exits 0 when it holds; what the parent compares across ranks is printed as `key=value` lines.
//   dist_worker gradients <micro_steps>  gradients after one step equal one process's on the whole batch
//   dist_worker steps <n>                parameters stay bit-identical across ranks after n steps
//   dist_worker overlap                  the first bucket's all-reduce starts before backward ends
//   dist_worker forever                  trains until killed (a peer's death must end it non-zero)
//   dist_worker collectives              all_reduce_sum, any_rank, barrier across ranks
//   dist_worker unused                   a parameter only rank 0 uses: averaged with rank 1's zeros, reported
//   dist_worker idle-wait                rank 1 joins an all-reduce 2 s late; rank 0 prints the wall and CPU seconds
//                                        its wait took (a wait that polls would burn a core meanwhile)
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <hpctrain/dist/dist.hpp>
#include <hpctrain/dist/lagged_sum.hpp>
#include <hpctrain/dist/shard_collectives.hpp>
#include <hpctrain/slurm/world.hpp>

namespace dist = hpctrain::dist;

namespace {

constexpr std::int64_t per_rank_batch = 8;
constexpr std::int64_t features = 16;
constexpr std::int64_t classes = 4;

/// Several layers, so that small buckets give several all-reduces, plus a BatchNorm buffer to broadcast.
torch::nn::Sequential make_model(bool batch_norm = true) {
  torch::nn::Sequential model(torch::nn::Linear(features, 32), torch::nn::ReLU(), torch::nn::Linear(32, 32));
  if (batch_norm) model->push_back(torch::nn::BatchNorm1d(32));
  model->push_back(torch::nn::Tanh());
  model->push_back(torch::nn::Linear(32, 32));
  model->push_back(torch::nn::ReLU());
  model->push_back(torch::nn::Linear(32, classes));
  return model;
}

/// The global batch of step `step`: the same on every rank; rank r trains on rows [r*b, (r+1)*b).
std::pair<torch::Tensor, torch::Tensor> global_batch(int world_size, int step) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  auto inputs = torch::randn({per_rank_batch * world_size, features}, generator);
  auto targets = torch::randint(0, classes, {per_rank_batch * world_size}, generator);
  return {inputs, targets};
}

dist::GradientSyncOptions small_buckets() {
  dist::GradientSyncOptions options;
  options.first_bucket_bytes = 1024;  // about one layer per bucket: several buckets on this small model
  options.bucket_bytes = 4096;
  return options;
}

dist::Options options_from_environment() {
  dist::Options options;
  if (const char* timeout = std::getenv("HPCTRAIN_DIST_TIMEOUT_MS"))
    options.timeouts(std::chrono::milliseconds(std::stol(timeout)));
  return options;
}

std::uint64_t fnv1a(const torch::Tensor& tensor) {
  auto contiguous = tensor.contiguous();
  const auto* bytes = static_cast<const unsigned char*>(contiguous.data_ptr());
  std::uint64_t hash = 1469598103934665603ull;
  for (std::size_t i = 0; i < contiguous.nbytes(); ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
  return hash;
}

// (a) World-2 gradients (with `micro_steps` accumulation steps per rank) against one process's gradients
// on the concatenated batch, from the same initial parameters (rank 0's, broadcast).
int check_gradients(dist::ProcessGroup& group, const std::shared_ptr<dist::ProcessGroup>& shared, int micro_steps) {
  // No BatchNorm here: its statistics depend on how the batch is split, and the reference sees it whole.
  torch::manual_seed(11 + group.rank());  // different initialisation per rank: the broadcast must fix it
  auto model = make_model(false);
  auto reference = make_model(false);
  dist::GradientSync sync(shared, *model, small_buckets());  // broadcasts rank 0's parameters
  {
    torch::NoGradGuard no_grad;
    auto from = model->parameters();
    auto to = reference->parameters();
    for (std::size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  }
  const int world = group.world_size();
  const std::int64_t micro_batch = per_rank_batch / micro_steps;
  auto [inputs, targets] = global_batch(world, 0);
  for (int micro = 0; micro < micro_steps; ++micro) {
    sync.set_sync(micro == micro_steps - 1);
    const auto rows = group.rank() * per_rank_batch + micro * micro_batch;
    auto loss = torch::nn::functional::cross_entropy(model->forward(inputs.narrow(0, rows, micro_batch)),
                                                     targets.narrow(0, rows, micro_batch)) /
                micro_steps;
    loss.backward();
  }
  sync.finish();
  torch::nn::functional::cross_entropy(reference->forward(inputs), targets).backward();  // the whole batch at once
  double worst = 0.0;
  auto ours = model->named_parameters();
  auto theirs = reference->parameters();
  bool ok = true;
  for (std::size_t i = 0; i < ours.size(); ++i) {
    const auto& grad = ours[i].value().grad();
    const auto& expected = theirs[i].grad();
    const double difference = (grad - expected).abs().max().item<double>();
    worst = std::max(worst, difference);
    // float32, summed in another order: relative 1e-5 of the gradient's size plus absolute 1e-6.
    if (!torch::allclose(grad, expected, 1e-5, 1e-6)) {
      std::cerr << fmt::format("rank {}: gradient of {} differs by {}\n", group.rank(), ours[i].key(), difference);
      ok = false;
    }
  }
  std::cout << fmt::format("max_abs_difference={:.3e}\n", worst) << std::flush;
  return ok ? 0 : 1;
}

// (b) Many SGD-with-momentum steps on different data per rank; then every rank compares its parameters
// with rank 0's (broadcast) bit for bit, and prints a hash the parent compares too.
int check_steps(dist::ProcessGroup& group, const std::shared_ptr<dist::ProcessGroup>& shared, int steps) {
  torch::manual_seed(7 + group.rank());  // different initialisation per rank: the broadcast must fix it
  auto model = make_model();
  dist::GradientSync sync(shared, *model, small_buckets());
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < steps; ++step) {
    auto [inputs, targets] = global_batch(group.world_size(), step);
    const auto rows = group.rank() * per_rank_batch;
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model->forward(inputs.narrow(0, rows, per_rank_batch)),
                                                     targets.narrow(0, rows, per_rank_batch));
    loss.backward();
    sync.finish();
    optimizer.step();
  }
  // BatchNorm running statistics are per rank (as in torch DDP without SyncBatchNorm): compare parameters.
  std::vector<torch::Tensor> flat;
  for (auto& parameter : model->parameters()) flat.push_back(parameter.detach().reshape({-1}));
  auto mine = torch::cat(flat);
  auto rank0 = mine.clone();
  std::vector<torch::Tensor> buffer{rank0};
  c10d::BroadcastOptions options;
  group.backend()->broadcast(buffer, options)->wait();
  const bool identical = torch::equal(mine, rank0);
  std::cout << fmt::format("parameter_hash={:016x}\n", fnv1a(mine)) << std::flush;
  if (!identical) std::cerr << fmt::format("rank {}: parameters differ from rank 0's\n", group.rank());
  return identical ? 0 : 1;
}

// (c) A hook on the first layer's output gradient runs when backward has reached the first layer: every
// later layer is done, the first layer's own weight gradients are not. At that moment the first bucket
// (the last layer's parameters) must already be on the wire, and the last bucket not yet.
int check_overlap(const std::shared_ptr<dist::ProcessGroup>& shared) {
  auto model = make_model();
  dist::GradientSync sync(shared, *model, small_buckets());
  auto [inputs, targets] = global_batch(shared->world_size(), 0);
  auto first_layer_output = model->begin()->forward(inputs.narrow(0, 0, per_rank_batch));
  std::size_t launched_when_first_layer_reached = 0;
  first_layer_output.register_hook([&](torch::Tensor grad) {
    launched_when_first_layer_reached = sync.launched_bucket_count();
    return grad;
  });
  torch::Tensor hidden = first_layer_output;
  for (auto layer = model->begin() + 1; layer != model->end(); ++layer) hidden = layer->forward(hidden);
  auto loss = torch::nn::functional::cross_entropy(hidden, targets.narrow(0, 0, per_rank_batch));
  loss.backward();
  const auto launched_after_backward = sync.launched_bucket_count();
  sync.finish();
  std::cout << fmt::format("buckets={}\nlaunched_at_first_layer={}\nlaunched_after_backward={}\n", sync.bucket_count(),
                           launched_when_first_layer_reached, launched_after_backward)
            << std::flush;
  const bool overlapped = sync.bucket_count() >= 3 && launched_when_first_layer_reached >= 1 &&
                          launched_when_first_layer_reached < sync.bucket_count() &&
                          launched_after_backward == sync.bucket_count();
  return overlapped ? 0 : 1;
}

// (c') GradientSyncOptions::overlap_with_backward = false: nothing is launched during backward, every bucket in
// finish(), and the averaged gradients equal those of the overlapped sync on an identical model, bit for bit
// (the same buckets reduced in the same order; only the launch time differs).
int check_no_overlap(const std::shared_ptr<dist::ProcessGroup>& shared) {
  const auto batch = global_batch(shared->world_size(), 0);
  const auto& inputs = batch.first;
  const auto& targets = batch.second;
  const auto mine = [&](const torch::Tensor& t) {
    return t.narrow(0, shared->rank() * per_rank_batch, per_rank_batch);
  };
  auto gradients_of = [&](torch::nn::Sequential& model, dist::GradientSync& sync,
                          std::size_t& launched_after_backward) {
    torch::nn::functional::cross_entropy(model->forward(mine(inputs)), mine(targets)).backward();
    launched_after_backward = sync.launched_bucket_count();
    sync.finish();
    std::vector<torch::Tensor> grads;
    for (auto& parameter : model->parameters()) grads.push_back(parameter.grad().clone());
    return grads;
  };
  auto overlapped_model = make_model();
  auto deferred_model = make_model();
  {
    torch::NoGradGuard no_grad;  // the same weights (each sync then broadcasts rank 0's to the other rank)
    const auto from = overlapped_model->parameters();
    const auto to = deferred_model->parameters();
    for (std::size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  }
  auto options = small_buckets();
  dist::GradientSync overlapped(shared, *overlapped_model, options);
  options.overlap_with_backward = false;
  dist::GradientSync deferred(shared, *deferred_model, options);
  std::size_t overlapped_launches = 0, deferred_launches = 0;
  const auto expected = gradients_of(overlapped_model, overlapped, overlapped_launches);
  const auto got = gradients_of(deferred_model, deferred, deferred_launches);
  bool equal = expected.size() == got.size();
  for (std::size_t i = 0; equal && i < got.size(); ++i) equal = torch::equal(got[i], expected[i]);
  std::cout << fmt::format("buckets={}\nlaunched_after_backward={}\nlaunched_after_finish={}\ngradients_equal={}\n",
                           deferred.bucket_count(), deferred_launches, deferred.launched_bucket_count(),
                           equal ? "yes" : "no")
            << std::flush;
  return deferred.bucket_count() >= 3 && deferred_launches == 0 &&
                 deferred.launched_bucket_count() == deferred.bucket_count() &&
                 overlapped_launches == overlapped.bucket_count() && equal
             ? 0
             : 1;
}

int check_collectives(dist::ProcessGroup& group) {
  bool ok = true;
  auto expect = [&](bool condition, const std::string& what) {
    if (!condition) std::cerr << fmt::format("rank {}: {}\n", group.rank(), what);
    ok = ok && condition;
  };
  const int world = group.world_size();
  expect(dist::all_reduce_sum(group, group.rank() + 1.0) == world * (world + 1) / 2.0, "sum of rank + 1");
  expect(dist::any_rank(group, group.rank() == world - 1), "any_rank true on the last rank only");
  expect(!dist::any_rank(group, false), "any_rank false everywhere");
  // The lagged vote: each call returns the sums of the call before, the same on every rank, with blocking
  // collectives issued between the calls (as a step's are) and the last rank voting alone at call 2.
  dist::LaggedSum vote(2);
  expect(!vote.exchange(group, {1.0, static_cast<double>(group.rank())}), "the first call returns no sums");
  for (int call = 1; call <= 3; ++call) {
    expect(dist::all_reduce_sum(group, 1.0) == world, "a collective between two votes");
    const auto sums = vote.exchange(group, {call == 2 && group.rank() == world - 1 ? 1.0 : 0.0, 2.0 * call});
    const double stop_votes = call == 1   ? world
                              : call == 3 ? 1
                                          : 0,
                 second = call == 1 ? world * (world - 1) / 2.0 : 2.0 * (call - 1) * world;
    expect(sums && sums->size() == 2 && (*sums)[0] == stop_votes && (*sums)[1] == second,
           fmt::format("the vote read at call {}: {} (expected {}, {})", call, sums ? fmt::format("{}", *sums) : "none",
                       stop_votes, second));
  }
  vote.settle(group);
  // A non-contiguous tensor (a transposed view) is reduced through a copy and written back in place.
  auto matrix = torch::arange(6, torch::kFloat32).view({2, 3}) * (group.rank() + 1);
  auto transposed = matrix.t();
  dist::all_reduce_sum(group, transposed);
  const double factor = world * (world + 1) / 2.0;
  expect(torch::equal(matrix, torch::arange(6, torch::kFloat32).view({2, 3}) * factor),
         "transposed view reduced in place");
  // Broadcasts in buckets of at most 64 bytes: several buckets, a tensor larger than one alone (in place), two
  // dtypes, a non-contiguous view; every rank ends with rank 0's values.
  auto small = torch::full({3}, static_cast<float>(group.rank()));   // 12 bytes
  auto large = torch::full({40}, static_cast<float>(group.rank()));  // 160 bytes: alone, in place
  auto base = torch::full({4, 4}, static_cast<double>(group.rank()));
  auto view = base.t();                                                     // 128 bytes, not contiguous
  auto counts = torch::full({5}, static_cast<std::int64_t>(group.rank()));  // another dtype
  dist::detail::broadcast_from_rank0(group, {small, large, view, counts, small.clone()}, 64);
  expect(small.eq(0).all().item<bool>() && large.eq(0).all().item<bool>() && base.eq(0).all().item<bool>() &&
             counts.eq(0).all().item<bool>(),
         "bucketed broadcast from rank 0");
  dist::barrier(group);
  std::cout << fmt::format("collectives={}\n", ok ? "ok" : "wrong") << std::flush;
  return ok ? 0 : 1;
}

/// Subgroups of a 4-rank world, as hybrid sharding makes them: shard groups {0, 1} and {2, 3}, replica groups
/// {0, 2} and {1, 3}, then a group of this rank alone (no backend). Sums, an in-place all-gather and a broadcast
/// within each give the group's own values; the world group still works beside them, and a second set of the same
/// groups (another key space in the store) connects too.
int check_subgroups(dist::ProcessGroup& world) {
  bool ok = true;
  auto expect = [&](bool condition, const std::string& what) {
    if (!condition) std::cerr << fmt::format("rank {}: {}\n", world.rank(), what);
    ok = ok && condition;
  };
  const int rank = world.rank(), shard = rank / 2, index = rank % 2;
  for (int round = 0; round < 2; ++round) {
    auto shard_group = world.subgroup({2 * shard, 2 * shard + 1}, fmt::format("shard/{}", shard));
    auto replica_group = world.subgroup({index, index + 2}, fmt::format("replica/{}", index));
    auto alone = world.subgroup({rank}, "alone");
    expect(shard_group->rank() == index && shard_group->world_size() == 2, "rank and size in the shard group");
    expect(replica_group->rank() == shard && replica_group->world_size() == 2, "rank and size in the replica group");
    expect(alone->world_size() == 1 && alone->backend() == nullptr && shard_group->is_subgroup(),
           "a group of one has no backend");
    expect(shard_group->backend_name() == world.backend_name(), "the subgroup's backend is the world's kind");
    // Sums of rank + 1 over each group's members.
    expect(dist::all_reduce_sum(*shard_group, rank + 1.0) == (2 * shard + 1) + (2 * shard + 2),
           "sum over the shard group");
    expect(dist::all_reduce_sum(*replica_group, rank + 1.0) == (index + 1) + (index + 3), "sum over the replica group");
    expect(dist::all_reduce_sum(*alone, rank + 1.0) == rank + 1, "sum over a group of one");
    expect(dist::all_reduce_sum(world, 1.0) == 4, "sum over the world beside the subgroups");
    // Each member contributes its world rank into its slice; the gathered buffer lists the group's members.
    auto flat = torch::zeros({4}, torch::kFloat32);
    flat.narrow(0, 2 * replica_group->rank(), 2).fill_(static_cast<float>(rank));
    auto gather = dist::start_all_gather_in_place(*replica_group, flat);
    dist::wait(*replica_group, gather);
    expect(torch::equal(flat, torch::tensor({index, index, index + 2, index + 2}, torch::kFloat32)),
           "all-gather in the replica group");
    auto values = torch::full({3}, static_cast<float>(rank));
    dist::detail::broadcast_from_rank0(*shard_group, {values});
    expect(values.eq(static_cast<float>(2 * shard)).all().item<bool>(), "broadcast from the shard group's first rank");
    dist::barrier(*shard_group);
  }
  std::cout << fmt::format("subgroups={}\n", ok ? "ok" : "wrong") << std::flush;
  return ok ? 0 : 1;
}

// Rank 0 uses an extra head, rank 1 does not: rank 1 contributes zeros, both end with half of rank 0's
// gradient, and rank 1 reports the head's parameters as without gradient.
struct TwoHeads : torch::nn::Module {
  TwoHeads()
      : body(register_module("body", torch::nn::Linear(4, 4))),
        extra(register_module("extra", torch::nn::Linear(4, 1))) {}
  torch::nn::Linear body, extra;
};

int check_unused(dist::ProcessGroup& group, const std::shared_ptr<dist::ProcessGroup>& shared) {
  auto model = std::make_shared<TwoHeads>();
  dist::GradientSync sync(shared, *model);
  auto hidden = model->body->forward(torch::ones({2, 4}));
  auto loss = group.rank() == 0 ? model->extra->forward(hidden).sum() : hidden.sum();
  loss.backward();
  const auto local = group.rank() == 0 ? model->extra->weight.grad().clone() : torch::zeros({1, 4});
  sync.finish();
  auto rank0_local = local.clone();
  dist::all_reduce_sum(group, rank0_local);  // rank 0's local gradient (rank 1 adds zeros)
  const bool averaged = torch::allclose(model->extra->weight.grad(), rank0_local / 2);
  const auto missing = sync.parameters_without_gradient();
  std::cout << fmt::format("without_gradient={}\n", fmt::join(missing, ",")) << std::flush;
  return averaged ? 0 : 1;
}

int train_forever(dist::ProcessGroup& group, const std::shared_ptr<dist::ProcessGroup>& shared) {
  auto model = make_model();
  dist::GradientSync sync(shared, *model, small_buckets());
  torch::optim::SGD optimizer(model->parameters(), 0.01);
  for (int step = 0;; ++step) {
    auto [inputs, targets] = global_batch(group.world_size(), step % 16);
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model->forward(inputs.narrow(0, 0, per_rank_batch)),
                                                     targets.narrow(0, 0, per_rank_batch));
    loss.backward();
    sync.finish();
    optimizer.step();
    if (step == 3) std::cout << "training\n" << std::flush;
  }
}

/// This process's CPU seconds so far, every thread's (Gloo's transport threads included).
double process_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

int check_idle_wait(dist::ProcessGroup& group) {
  auto tensor = torch::ones({1024});
  if (group.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(2));
  const auto wall_start = std::chrono::steady_clock::now();
  const auto cpu_start = process_cpu_seconds();
  auto reduction = dist::start_all_reduce_in_place(group, tensor);
  dist::wait(group, reduction);
  const auto cpu = process_cpu_seconds() - cpu_start;
  const auto wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  if (tensor[0].item<float>() != static_cast<float>(group.world_size())) {
    std::cerr << "the all-reduce summed to " << tensor[0].item<float>() << "\n";
    return 1;
  }
  if (group.rank() == 0) std::cout << fmt::format("wait_wall_s={:.3f}\nwait_cpu_s={:.3f}\n", wall, cpu) << std::flush;
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  torch::set_num_threads(1);  // two ranks on two cores
  const std::string mode = argc > 1 ? argv[1] : "";
  auto group = dist::init_process_group(hpctrain::slurm::world_from_environment(), options_from_environment());
  if (mode == "gradients") return check_gradients(*group, group, argc > 2 ? std::stoi(argv[2]) : 1);
  if (mode == "steps") return check_steps(*group, group, argc > 2 ? std::stoi(argv[2]) : 50);
  if (mode == "overlap") return check_overlap(group);
  if (mode == "no-overlap") return check_no_overlap(group);
  if (mode == "forever") return train_forever(*group, group);
  if (mode == "collectives") return check_collectives(*group);
  if (mode == "unused") return check_unused(*group, group);
  if (mode == "idle-wait") return check_idle_wait(*group);
  if (mode == "subgroups" && group->world_size() == 4) return check_subgroups(*group);
  std::cerr << "usage: dist_worker gradients <micro_steps> | steps <n> | overlap | forever\n";
  return 2;
} catch (const hpctrain::Error& e) {
  std::cerr << e.what() << "\n";
  return hpctrain::exit_failure;
}
