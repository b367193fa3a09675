#pragma once
// Rows "switches.*": the GPU performance switches of issue 21, each timed off and on in the same run.
//   switches.fused_adamw     torch::optim::AdamW against hpctrain::FusedAdamW (ATen's fused kernel) on GPT-2
//                            124M's parameter shapes (tiny on the CPU): ms per optimizer step, and the parameters
//                            after the timed steps agree.
//   switches.pinned_batches  Training::pin_memory's path: a GPT-2 sized token batch copied to the device from
//                            pageable memory (blocking) against pinned memory (non_blocking) in front of a step's
//                            worth of matmuls: ms per iteration. Needs CUDA (pinned memory is CUDA's); skipped on
//                            the CPU, saying so.
//   switches.no_host_sync    the rule "no host synchronisation in the step" checked: warmed-up bf16 steps of
//                            Replicated and of ZeRO-3 (forward, backward, finish_gradients, clip_grad_norm,
//                            FusedAdamW) under CUDA's sync debug mode "error" (torch.cuda.set_sync_debug_mode),
//                            which throws at any synchronising CUDA call. Needs CUDA; skipped on the CPU.
//   switches.wide_products   a weight gradient's product at TinyLlama's MLP shape (8192 tokens, 5632 x 2048) as
//                            autograd computes it under autocast (a bf16 product, then a cast to fp32) against
//                            models::detail::product_into (cuBLAS with bf16 operands and an fp32 result, the
//                            default of models/kernels/mixed_precision_products.hpp): ms per product, and each one's
//                            error against the fp32 product of the same bf16 values.
//   switches.fused_swiglu    SwiGLU's elementwise part at TinyLlama's MLP shape (8192 tokens, 5632 columns, bf16),
//                            forward and backward, as autograd computes it (silu, mul, the halves' concatenated
//                            gradients) against models::swiglu (on CUDA one runtime-compiled kernel each way,
//                            models/kernels/swiglu.hpp): ms per call, which path ran, the output's and gradient's
//                            distance.
//   switches.fused_rotary    rotary embeddings of TinyLlama's queries (8 x 1024 tokens, 32 heads of 64, bf16 under
//                            autocast), forward and backward: the composite operations against the runtime-compiled
//                            kernels (models/kernels/rotary.hpp): ms per call, which path ran, the distance.
//   switches.fused_rmsnorm   RMSNorm of a bf16 row with a bf16 weight at Llama 3.1 8B's width (8 x 1024 tokens of
//                            4096: a norm on ZeRO-3's bf16 residual stream), forward and backward: transformers'
//                            operations under autograd against models::rms_norm (on CUDA one runtime-compiled kernel
//                            each way, models/kernels/rms_norm.hpp): ms per call, which path ran, the distances.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <hpctrain/lm/chunked_loss.hpp>
#include <hpctrain/lm/loss.hpp>
#include <hpctrain/models/kernels/cross_entropy_rows.hpp>
#include <hpctrain/models/kernels/mixed_precision_products.hpp>
#include <hpctrain/models/kernels/rms_norm.hpp>
#include <hpctrain/models/kernels/rotary.hpp>
#include <hpctrain/models/kernels/scoped_switch.hpp>
#include <hpctrain/models/kernels/swiglu.hpp>
#include <hpctrain/train/optim/fused_adamw.hpp>
#include <hpctrain/train/precision.hpp>

#include <hpctrain/dist/dist.hpp>
#include <hpctrain/slurm/world.hpp>
#include <hpctrain/train/strategies/fully_sharded.hpp>
#include <hpctrain/train/strategies/replicated.hpp>

#include "compare.hpp"
#include "device_memory.hpp"
#include "dist_rows.hpp"
#include "report.hpp"

