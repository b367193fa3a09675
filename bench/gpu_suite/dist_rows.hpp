#pragma once
// Rows "dist.*": the process group and the data-parallel strategies on the device, against the same step
// computed by one CPU process in fp32 (the reference).
//
//   dist.collectives   a world-1 backend of the device's kind (NCCL on CUDA, Gloo on the CPU) built over a
//                      HashStore, running the three collectives the strategies issue (all_reduce,
//                      _reduce_scatter_base, _allgather_base) on a 25 MiB bucket. At world 1 the strategies
//                      issue none (dist/collectives.hpp returns early), so this row is what proves that
//                      NCCL's communicator and kernels work from an hpctrain binary on a one-GPU machine.
//   dist.ddp.<p>       one step of Replicated (bucketed all-reduce during backward) on a small GPT-2, each
//                      rank its slice of the global batch, precision p: averaged gradients and the SGD update
//                      against the reference's.
//   dist.zero3.<p>     the same with ZeRO-3 (FullyShardedStrategy): the update, after gather_full_model().
//   dist.ddp.overlap   the switch GradientSyncOptions::overlap_with_backward: fp32 steps with every all-reduce
//                      after backward against launched during it, ms per step; the updates must be equal.
//   dist.zero3.prefetch  the switch FullyShardedStrategy::prefetch_next_block: each block gathered when reached
//                      against the next one gathered while the current one runs, ms per step and the most
//                      bytes gathered at once; the updates must be equal. Both skip at world 1 (no collectives).
//
// The strategy rows run at world 2 when two devices are there (two GPUs; on the CPU always, over Gloo), as
// ranks of this binary started by hpctrain::launch_local; rank 0 computes the reference and prints the rows.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#if defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <hpctrain/dist/dist.hpp>
#include <hpctrain/lm/loss.hpp>
#include <hpctrain/models/gpt2.hpp>
#include <hpctrain/train/precision.hpp>
#include <hpctrain/train/strategies/fully_sharded.hpp>
#include <hpctrain/train/strategies/replicated.hpp>
#include <hpctrain/train/strategies/sharded.hpp>

#include "compare.hpp"
#include "report.hpp"