#if defined(HPCTRAIN_GPU_SUITE_CUDA_MEMORY)  // c10/cuda's headers are there (device_memory.hpp)
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace hpctrain_gpu_suite {

namespace switch_rows {

/// Waits for the device's queued work, so that a wall-clock interval covers it.
inline void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

/// GPT-2 124M's parameter shapes (148 tensors), or a tiny stand-in of the same structure on the CPU.
inline std::vector<std::vector<std::int64_t>> gpt2_shapes(bool cuda) {
  const std::int64_t d = cuda ? 768 : 32, vocab = cuda ? 50257 : 97, positions = cuda ? 1024 : 64,
                     layers = cuda ? 12 : 2;
  std::vector<std::vector<std::int64_t>> shapes{{vocab, d}, {positions, d}};
  for (std::int64_t l = 0; l < layers; ++l) {
    for (const auto& shape : std::vector<std::vector<std::int64_t>>{
             {d}, {d}, {d, 3 * d}, {3 * d}, {d, d}, {d}, {d}, {d}, {d, 4 * d}, {4 * d}, {4 * d, d}, {d}})
      shapes.push_back(shape);
  }
  shapes.push_back({d});
  shapes.push_back({d});
  return shapes;
}

inline std::vector<torch::Tensor> parameters(const std::vector<std::vector<std::int64_t>>& shapes,
                                             const torch::Device& device) {
  torch::manual_seed(11);
  std::vector<torch::Tensor> out;
  for (const auto& shape : shapes) {
    out.push_back(torch::randn(shape, torch::TensorOptions().device(device)).requires_grad_());
    out.back().mutable_grad() = torch::randn(shape, torch::TensorOptions().device(device)) * 1e-2;
  }
  return out;
}

/// Milliseconds per optimizer step of `Optimizer` over `params`, after warmup steps.
template <class Optimizer>
double ms_per_step(const std::vector<torch::Tensor>& params, const torch::Device& device, int warmup, int steps) {
  Optimizer optimizer(params, torch::optim::AdamWOptions(1e-3).weight_decay(0.1));
  for (int i = 0; i < warmup; ++i) optimizer.step();
  synchronize(device);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) optimizer.step();
  synchronize(device);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / steps;
}

inline Row fused_adamw_row(const torch::Device& device) {
  const bool cuda = device.is_cuda();
  const auto shapes = gpt2_shapes(cuda);
  const int warmup = 3, steps = cuda ? 20 : 5;
  const auto plain_params = parameters(shapes, device);
  const auto fused_params = parameters(shapes, device);
  const double plain_ms = ms_per_step<torch::optim::AdamW>(plain_params, device, warmup, steps);
  const double fused_ms = ms_per_step<hpctrain::FusedAdamW>(fused_params, device, warmup, steps);
  std::int64_t numel = 0;
  for (const auto& p : plain_params) numel += p.numel();
  // Same gradients every step on both sides: the parameters must still agree (fp32; kernels reassociate).
  const double error = relative_error(fused_params, plain_params);
  Row row{"switches.fused_adamw", "AdamW step: torch::optim::AdamW vs hpctrain::FusedAdamW", Status::pass, "",
          nlohmann::json::object()};
  row.status = error <= 1e-5 ? Status::pass : Status::fail;
  row.result = fmt::format(
      "{:.2f} ms -> {:.2f} ms per step ({:.2f}x) over {} tensors, {:.1f}M parameters; parameters {}", plain_ms,
      fused_ms, plain_ms / fused_ms, shapes.size(), static_cast<double>(numel) / 1e6, within(error, 1e-5));
  row.figures = {{"plain_ms", plain_ms},     {"fused_ms", fused_ms}, {"speedup", plain_ms / fused_ms},
                 {"tensors", shapes.size()}, {"parameters", numel},  {"relative_error", error}};
  return row;
}

/// Milliseconds per call of `run` on `device` (one call first, to warm up; then the mean of `iterations`, the device's
/// queued work included).
template <typename Run>
double ms_per_call(Run run, const torch::Device& device, int iterations) {
  (void)run();
  synchronize(device);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) (void)run();
  synchronize(device);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / iterations;
}

/// Milliseconds per iteration of: batch to the device, then a step's worth of matmuls that read it.
inline double ms_per_iteration(const torch::Tensor& host_batch, bool non_blocking, const torch::Device& device,
                               int iterations) {
  const auto weight = torch::randn({4096, 4096}, torch::TensorOptions().device(device).dtype(torch::kBFloat16));
  auto work = torch::randn({8192, 4096}, torch::TensorOptions().device(device).dtype(torch::kBFloat16));
  return ms_per_call(
      [&] {
        const auto batch = host_batch.to(device, non_blocking);
        auto x = work;
        for (int layer = 0; layer < 4; ++layer) x = torch::matmul(x, weight);
        return batch.sum() + x.sum();
      },
      device, iterations);
}

inline Row pinned_batches_row(const torch::Device& device) {
  Row row{"switches.pinned_batches",
          "batch to GPU: pageable + blocking vs pinned + non_blocking (Training::pin_memory)", Status::skip, "",
          nlohmann::json::object()};
  if (!device.is_cuda()) {
    row.result = "skipped: pinned host memory needs a CUDA device (Training::pin_memory has no effect on the CPU)";
    return row;
  }
  // GPT-2's batch as the Trainer moves it: 16 x 1024 token ids and targets (int64), here as one tensor of both.
  const auto pageable = torch::randint(50257, {2, 16, 1024}, torch::kLong);
  const auto pinned = pageable.pin_memory();
  const int iterations = 50;
  const double pageable_ms = ms_per_iteration(pageable, false, device, iterations);
  const double pinned_ms = ms_per_iteration(pinned, true, device, iterations);
  row.status = Status::pass;
  row.result = fmt::format("{:.3f} ms -> {:.3f} ms per iteration ({:.2f}x), {} KiB per batch", pageable_ms, pinned_ms,
                           pageable_ms / pinned_ms, pageable.nbytes() / 1024);
  row.figures = {{"pageable_ms", pageable_ms},
                 {"pinned_ms", pinned_ms},
                 {"speedup", pageable_ms / pinned_ms},
                 {"batch_bytes", pageable.nbytes()}};
  return row;
}

/// Runs `steps` of `strategy` on a small GPT-2 in bf16 with CUDA's sync debug mode at "error" after one warmup
/// step; an empty string when none synchronised, else what CUDA's check said.
inline std::string synchronising_call(hpctrain::DataParallelStrategy& strategy, const torch::Device& device,
                                      int steps) {
#if defined(HPCTRAIN_GPU_SUITE_CUDA_MEMORY)
  const auto group = hpctrain::dist::init_process_group(hpctrain::slurm::World{});
  torch::manual_seed(0);
  hpctrain::models::GPT2 model(dist_rows::model_config(true));
  model->to(device);
  model->train();
  strategy.setup({group, model.ptr(),
                  [](const hpctrain::NamedParameters& named) {
                    std::vector<torch::Tensor> tensors;
                    for (const auto& item : named) tensors.push_back(item.second);
                    return std::make_unique<hpctrain::FusedAdamW>(tensors, torch::optim::AdamWOptions(1e-4));
                  },
                  hpctrain::Precision::bf16});
  const auto tokens = dist_rows::global_tokens(true, 1).to(device);
  torch::Tensor running_loss;
  auto step = [&] {
    strategy.zero_grad();
    strategy.set_sync(true);
    torch::Tensor loss;
    {
      hpctrain::AutocastScope autocast(hpctrain::Precision::bf16, device);
      loss = dist_rows::mean_loss(model, tokens);
    }
    loss.backward();
    const auto contribution = loss.detach().to(torch::kFloat32);  // kept on the device, as the Trainer keeps it
    running_loss = running_loss.defined() ? running_loss + contribution : contribution;
    strategy.finish_gradients();
    (void)strategy.clip_grad_norm(1.0);
    strategy.step();
  };
  step();  // first use: lazy initialisation (state, workspaces) may synchronise once
  torch::cuda::synchronize(device.index());
  auto& state = c10::cuda::warning_state();
  state.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  std::string caught;
  try {
    for (int i = 0; i < steps; ++i) step();
  } catch (const std::exception& e) {
    caught = e.what();
    caught = caught.substr(0, caught.find('\n'));
  }
  state.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  torch::cuda::synchronize(device.index());
  return caught;
#else
  (void)strategy, (void)device, (void)steps;
  return "this build has no c10/cuda headers";
#endif
}

/// One forward and backward of the head and the loss, whole logits (chunk 0) or chunked: time, the memory it
/// added at its peak, the loss and the gradients.
struct HeadLossRun {
  double ms = 0;
  std::int64_t peak_added = 0;
  double loss = 0;
  std::vector<torch::Tensor> gradients;
};

inline HeadLossRun head_loss_run(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                                 std::int64_t chunk, hpctrain::Precision precision, int repeats) {
  const auto device = hidden.device();
  HeadLossRun run;
  auto once = [&] {
    hidden.mutable_grad() = torch::Tensor();
    weight.mutable_grad() = torch::Tensor();
    torch::Tensor sum;
    {
      hpctrain::AutocastScope autocast(precision, device);
      sum = chunk == 0 ? hpctrain::lm::token_loss_sum(torch::linear(hidden, weight), targets).first
                       : hpctrain::lm::chunked_token_loss_sum(hidden, weight, targets, chunk).first;
    }
    (sum / static_cast<double>(targets.numel())).backward();
    return sum;
  };
  if (device.is_cuda()) (void)once();  // warmup: kernels chosen, the allocator's blocks made
  synchronize(device);
  reset_peak_memory(device);
  const auto before = peak_memory_bytes(device);
  const auto start = std::chrono::steady_clock::now();
  torch::Tensor sum;
  for (int i = 0; i < repeats; ++i) sum = once();
  synchronize(device);
  run.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / repeats;
  run.peak_added = peak_memory_bytes(device) - before;
  run.loss = sum.item<double>();
  run.gradients = {hidden.grad().clone(), weight.grad().clone()};
  return run;
}

/// switches.chunked_loss: the head and the loss at Llama 3's vocabulary (128,256), the whole logits against
/// chunks (lm::chunked_token_loss_sum, `--loss-chunk-tokens`): equal loss and gradients, the time and the
/// memory each adds at its peak. CUDA: 8 x 1024 tokens of width 4096 (Llama 3 8B's head), bf16 autocast,
/// chunks of 2048; CPU: 1024 tokens of width 64 at the CPU's precision, chunks of 128.
inline Row chunked_loss_row(const torch::Device& device) {
  const bool cuda = device.is_cuda();
  const std::int64_t tokens = cuda ? 8192 : 1024, width = cuda ? 4096 : 64, vocabulary = 128256,
                     chunk = cuda ? 2048 : 128;
  const auto precision = hpctrain::resolve_precision(hpctrain::auto_precision, device);
  torch::manual_seed(5);
  const auto options = torch::TensorOptions().device(device);
  const auto weight = (torch::randn({vocabulary, width}, options) * 0.02).requires_grad_();
  const auto hidden = torch::randn({tokens, width}, options).requires_grad_();
  const auto targets = torch::randint(vocabulary, {tokens}, options.dtype(torch::kInt64));
  const int repeats = cuda ? 3 : 1;
  const auto whole = head_loss_run(hidden, weight, targets, 0, precision, repeats);
  const auto chunked = head_loss_run(hidden, weight, targets, chunk, precision, repeats);
  const double tolerance = tolerance_for(precision);
  const double loss_error = relative_error(chunked.loss, whole.loss);
  const double gradient_error = relative_error(chunked.gradients, whole.gradients);
  const auto gib = [](std::int64_t bytes) { return static_cast<double>(bytes) / double(1 << 30); };
  Row row{"switches.chunked_loss", "", Status::pass, "", nlohmann::json::object()};
  row.label = fmt::format(
      "head + loss, {} tokens x vocabulary {} (width {}, {}): whole logits vs chunks of {} (--loss-chunk-tokens)",
      tokens, vocabulary, width, hpctrain::to_string(precision), chunk);
  row.status = loss_error <= tolerance && gradient_error <= tolerance ? Status::pass : Status::fail;
  row.result = fmt::format(
      "{:.1f} ms, {} +{:.2f} GiB -> {:.1f} ms, +{:.2f} GiB ({:.1f}x less); loss {}, gradients {}", whole.ms,
      cuda ? "peak allocated" : "peak RSS", gib(whole.peak_added), chunked.ms, gib(chunked.peak_added),
      static_cast<double>(whole.peak_added) / static_cast<double>(std::max<std::int64_t>(chunked.peak_added, 1)),
      within(loss_error, tolerance), within(gradient_error, tolerance));
  row.figures = {{"whole_ms", whole.ms},
                 {"chunked_ms", chunked.ms},
                 {"whole_peak_added_bytes", whole.peak_added},
                 {"chunked_peak_added_bytes", chunked.peak_added},
                 {"loss_error", loss_error},
                 {"gradient_error", gradient_error},
                 {"tokens", tokens},
                 {"vocabulary", vocabulary},
                 {"width", width},
                 {"chunk", chunk}};
  return row;
}