namespace hpctrain_gpu_suite {

namespace dist_rows {

/// The small GPT-2 of the strategy rows: big enough for several buckets and blocks, small enough that the
/// fp32 CPU reference takes a second.
inline hpctrain::models::GPT2Config model_config(bool cuda) {
  hpctrain::models::GPT2Config config;
  config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0;
  config.vocab_size = cuda ? 4096 : 512;
  config.n_layer = cuda ? 4 : 2;
  config.n_head = 4;
  config.n_embd = cuda ? 256 : 64;
  config.n_positions = cuda ? 256 : 32;
  return config;
}

/// Rows per rank and tokens per row of the global batch (world · rows_per_rank rows).
inline std::int64_t rows_per_rank(bool cuda) { return cuda ? 4 : 2; }
inline std::int64_t sequence(bool cuda) { return cuda ? 256 : 32; }
inline constexpr double learning_rate = 0.5;  // SGD: the update is -lr·gradient, so it shows the gradient's error

/// The global batch, the same on every rank: [world · rows_per_rank, sequence + 1] token ids.
inline torch::Tensor global_tokens(bool cuda, int world) {
  torch::manual_seed(1);
  return torch::randint(model_config(cuda).vocab_size, {world * rows_per_rank(cuda), sequence(cuda) + 1}, torch::kLong);
}

inline torch::Tensor mean_loss(hpctrain::models::GPT2& model, const torch::Tensor& tokens) {
  const auto t = tokens.size(1) - 1;
  return hpctrain::lm::token_loss(model->forward(tokens.narrow(1, 0, t)), tokens.narrow(1, 1, t));
}

/// What a step leaves to compare: averaged gradients (empty when sharded) and the update of every parameter.
struct StepResult {
  std::vector<torch::Tensor> gradients;
  std::vector<torch::Tensor> updates;
};

inline std::vector<torch::Tensor> cpu_copies(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> copies;
  for (const auto& tensor : tensors) copies.push_back(tensor.detach().to(torch::kCPU, torch::kFloat32).clone());
  return copies;
}

inline std::vector<torch::Tensor> differences(const std::vector<torch::Tensor>& after,
                                              const std::vector<torch::Tensor>& before) {
  std::vector<torch::Tensor> out;
  for (std::size_t i = 0; i < after.size(); ++i) out.push_back(after[i] - before[i]);
  return out;
}

/// The strategies' optimizer factory: plain SGD at `lr` over the tensors it is given.
inline auto sgd(double lr) {
  return [lr](const hpctrain::NamedParameters& named) {
    std::vector<torch::Tensor> tensors;
    for (const auto& item : named) tensors.push_back(item.second);
    return std::make_unique<torch::optim::SGD>(tensors, torch::optim::SGDOptions(lr));
  };
}

/// The reference: one CPU process, fp32, the whole global batch, plain SGD.
inline StepResult reference_step(bool cuda, const torch::Tensor& tokens) {
  torch::manual_seed(0);
  hpctrain::models::GPT2 model(model_config(cuda));
  model->train();
  const auto before = cpu_copies(model->parameters());
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(learning_rate));
  mean_loss(model, tokens).backward();
  StepResult result;
  std::vector<torch::Tensor> gradients;
  for (const auto& parameter : model->parameters()) gradients.push_back(parameter.grad());
  result.gradients = cpu_copies(gradients);
  optimizer.step();
  result.updates = differences(cpu_copies(model->parameters()), before);
  return result;
}

/// One step of `strategy_name` ("replicated" or "zero3") on this rank's slice, at `precision`.
inline StepResult strategy_step(const std::shared_ptr<hpctrain::dist::ProcessGroup>& group,
                                const std::string& strategy_name, hpctrain::Precision precision, bool cuda,
                                const torch::Tensor& tokens) {
  torch::manual_seed(0);
  hpctrain::models::GPT2 model(model_config(cuda));
  const auto before = cpu_copies(model->parameters());
  model->to(group->device());
  model->train();
  auto strategy =
      hpctrain::make_zero_strategy(strategy_name == "zero3" ? hpctrain::ZeroStage::zero3 : hpctrain::ZeroStage::none);
  strategy->setup({group, model.ptr(), sgd(learning_rate), precision});
  const auto rows = rows_per_rank(cuda);
  const auto slice = tokens.narrow(0, group->rank() * rows, rows).to(group->device());
  strategy->zero_grad();
  strategy->set_sync(true);
  torch::Tensor loss;
  {
    hpctrain::AutocastScope autocast(precision, group->device());
    loss = mean_loss(model, slice);
  }
  loss.backward();
  strategy->finish_gradients();
  StepResult result;
  if (strategy_name != "zero3") {
    std::vector<torch::Tensor> gradients;
    for (const auto& parameter : model->parameters()) gradients.push_back(parameter.grad());
    result.gradients = cpu_copies(gradients);
  }
  strategy->step();
  strategy->gather_full_model();
  result.updates = differences(cpu_copies(model->parameters()), before);
  return result;
}

/// `steps` fp32 SGD steps of `strategy` on this rank's slice after one warmup step: the update of every
/// parameter over all of them and the milliseconds per step (the strategy's collectives waited for).
struct TimedSteps {
  std::vector<torch::Tensor> updates;
  double ms_per_step = 0;
  std::size_t peak_gathered_bytes = 0;  // ZeRO-3: the most block bytes gathered at once during the steps
};

inline TimedSteps timed_steps(const std::shared_ptr<hpctrain::dist::ProcessGroup>& group,
                              hpctrain::DataParallelStrategy& strategy, bool cuda, const torch::Tensor& tokens,
                              int steps) {
  torch::manual_seed(0);
  hpctrain::models::GPT2 model(model_config(cuda));
  const auto before = cpu_copies(model->parameters());
  model->to(group->device());
  model->train();
  strategy.setup({group, model.ptr(), sgd(learning_rate / 10), hpctrain::Precision::fp32});
  const auto rows = rows_per_rank(cuda);
  const auto slice = tokens.narrow(0, group->rank() * rows, rows).to(group->device());
  auto step = [&] {
    strategy.zero_grad();
    strategy.set_sync(true);
    mean_loss(model, slice).backward();
    strategy.finish_gradients();
    strategy.step();
  };
  step();
  if (cuda) torch::cuda::synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  if (cuda) torch::cuda::synchronize();
  TimedSteps out;
  out.ms_per_step = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / steps;
  if (const auto* full = dynamic_cast<const hpctrain::FullyShardedStrategy*>(&strategy))
    out.peak_gathered_bytes = full->peak_gathered_bytes();
  strategy.gather_full_model();  // gathers every block: read the peak before
  out.updates = differences(cpu_copies(model->parameters()), before);
  return out;
}

/// A switch's row: the same steps with it off and on; equal updates pass.
inline Row switch_row(std::string id, std::string label, const TimedSteps& off, const TimedSteps& on) {
  const double error = relative_error(on.updates, off.updates);
  Row row{std::move(id), std::move(label), error <= 1e-6 ? Status::pass : Status::fail, "", nlohmann::json::object()};
  row.result = fmt::format("{:.1f} ms -> {:.1f} ms per step ({:.2f}x); updates {}", off.ms_per_step, on.ms_per_step,
                           off.ms_per_step / on.ms_per_step, within(error, 1e-6));
  row.figures = {{"off_ms", off.ms_per_step},
                 {"on_ms", on.ms_per_step},
                 {"speedup", off.ms_per_step / on.ms_per_step},
                 {"update_relative_error", error}};
  return row;
}

/// The row of a step's `result` against the `reference` (on rank 0).
inline Row strategy_row(const hpctrain::dist::ProcessGroup& group, const std::string& strategy_name,
                        hpctrain::Precision precision, const StepResult& result, const StepResult& reference) {
  const std::string precision_name(hpctrain::to_string(precision));
  const std::string id = fmt::format("dist.{}.{}", strategy_name == "zero3" ? "zero3" : "ddp", precision_name);
  const std::string label =
      fmt::format("{} step, world {} ({}, {}) vs CPU fp32", strategy_name == "zero3" ? "ZeRO-3" : "DDP (bucketed)",
                  group.world_size(), group.backend_name() == "none" ? "no backend at world 1" : group.backend_name(),
                  precision_name);
  const double tolerance = tolerance_for(precision);
  Row row{id, label, Status::pass, "", nlohmann::json::object()};
  const double update_error = relative_error(result.updates, reference.updates);
  row.figures["update_relative_error"] = update_error;
  row.figures["tolerance"] = tolerance;
  row.figures["world_size"] = group.world_size();
  row.result = "update " + within(update_error, tolerance);
  bool ok = update_error <= tolerance;
  if (!result.gradients.empty()) {
    const double gradient_error = relative_error(result.gradients, reference.gradients);
    row.figures["gradient_relative_error"] = gradient_error;
    row.result = "gradients " + within(gradient_error, tolerance) + ", " + row.result;
    ok = ok && gradient_error <= tolerance;
  }
  row.status = ok ? Status::pass : Status::fail;
  return row;
}

/// A world-1 backend of the device's kind over an in-memory store.
inline c10::intrusive_ptr<c10d::Backend> world_one_backend(const torch::Device& device) {
  auto store = c10::make_intrusive<c10d::HashStore>();
#if defined(USE_C10D_NCCL)
  if (device.is_cuda()) {
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, 0, 1, c10d::ProcessGroupNCCL::Options::create());
    nccl->setBoundDeviceId(device);
    nccl->eagerConnectSingleDevice(device);
    return nccl;
  }
#endif
  TORCH_CHECK(!device.is_cuda(), "this LibTorch was built without NCCL (USE_C10D_NCCL): no CUDA backend");
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, 0, 1, options);
}