inline Row no_host_sync_row(const torch::Device& device) {
  Row row{"switches.no_host_sync",
          "no host synchronisation in a step: DDP and ZeRO-3, bf16, under CUDA's sync debug mode", Status::skip, "",
          nlohmann::json::object()};
  if (!device.is_cuda() || !reads_cuda_allocator(device)) {
    row.result = "skipped: CUDA's sync debug mode needs a CUDA device";
    return row;
  }
  hpctrain::Replicated ddp;
  hpctrain::FullyShardedStrategy zero3;
  const auto ddp_sync = synchronising_call(ddp, device, 3);
  const auto zero3_sync = synchronising_call(zero3, device, 3);
  row.status = ddp_sync.empty() && zero3_sync.empty() ? Status::pass : Status::fail;
  row.result = row.status == Status::pass ? "3 steps each, no synchronising CUDA call"
                                          : fmt::format("DDP: {}; ZeRO-3: {}", ddp_sync.empty() ? "none" : ddp_sync,
                                                        zero3_sync.empty() ? "none" : zero3_sync);
  return row;
}

inline Row wide_products_row(const torch::Device& device) {
  const bool cuda = device.is_cuda();
  const std::int64_t tokens = cuda ? 8192 : 256, out = cuda ? 5632 : 96, in = cuda ? 2048 : 64;
  const auto bf16 = torch::TensorOptions().device(device).dtype(torch::kBFloat16);
  const auto g = torch::randn({tokens, out}, bf16), x = torch::randn({tokens, in}, bf16);
  const auto rounded = [&] { return g.t().mm(x).to(torch::kFloat32); };
  const auto wide = [&] { return hpctrain::models::detail::product_into(g.t(), x, torch::kFloat32); };
  const int iterations = cuda ? 50 : 3;
  const double rounded_ms = ms_per_call(rounded, device, iterations);
  const double wide_ms = ms_per_call(wide, device, iterations);
  // The reference: the same bf16 values widened, summed in fp64. The wide product sums `tokens` exact products in
  // fp32: within about √tokens · 2^-24 relative (a reordered sum's error); the rounded one is further off by its
  // rounding to bf16, about 2^-9 relative.
  const auto exact = g.t().to(torch::kFloat64).mm(x.to(torch::kFloat64));
  const auto error = [&](const torch::Tensor& t) {
    return (t.to(torch::kFloat64) - exact).norm().item<double>() / exact.norm().item<double>();
  };
  const double wide_error = error(wide()), rounded_error = error(rounded());
  const double bound = 4 * std::sqrt(static_cast<double>(tokens)) * std::ldexp(1.0, -24);
  Row row{"switches.wide_products", "weight gradient product: bf16 + cast (autograd) vs fp32 result (cuBLAS)",
          Status::pass, "", nlohmann::json::object()};
  row.status = wide_error <= bound ? Status::pass : Status::fail;
  row.result = fmt::format(
      "{:.3f} ms -> {:.3f} ms per product ({:.2f}x) at {}x{}x{}{}; error {:.1e} -> {:.1e} (bound {:.1e})", rounded_ms,
      wide_ms, rounded_ms / wide_ms, out, tokens, in,
      cuda ? (hpctrain::models::detail::cuda_has_wide_product(device) ? ", cuBLAS fp32 result"
                                                                      : ", no fp32-result product: widened operands")
           : "",
      rounded_error, wide_error, bound);
  row.figures = {{"rounded_ms", rounded_ms},
                 {"wide_ms", wide_ms},
                 {"speedup", rounded_ms / wide_ms},
                 {"rounded_error", rounded_error},
                 {"wide_error", wide_error},
                 {"bound", bound},
                 {"tokens", tokens},
                 {"out_features", out},
                 {"in_features", in}};
  return row;
}

/// Which path a runtime-compiled kernel's row ran, and why not the kernel.
inline std::string kernel_path(bool kernels, const torch::Device& device) {
  if (kernels) return "row kernels (NVRTC)";
  if (!device.is_cuda()) return "composite (no runtime-compiled kernels on the CPU)";
  if (!hpctrain::models::runtime_kernels()) return "composite: switched off";
  if (!hpctrain::models::detail::row_kernels_possible(device, torch::kBFloat16))
    return "composite: NVRTC or the CUDA driver not found in the process";
  return "composite: the kernels' probe failed";
}

/// One forward and backward of silu(gate) · up over a fused gate/up output: autograd's operations or models::swiglu.
struct SwigluRun {
  torch::Tensor output, gradient;
};
inline SwigluRun swiglu_run(const torch::Tensor& gate_up_values, const torch::Tensor& upstream, bool node) {
  auto gate_up = gate_up_values.detach().requires_grad_(true);
  const auto width = gate_up.size(-1) / 2;
  torch::Tensor output;
  if (node) {
    output = hpctrain::models::swiglu(gate_up);
  } else {
    const auto halves = gate_up.split_with_sizes({width, width}, -1);
    output = torch::silu(halves[0]) * halves[1];
  }
  output.backward(upstream);
  return {output.detach(), gate_up.grad()};
}

/// GB/s that `run` moves, at `bytes` read and written per call.
template <typename Run>
double gb_per_s(Run run, double bytes, const torch::Device& device, int iterations) {
  return bytes / (ms_per_call(run, device, iterations) * 1e6);
}

/// Sets out[key] to what `measure` returns, or notes under out["errors"][key] the first line of why it threw (one
/// figure's failure keeps the others).
template <typename Measure>
void figure(nlohmann::json& out, const std::string& key, Measure measure) {
  try {
    out[key] = measure();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    out["errors"][key] = what.substr(0, std::min<std::size_t>(what.find('\n'), 160));
  }
}