inline Row collectives_row(const torch::Device& device) {
  const std::string backend_name = device.is_cuda() ? "nccl" : "gloo";
  Row row{"dist.collectives",
          fmt::format("{} all_reduce, reduce_scatter, all_gather at world 1 (25 MiB)", backend_name), Status::pass, "",
          nlohmann::json::object()};
  auto backend = world_one_backend(device);
  const std::int64_t numel = (25 << 20) / 4;
  auto input = torch::arange(numel, torch::TensorOptions().dtype(torch::kFloat32).device(device)).remainder(977.0);
  const auto start = std::chrono::steady_clock::now();
  std::vector<torch::Tensor> reduced{input.clone()};
  backend->allreduce(reduced)->wait();
  auto scattered = torch::empty_like(input);
  backend->_reduce_scatter_base(scattered, input)->wait();
  auto gathered = torch::empty_like(input);
  backend->_allgather_base(gathered, scattered)->wait();
  if (device.is_cuda()) torch::cuda::synchronize();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const bool ok = reduced[0].equal(input) && scattered.equal(input) && gathered.equal(input);
  backend->shutdown();
  row.status = ok ? Status::pass : Status::fail;
  row.result = ok ? fmt::format("results equal the input, {:.0f} ms", 1e3 * seconds) : "a collective changed the data";
  row.figures["backend"] = backend_name;
  row.figures["milliseconds"] = 1e3 * seconds;
  return row;
}

}  // namespace dist_rows

/// dist.ddp.overlap and dist.zero3.prefetch on this rank (rank 0 prints them); skipped at world 1.
inline int run_switch_rows(const std::shared_ptr<hpctrain::dist::ProcessGroup>& group, bool cuda,
                           const torch::Tensor& tokens) {
  const std::string ddp_label =
      "DDP all-reduce: after backward vs overlapped with it (GradientSyncOptions::overlap_with_backward)";
  const std::string zero3_label =
      "ZeRO-3 gathers: when reached vs next block prefetched (FullyShardedStrategy::prefetch_next_block)";
  if (group->world_size() == 1) {
    if (group->rank() == 0) {
      for (const auto& [id, label] :
           {std::pair{"dist.ddp.overlap", ddp_label}, std::pair{"dist.zero3.prefetch", zero3_label}})
        print(Row{id, label, Status::skip, "skipped: at world 1 the strategies issue no collective to overlap",
                  nlohmann::json::object()});
    }
    return 0;
  }
  const int steps = cuda ? 10 : 2;
  hpctrain::dist::GradientSyncOptions deferred;
  deferred.overlap_with_backward = false;
  hpctrain::Replicated ddp_off(deferred), ddp_on;
  const auto ddp_off_steps = dist_rows::timed_steps(group, ddp_off, cuda, tokens, steps);
  const auto ddp_on_steps = dist_rows::timed_steps(group, ddp_on, cuda, tokens, steps);
  hpctrain::FullyShardedStrategy zero3_off, zero3_on;
  zero3_off.prefetch_next_block(false);
  const auto zero3_off_steps = dist_rows::timed_steps(group, zero3_off, cuda, tokens, steps);
  const auto zero3_on_steps = dist_rows::timed_steps(group, zero3_on, cuda, tokens, steps);
  if (group->rank() != 0) return 0;
  int failures = 0;
  const auto ddp_row = dist_rows::switch_row("dist.ddp.overlap", ddp_label, ddp_off_steps, ddp_on_steps);
  print(ddp_row);
  failures += ddp_row.status == Status::fail;
  auto zero3_row = dist_rows::switch_row("dist.zero3.prefetch", zero3_label, zero3_off_steps, zero3_on_steps);
  // Prefetching holds the next block's gather beside the current one: the memory it costs.
  const auto off_bytes = zero3_off_steps.peak_gathered_bytes, on_bytes = zero3_on_steps.peak_gathered_bytes;
  zero3_row.figures["off_peak_gathered_bytes"] = off_bytes;
  zero3_row.figures["on_peak_gathered_bytes"] = on_bytes;
  zero3_row.result +=
      fmt::format("; most gathered at once {:.2f} -> {:.2f} MiB", off_bytes / 1048576.0, on_bytes / 1048576.0);
  if (on_bytes <= off_bytes) {
    zero3_row.status = Status::fail;
    zero3_row.result += " (prefetching should hold two blocks at once)";
  }
  print(zero3_row);
  failures += zero3_row.status == Status::fail;
  return failures;
}

/// The strategy rows on this rank (rank 0 prints them). Every rank runs every step: they are collective.
inline int run_strategy_rows(const std::shared_ptr<hpctrain::dist::ProcessGroup>& group, bool cuda) {
  const auto tokens = dist_rows::global_tokens(cuda, group->world_size());
  dist_rows::StepResult reference;
  if (group->rank() == 0) reference = dist_rows::reference_step(cuda, tokens);
  int failures = 0;
  for (const std::string strategy : {"replicated", "zero3"}) {
    for (const auto precision : {hpctrain::Precision::fp32, hpctrain::Precision::bf16}) {
      // A throw on one rank leaves its peers waiting in a collective: let it end the process (the group's
      // timeout and launch_local stop the others), and gpu-check reports the rows that never came.
      const auto result = dist_rows::strategy_step(group, strategy, precision, cuda, tokens);
      if (group->rank() == 0) {
        const auto row = dist_rows::strategy_row(*group, strategy, precision, result, reference);
        print(row);
        failures += row.status == Status::fail;
      }
    }
  }
  return failures + run_switch_rows(group, cuda, tokens);
}

}  // namespace hpctrain_gpu_suite