/// Where the SwiGLU row kernels stand against the memory's speed: GB/s of each alone over the fused product's halves
/// (strided views, as the model calls them), beside a copy of gate/up, and their distance from the composite
/// operations (what the probe compares). Only where the kernels run; a figure that throws is noted, not thrown.
inline nlohmann::json swiglu_kernel_bandwidth(const torch::Tensor& gate_up, const torch::Tensor& upstream,
                                              const torch::Device& device, int iterations) {
  namespace models = hpctrain::models::detail;
  nlohmann::json out = nlohmann::json::object();
  const auto width = upstream.size(-1);
  const auto gate = gate_up.narrow(-1, 0, width), up = gate_up.narrow(-1, width, width);
  const double half = static_cast<double>(upstream.numel() * upstream.element_size());
  const auto both = torch::empty_like(gate_up);
  const auto backward = [&] {
    models::swiglu_backward_rows(gate, up, upstream, both.narrow(-1, 0, width), both.narrow(-1, width, width));
    return both;
  };
  figure(out, "copy_gbps", [&] { return gb_per_s([&] { return gate_up.clone(); }, 4 * half, device, iterations); });
  figure(out, "rows_forward_gbps",
         [&] { return gb_per_s([&] { return models::swiglu_forward_rows(gate, up); }, 3 * half, device, iterations); });
  figure(out, "rows_backward_gbps", [&] { return gb_per_s(backward, 5 * half, device, iterations); });
  figure(out, "rows_forward_error", [&] {
    return relative_error({models::swiglu_forward_rows(gate, up)}, {models::swiglu_forward_composite(gate, up)});
  });
  figure(out, "rows_backward_error", [&] {
    auto expected = torch::empty_like(gate_up);
    models::swiglu_backward_composite(gate, up, upstream, expected.narrow(-1, 0, width),
                                      expected.narrow(-1, width, width));
    return relative_error({backward()}, {expected});
  });
  return out;
}

/// The same for the rotary row kernel over q as the fused product leaves it (a transposed view) and contiguous,
/// beside a copy of x: x read and the result written, the angles (small, cached) not counted; the kernel of one pair a
/// thread apart, and whether four pairs a thread passed their probe (`four_pairs`: what the others ran).
inline nlohmann::json rotary_kernel_bandwidth(const torch::Tensor& x, const torch::Tensor& cos,
                                              const torch::Tensor& sin, const torch::Device& device, int iterations) {
  namespace models = hpctrain::models::detail;
  nlohmann::json out = nlohmann::json::object();
  const auto x_contiguous = x.contiguous();
  const double bytes = 2.0 * static_cast<double>(x.numel() * x.element_size());
  figure(out, "copy_gbps", [&] { return gb_per_s([&] { return x_contiguous.clone(); }, bytes, device, iterations); });
  figure(out, "rows_forward_gbps",
         [&] { return gb_per_s([&] { return models::rotary_rows(x, cos, sin, false); }, bytes, device, iterations); });
  figure(out, "rows_backward_gbps",
         [&] { return gb_per_s([&] { return models::rotary_rows(x, cos, sin, true); }, bytes, device, iterations); });
  figure(out, "rows_forward_contiguous_gbps", [&] {
    return gb_per_s([&] { return models::rotary_rows(x_contiguous, cos, sin, false); }, bytes, device, iterations);
  });
  // The kernel of one pair a thread beside the fastest (four pairs a thread where its probe passed).
  figure(out, "one_pair_forward_gbps", [&] {
    return gb_per_s([&] { return models::rotary_rows(x, cos, sin, false, models::RotaryPairs::one); }, bytes, device,
                    iterations);
  });
  out["four_pairs"] = models::rotary_four_pairs_agree(device, x.scalar_type());
  figure(out, "rows_forward_error", [&] {
    return relative_error({models::rotary_rows(x, cos, sin, false)}, {models::rotary_composite(x, cos, sin, true)});
  });
  figure(out, "rows_backward_error", [&] {
    const auto expected = (models::rotate_half_transposed(x * sin) + x * cos).to(x.scalar_type());
    return relative_error({models::rotary_rows(x, cos, sin, true)}, {expected});
  });
  return out;
}

/// The figures of a kernel_bandwidth object as one short text ("copy 4100, forward 1700 GB/s, ..."), or why none.
inline std::string bandwidth_text(const nlohmann::json& figures) {
  std::string text, distances;
  for (const auto& item : figures.items()) {
    const auto& name = item.key();
    if (!item.value().is_number()) continue;
    const auto suffix = name.rfind('_');
    if (name.substr(suffix) == "_gbps") {
      text += fmt::format("{}{} {:.0f}", text.empty() ? "" : ", ", name.substr(0, suffix), item.value().get<double>());
    } else {  // a distance from the composite path
      distances += fmt::format(", {} {:.1e}", name, item.value().get<double>());
    }
  }
  text += " GB/s" + distances;
  if (figures.contains("errors")) {
    for (const auto& item : figures["errors"].items()) {
      text += fmt::format("; {} not measured: {}", item.key(), item.value().get<std::string>());
    }
  }
  return text;
}

inline Row fused_swiglu_row(const torch::Device& device) {
  const bool cuda = device.is_cuda();
  const std::int64_t tokens = cuda ? 8192 : 512, width = cuda ? 5632 : 256;
  torch::manual_seed(11);
  const auto bf16 = torch::TensorOptions().device(device).dtype(torch::kBFloat16);
  const auto gate_up = torch::randn({tokens, 2 * width}, bf16), upstream = torch::randn({tokens, width}, bf16);
  const int iterations = cuda ? 50 : 3;
  const double autograd_ms =
      ms_per_call([&] { return swiglu_run(gate_up, upstream, false).gradient; }, device, iterations);
  const double node_ms = ms_per_call([&] { return swiglu_run(gate_up, upstream, true).gradient; }, device, iterations);
  const auto autograd = swiglu_run(gate_up, upstream, false), node = swiglu_run(gate_up, upstream, true);
  const auto width_of = upstream.size(-1);
  const bool kernels = hpctrain::models::detail::swiglu_rows_usable(
      {gate_up.narrow(-1, 0, width_of), gate_up.narrow(-1, width_of, width_of), upstream});
  // The composite path is autograd's operations: equal. The kernels round each result once where autograd rounds
  // silu's output to bf16 first: within a few of bf16's 2^-8 relative steps, 2^-6 in norm with room.
  const double bound = kernels ? std::ldexp(1.0, -6) : 0.0;
  const double output_error = relative_error({node.output}, {autograd.output}),
               gradient_error = relative_error({node.gradient}, {autograd.gradient});
  Row row{"switches.fused_swiglu", "", Status::pass, "", nlohmann::json::object()};
  row.label =
      fmt::format("SwiGLU forward + backward, {} tokens x {} columns, bf16: autograd vs models::swiglu", tokens, width);
  row.status = output_error <= bound && gradient_error <= bound ? Status::pass : Status::fail;
  row.result = fmt::format(
      "{:.3f} ms -> {:.3f} ms ({:.2f}x), {}; output {:.1e}, gradient {:.1e} from autograd's (bound {:.1e})",
      autograd_ms, node_ms, autograd_ms / node_ms, kernel_path(kernels, device), output_error, gradient_error, bound);
  row.figures = {{"autograd_ms", autograd_ms},
                 {"node_ms", node_ms},
                 {"speedup", autograd_ms / node_ms},
                 {"kernels", kernels},
                 {"output_error", output_error},
                 {"gradient_error", gradient_error},
                 {"bound", bound},
                 {"tokens", tokens},
                 {"width", width}};
  if (kernels) {
    row.figures["bandwidth"] = swiglu_kernel_bandwidth(gate_up, upstream, device, iterations);
    row.result += "; kernels alone: " + bandwidth_text(row.figures["bandwidth"]);
  }
  return row;
}

/// One forward and backward of rotary embeddings over q-shaped x under bf16 autocast, with the runtime-compiled
/// kernels allowed (`kernels`) or not.
struct RotaryRun {
  torch::Tensor output, gradient;
};
inline RotaryRun rotary_run(const torch::Tensor& x_values, const torch::Tensor& cos, const torch::Tensor& sin,
                            const torch::Tensor& upstream, bool kernels) {
  const hpctrain::models::ScopedSwitch kernel_switch(hpctrain::models::set_runtime_kernels,
                                                     hpctrain::models::runtime_kernels, kernels);
  auto x = x_values.detach().requires_grad_(true);
  torch::Tensor output;
  {
    hpctrain::AutocastScope autocast(hpctrain::Precision::bf16, x.device());
    output = hpctrain::models::apply_rotary(x, cos, sin);
  }
  output.backward(upstream);
  return {output.detach(), x.grad()};
}

inline Row fused_rotary_row(const torch::Device& device) {
  const bool cuda = device.is_cuda();
  const std::int64_t batch = cuda ? 8 : 2, tokens = cuda ? 1024 : 128, heads = cuda ? 32 : 4, dim = 64;
  torch::manual_seed(13);
  const auto options = torch::TensorOptions().device(device);
  // q as the fused product leaves it: [B, T, H, D] transposed to [B, H, T, D]
  const auto x = torch::randn({batch, tokens, heads, dim}, options.dtype(torch::kBFloat16)).transpose(1, 2);
  const auto upstream = torch::randn({batch, heads, tokens, dim}, options.dtype(torch::kBFloat16));
  const auto frequencies = torch::pow(10000.0, -torch::arange(0, dim, 2, options) / double(dim));
  const auto half_angles = torch::arange(tokens, options).unsqueeze(-1) * frequencies;
  const auto angles = torch::cat({half_angles, half_angles}, -1);
  const auto cos = angles.cos(), sin = angles.sin();
  const int iterations = cuda ? 50 : 3;
  const double composite_ms =
      ms_per_call([&] { return rotary_run(x, cos, sin, upstream, false).gradient; }, device, iterations);
  const double kernel_ms =
      ms_per_call([&] { return rotary_run(x, cos, sin, upstream, true).gradient; }, device, iterations);
  const auto composite = rotary_run(x, cos, sin, upstream, false), fused = rotary_run(x, cos, sin, upstream, true);
  const bool kernels = hpctrain::models::detail::rotary_rows_usable(x, cos, sin);
  // One bf16 rounding of the same fp32 sums: within 2^-6 in norm with room.
  const double bound = kernels ? std::ldexp(1.0, -6) : 0.0;
  const double output_error = relative_error({fused.output}, {composite.output}),
               gradient_error = relative_error({fused.gradient}, {composite.gradient});
  Row row{"switches.fused_rotary", "", Status::pass, "", nlohmann::json::object()};
  row.label = fmt::format(
      "rotary forward + backward, {} x {} tokens, {} heads of {}, bf16: composite vs runtime-compiled kernels", batch,
      tokens, heads, dim);
  row.status = output_error <= bound && gradient_error <= bound ? Status::pass : Status::fail;
  row.result = fmt::format("{:.3f} ms -> {:.3f} ms ({:.2f}x), {}; output {:.1e}, gradient {:.1e} (bound {:.1e})",
                           composite_ms, kernel_ms, composite_ms / kernel_ms, kernel_path(kernels, device),
                           output_error, gradient_error, bound);
  row.figures = {{"composite_ms", composite_ms},
                 {"kernel_ms", kernel_ms},
                 {"speedup", composite_ms / kernel_ms},
                 {"kernels", kernels},
                 {"output_error", output_error},
                 {"gradient_error", gradient_error},
                 {"bound", bound},
                 {"tokens", batch * tokens},
                 {"heads", heads}};
  if (kernels) {
    row.figures["bandwidth"] = rotary_kernel_bandwidth(x, cos, sin, device, iterations);
    row.result +=
        "; kernels alone: " + bandwidth_text(row.figures["bandwidth"]) +
        (row.figures["bandwidth"].value("four_pairs", false) ? "; four pairs a thread"
                                                             : "; one pair a thread (four failed their probe)");
  }
  return row;
}

/// One forward and backward of RMSNorm over bf16 x with a bf16 weight: transformers' operations (`fused` false) or
/// models::rms_norm.
struct RmsNormRun {
  torch::Tensor output, x_gradient, weight_gradient;
};
inline RmsNormRun rms_norm_run(const torch::Tensor& x_values, const torch::Tensor& weight_values,
                               const torch::Tensor& upstream, bool fused) {
  auto x = x_values.detach().requires_grad_(true);
  auto weight = weight_values.detach().requires_grad_(true);
  const auto output = fused ? hpctrain::models::rms_norm(x, weight, 1e-5)
                            : hpctrain::models::detail::rms_norm_composite(x, weight, 1e-5);
  output.backward(upstream);
  return {output.detach(), x.grad(), weight.grad()};
}

inline Row fused_rmsnorm_row(const torch::Device& device) {
  const bool cuda = device.is_cuda();
  const std::int64_t tokens = cuda ? 8192 : 256, width = cuda ? 4096 : 256;
  torch::manual_seed(17);
  const auto bf16 = torch::TensorOptions().device(device).dtype(torch::kBFloat16);
  const auto x = torch::randn({tokens, width}, bf16), upstream = torch::randn({tokens, width}, bf16);
  const auto weight = (1 + 0.1 * torch::randn({width}, bf16.dtype(torch::kFloat32))).to(torch::kBFloat16);
  const int iterations = cuda ? 50 : 3;
  const double composite_ms =
      ms_per_call([&] { return rms_norm_run(x, weight, upstream, false).x_gradient; }, device, iterations);
  const double fused_ms =
      ms_per_call([&] { return rms_norm_run(x, weight, upstream, true).x_gradient; }, device, iterations);
  const auto composite = rms_norm_run(x, weight, upstream, false), fused = rms_norm_run(x, weight, upstream, true);
  const bool kernels = hpctrain::models::detail::rms_norm_rows_usable(x, weight);
  // The kernels sum the squares and the weight's products in another order and round the products once, where
  // autograd rounds each to bf16: within a few of bf16's 2^-8 relative steps, 2^-6 in norm with room. The composite
  // path is the same operations: equal.
  const double bound = kernels ? std::ldexp(1.0, -6) : 0.0;
  const double output_error = relative_error({fused.output}, {composite.output}),
               x_error = relative_error({fused.x_gradient}, {composite.x_gradient}),
               weight_error = relative_error({fused.weight_gradient}, {composite.weight_gradient});
  Row row{"switches.fused_rmsnorm", "", Status::pass, "", nlohmann::json::object()};
  row.label = fmt::format(
      "RMSNorm forward + backward, {} tokens x {}, bf16 x and weight: transformers' operations vs models::rms_norm",
      tokens, width);
  row.status = output_error <= bound && x_error <= bound && weight_error <= bound ? Status::pass : Status::fail;
  row.result = fmt::format(
      "{:.3f} ms -> {:.3f} ms ({:.2f}x), {}; output {:.1e}, x's gradient {:.1e}, the weight's {:.1e} (bound {:.1e})",
      composite_ms, fused_ms, composite_ms / fused_ms, kernel_path(kernels, device), output_error, x_error,
      weight_error, bound);
  row.figures = {{"composite_ms", composite_ms},
                 {"fused_ms", fused_ms},
                 {"speedup", composite_ms / fused_ms},
                 {"kernels", kernels},
                 {"output_error", output_error},
                 {"x_gradient_error", x_error},
                 {"weight_gradient_error", weight_error},
                 {"bound", bound},
                 {"tokens", tokens},
                 {"width", width}};
  if (kernels) {
    // The kernels alone beside a copy of x: forward reads x and writes the output, backward reads x and the
    // output's gradient and writes x's (the weight and the rows' rsqrt are small).
    const double bytes = static_cast<double>(x.numel() * x.element_size());
    namespace models = hpctrain::models::detail;
    nlohmann::json bandwidth = nlohmann::json::object();
    const auto rstd = models::rms_norm_forward_rows(x, weight, 1e-5).second;
    figure(bandwidth, "copy_gbps", [&] { return gb_per_s([&] { return x.clone(); }, 2 * bytes, device, iterations); });
    figure(bandwidth, "rows_forward_gbps", [&] {
      return gb_per_s([&] { return models::rms_norm_forward_rows(x, weight, 1e-5).first; }, 2 * bytes, device,
                      iterations);
    });
    figure(bandwidth, "rows_backward_gbps", [&] {
      return gb_per_s([&] { return models::rms_norm_backward_rows(x, weight, rstd, upstream, true, true).first; },
                      3 * bytes, device, iterations);
    });
    row.figures["bandwidth"] = bandwidth;
    row.result += "; kernels alone: " + bandwidth_text(bandwidth);
  }
  return row;
}

/// switches.cross_entropy_rows: GPT-2 124M's head and loss at its step (16 x 1024 tokens of width 768, vocabulary
/// 50,304, bf16 autocast; on the CPU 512 tokens of width 64), every seventh target ignored: the whole logits through
/// ATen's operations (the Trainer's step before the row kernel) against all the tokens as one chunk of
/// lm::chunked_token_loss_sum (lm::causal_lm_loss's choice on CUDA), with the cross-entropy row kernel and with the
/// composite operations: equal loss and gradients, ms per forward + backward, the memory each adds at its peak.
inline Row cross_entropy_rows_row(const torch::Device& device) {
  const bool cuda = device.is_cuda();
  const std::int64_t tokens = cuda ? 16384 : 512, width = cuda ? 768 : 64, vocabulary = 50304;
  const auto precision = hpctrain::resolve_precision(hpctrain::auto_precision, device);
  torch::manual_seed(6);
  const auto options = torch::TensorOptions().device(device);
  const auto weight = (torch::randn({vocabulary, width}, options) * 0.02).requires_grad_();
  const auto hidden = torch::randn({tokens, width}, options).requires_grad_();
  auto targets = torch::randint(vocabulary, {tokens}, options.dtype(torch::kInt64));
  targets.index_put_({torch::arange(0, tokens, 7, options.dtype(torch::kInt64))}, hpctrain::lm::ignore_index);
  const int repeats = cuda ? 5 : 1;
  const bool kernel = hpctrain::models::detail::cross_entropy_rows_usable(device, torch::kBFloat16);
  const auto whole = head_loss_run(hidden, weight, targets, 0, precision, repeats);
  const auto one_chunk = head_loss_run(hidden, weight, targets, tokens, precision, repeats);
  HeadLossRun composite;
  {
    const hpctrain::models::ScopedSwitch off(hpctrain::models::set_runtime_kernels, hpctrain::models::runtime_kernels,
                                             false);
    composite = head_loss_run(hidden, weight, targets, tokens, precision, repeats);
  }
  const double tolerance = tolerance_for(precision);
  const double loss_error = relative_error(one_chunk.loss, whole.loss);
  const double gradient_error = relative_error(one_chunk.gradients, whole.gradients);
  const double composite_error = relative_error(composite.gradients, whole.gradients);
  const auto gib = [](std::int64_t bytes) { return static_cast<double>(bytes) / double(1 << 30); };
  Row row{"switches.cross_entropy_rows", "", Status::pass, "", nlohmann::json::object()};
  row.label =
      fmt::format("head + loss, {} tokens x vocabulary {} (width {}, {}): whole logits vs one chunk, composite and {}",
                  tokens, vocabulary, width, hpctrain::to_string(precision), kernel_path(kernel, device));
  row.status = loss_error <= tolerance && gradient_error <= tolerance && composite_error <= tolerance ? Status::pass
                                                                                                      : Status::fail;
  row.result = fmt::format(
      "whole {:.2f} ms (+{:.2f} GiB); one chunk: composite {:.2f} ms, {} {:.2f} ms ({:.2f}x whole, +{:.2f} GiB); "
      "loss {}, gradients {} (composite {})",
      whole.ms, gib(whole.peak_added), composite.ms, kernel ? "row kernel" : "again composite", one_chunk.ms,
      whole.ms / one_chunk.ms, gib(one_chunk.peak_added), within(loss_error, tolerance),
      within(gradient_error, tolerance), within(composite_error, tolerance));
  row.figures = {{"whole_ms", whole.ms},
                 {"one_chunk_ms", one_chunk.ms},
                 {"composite_ms", composite.ms},
                 {"kernel", kernel},
                 {"whole_peak_added_bytes", whole.peak_added},
                 {"one_chunk_peak_added_bytes", one_chunk.peak_added},
                 {"loss_error", loss_error},
                 {"gradient_error", gradient_error},
                 {"composite_gradient_error", composite_error},
                 {"tokens", tokens},
                 {"vocabulary", vocabulary},
                 {"width", width}};
  return row;
}

}  // namespace switch_rows

/// Group "switches": every row, each in its own try so that one failure keeps the others.
inline int run_switch_rows(const torch::Device& device) {
  int failures = 0;
  const auto guarded = [&](const char* id, const char* label, auto make) {
    try {
      const auto row = make();
      print(row);
      failures += row.status == Status::fail;
    } catch (const std::exception& e) {
      print(failed_row(id, label, e.what()));
      ++failures;
    }
  };
  guarded("switches.fused_adamw", "AdamW step: torch::optim::AdamW vs hpctrain::FusedAdamW",
          [&] { return switch_rows::fused_adamw_row(device); });
  guarded("switches.pinned_batches",
          "batch to GPU: pageable + blocking vs pinned + non_blocking (Training::pin_memory)",
          [&] { return switch_rows::pinned_batches_row(device); });
  guarded("switches.chunked_loss", "head + loss: whole logits vs chunks (--loss-chunk-tokens)",
          [&] { return switch_rows::chunked_loss_row(device); });
  guarded("switches.cross_entropy_rows", "head + loss: whole logits vs one chunk with the cross-entropy row kernel",
          [&] { return switch_rows::cross_entropy_rows_row(device); });
  guarded("switches.no_host_sync",
          "no host synchronisation in a step: DDP and ZeRO-3, bf16, under CUDA's sync debug mode",
          [&] { return switch_rows::no_host_sync_row(device); });
  guarded("switches.wide_products", "weight gradient product: bf16 + cast (autograd) vs fp32 result (cuBLAS)",
          [&] { return switch_rows::wide_products_row(device); });
  guarded("switches.fused_swiglu", "SwiGLU forward + backward: autograd vs models::swiglu",
          [&] { return switch_rows::fused_swiglu_row(device); });
  guarded("switches.fused_rotary", "rotary forward + backward: composite vs runtime-compiled kernels",
          [&] { return switch_rows::fused_rotary_row(device); });
  guarded("switches.fused_rmsnorm", "RMSNorm forward + backward, bf16: transformers' operations vs models::rms_norm",
          [&] { return switch_rows::fused_rmsnorm_row(device); });
  return failures;
}

}  // namespace hpctrain_gpu_suite
