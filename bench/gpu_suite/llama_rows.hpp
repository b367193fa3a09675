#pragma once
// Rows "llama.*": fine-tuning a Llama-shaped model of about 1.1B parameters (TinyLlama's shape: 22 layers,
// width 2048, SwiGLU 5632, 32 heads over 4 key-value heads, vocabulary 32000) on one device, three ways:
//
//   llama.full        every parameter trains: Replicated at world 1 (no sharding: at one rank ZeRO only adds
//                     work), no recomputation, bf16 autocast, hpctrain::FusedAdamW: what the Trainer runs at
//                     world 1, and what transformers' row (scripts/gpu-check: llama.eager, llama.compile) runs
//   llama.full.unfused  the same with q, k, v and gate, up as separate products (models/kernels/fused_projections.hpp),
//                     as transformers computes them: what fusing them gains, in the same call
//   llama.full.rounded  the same with autograd's casts of the gradients (bf16 products, a cast kernel each;
//                     models/kernels/mixed_precision_products.hpp off), as transformers computes them
//   llama.full.composite  the same with LibTorch's operations for SwiGLU and rotary (set_runtime_kernels(false)):
//                     what the runtime-compiled kernels (models/kernels/runtime_kernels.hpp) gain
//   llama.full.selective  the same with selective recomputation (--activation-checkpointing selective: each block
//                     runs again in backward, its projections' outputs replayed): what fitting in less memory costs
//   llama.full.zero3  the same under ZeRO-3 (fp32 shards, each block gathered while it runs and recomputed in
//                     backward, which is activation checkpointing): what a model that does not fit pays
//   llama.lora        LoRA r=16, alpha 32 on q_proj and v_proj, the base frozen (fp32), Replicated, no
//                     recomputation: the same activations as llama.full, so the difference is the optimizer
//                     state, the gradients and the weight-gradient products LoRA skips
//
// Each row: tokens/s over the timed steps, peak memory (the CUDA allocator's peak allocated bytes, as
// torch.cuda.max_memory_allocated; on the CPU the process's peak resident set), trainable parameters, the
// optimizer state and gradients this rank holds between steps (bytes of tensors, counted, not measured: what
// LoRA saves against full fine-tuning, at any size and on any device; ZeRO-3's fp32 shards are the parameters), and for
// the full rows MFU (6N + attention, models/llama_config.hpp; recomputation not counted, as usual). On the CPU
// the model is a tiny one of the same shape family: the row checks that the code runs, not its speed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <hpctrain/dist/dist.hpp>
#include <hpctrain/lm/loss.hpp>
#include <hpctrain/lm/memory_plan.hpp>
#include <hpctrain/models/kernels/scoped_switch.hpp>
#include <hpctrain/models/llama.hpp>
#include <hpctrain/models/lora/lora.hpp>
#include <hpctrain/train/optim/fused_adamw.hpp>
#include <hpctrain/train/precision.hpp>
#include <hpctrain/train/step_graph.hpp>
#include <hpctrain/train/strategies/sharded.hpp>

#include "device_memory.hpp"
#include "profile.hpp"
#include "report.hpp"

namespace hpctrain_gpu_suite {

namespace llama_rows {

/// TinyLlama-1.1B's shape on CUDA; a tiny model of the same family on the CPU.
inline hpctrain::models::LlamaConfig model_config(bool cuda) {
  hpctrain::models::LlamaConfig config;
  config.vocab_size = cuda ? 32000 : 256;
  config.hidden_size = cuda ? 2048 : 64;
  config.intermediate_size = cuda ? 5632 : 128;
  config.num_hidden_layers = cuda ? 22 : 2;
  config.num_attention_heads = cuda ? 32 : 4;
  config.num_key_value_heads = cuda ? 4 : 2;
  config.max_position_embeddings = 2048;
  return config;
}

struct Sizes {
  std::int64_t batch, sequence, warmup, steps;
};
inline Sizes sizes(bool cuda) { return cuda ? Sizes{8, 1024, 2, 5} : Sizes{2, 32, 1, 2}; }

/// H100 SXM and H200, dense bf16 (the same peak bench/model_mfu uses).
inline constexpr double peak_tflops = 989.0;

struct Measurement {
  double tokens_per_s = 0;
  std::int64_t peak_bytes = 0;
  double loss = 0;
  std::int64_t trainable = 0;
  std::int64_t optimizer_state_bytes = 0;  // AdamW's moments on this rank
  std::int64_t gradient_bytes = 0;         // gradients (ZeRO-3: the gradient shards) kept between steps
  std::int64_t replays = 0;                // steps replayed from the step graph (--cuda-graphs)
};

/// The optimizer state and gradient bytes `strategy` holds on this rank after a step.
inline std::pair<std::int64_t, std::int64_t> state_and_gradient_bytes(hpctrain::DataParallelStrategy& strategy,
                                                                      hpctrain::models::Llama& model) {
  if (const auto* full = dynamic_cast<const hpctrain::FullyShardedStrategy*>(&strategy))
    return {static_cast<std::int64_t>(full->optimizer_state_bytes()),
            static_cast<std::int64_t>(full->gradient_bytes())};
  std::int64_t state = 0, gradients = 0;
  for (const auto& [key, parameter_state] : strategy.optimizer().state())
    state += static_cast<std::int64_t>(hpctrain::detail::state_tensor_bytes(*parameter_state));
  for (const auto& parameter : model->parameters())
    if (parameter.grad().defined()) gradients += static_cast<std::int64_t>(parameter.grad().nbytes());
  return {state, gradients};
}

/// The Trainer's optimizer (examples return it; PyTorch's AdamW takes its foreach or fused path on CUDA).
inline std::unique_ptr<torch::optim::Optimizer> adamw(const hpctrain::NamedParameters& named) {
  std::vector<torch::Tensor> tensors;
  for (const auto& item : named) tensors.push_back(item.second);
  return std::make_unique<hpctrain::FusedAdamW>(tensors, torch::optim::AdamWOptions(1e-5).weight_decay(0.0));
}

/// Trains `model` with `strategy` on random tokens: warmup steps, then timed steps. The peak memory counts
/// from the model's move to the device: weights, gradients, optimizer state and activations. `graphs`: each step
/// through the Trainer's step graph (`--cuda-graphs`: captured after its warm-up steps, which the row's warmup
/// steps cover, then replayed).
inline Measurement train(const std::shared_ptr<hpctrain::dist::ProcessGroup>& group, hpctrain::models::Llama model,
                         std::unique_ptr<hpctrain::DataParallelStrategy> strategy, bool cuda,
                         const std::string& trace = "", bool graphs = false) {
  const auto device = group->device();
  const auto size = sizes(cuda);
  const auto precision = hpctrain::resolve_precision(hpctrain::auto_precision, device);
  Measurement measurement;
  for (const auto& parameter : model->parameters())
    if (parameter.requires_grad()) measurement.trainable += parameter.numel();
  reset_peak_memory(device);
  model->to(device);
  model->train();
  strategy->setup({group, model.ptr(), adamw, precision});
  torch::manual_seed(2);
  const auto tokens = torch::randint(model->config().vocab_size, {size.batch, size.sequence + 1},
                                     torch::TensorOptions().dtype(torch::kLong).device(device));
  const hpctrain::data::Batch batch(tokens.narrow(1, 0, size.sequence), tokens.narrow(1, 1, size.sequence));
  // The Trainer's step on the device (train/trainer.hpp's step_on_device at one micro-batch, causal_lm_training's
  // loss).
  const auto device_step = [&](const hpctrain::data::Batch& on_device) {
    strategy->zero_grad();
    strategy->set_sync(true);
    torch::Tensor step_loss;
    {
      hpctrain::AutocastScope autocast(precision, device);
      step_loss = hpctrain::lm::causal_lm_loss(*model, on_device.inputs, on_device.targets);
    }
    step_loss.backward();
    strategy->finish_gradients();
    auto norm = strategy->clip_grad_norm(1.0);
    strategy->step();
    return hpctrain::detail::StepOutputs{step_loss.detach(), std::move(norm)};
  };
  std::optional<hpctrain::detail::StepGraph> graph;
  if (graphs) graph.emplace(device, dynamic_cast<hpctrain::FusedAdamW&>(strategy->optimizer()));
  torch::Tensor loss;
  auto step = [&] { loss = graph ? graph->run(batch, false, device_step).loss : device_step(batch).loss; };
  auto synchronize = [&] {
    if (device.is_cuda()) torch::cuda::synchronize();
  };
  // Under graphs, the step graph's own warm-up steps and its capture come before the timed steps.
  const auto warmup = graphs ? std::max(size.warmup, hpctrain::detail::StepGraph::warmup_steps + 1) : size.warmup;
  for (std::int64_t i = 0; i < warmup; ++i) step();
  synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < size.steps; ++i) step();
  synchronize();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  measurement.tokens_per_s = static_cast<double>(size.batch * size.sequence * size.steps) / seconds;
  measurement.peak_bytes = peak_memory_bytes(device);
  measurement.loss = loss.item<double>();
  if (graph) measurement.replays = graph->replays();
  std::tie(measurement.optimizer_state_bytes, measurement.gradient_bytes) = state_and_gradient_bytes(*strategy, model);
  if (!trace.empty()) profile(trace, device, 3, step);  // after the figures, so they are the same without it
  return measurement;
}

inline std::string memory_label(const torch::Device& device) {
  return reads_cuda_allocator(device) ? "peak allocated" : "peak RSS";
}

inline Row row_of(const std::string& id, const std::string& label, const Measurement& m, const torch::Device& device,
                  const hpctrain::models::LlamaConfig& config, bool with_mfu) {
  Row row{id, label, Status::pass, "", nlohmann::json::object()};
  const double gib = static_cast<double>(m.peak_bytes) / double(1 << 30);
  const auto mib = [](std::int64_t bytes) { return static_cast<double>(bytes) / double(1 << 20); };
  row.result =
      fmt::format("{:.0f} tokens/s, {} {:.2f} GiB, {} trainable, optimizer state {:.2f} MiB, gradients {:.2f} MiB",
                  m.tokens_per_s, memory_label(device), gib, hpctrain::lm::parameter_count_label(m.trainable),
                  mib(m.optimizer_state_bytes), mib(m.gradient_bytes));
  row.figures["tokens_per_s"] = m.tokens_per_s;
  row.figures["peak_bytes"] = m.peak_bytes;
  row.figures["peak_memory_kind"] = memory_label(device);
  row.figures["trainable_parameters"] = m.trainable;
  row.figures["optimizer_state_bytes"] = m.optimizer_state_bytes;
  row.figures["gradient_bytes"] = m.gradient_bytes;
  row.figures["parameters"] = config.parameter_count();
  row.figures["loss"] = m.loss;
  if (m.replays > 0) {
    row.figures["replays"] = m.replays;
    row.result += fmt::format(", {} steps replayed from the CUDA graph", m.replays);
  }
  if (with_mfu) {
    const double mfu = m.tokens_per_s * hpctrain::models::flops_per_token(config, sizes(device.is_cuda()).sequence) /
                       (peak_tflops * 1e12);
    row.figures["mfu"] = mfu;
    if (device.is_cuda()) row.result += fmt::format(", MFU {:.1f}%", 100 * mfu);
  }
  if (!std::isfinite(m.loss)) {
    row.status = Status::fail;
    row.result += fmt::format(", loss {}", m.loss);
  }
  return row;
}

}  // namespace llama_rows

/// The fine-tuning rows, one after the other in this process (world 1).
/// `only`, when not empty, names the rows to run (the others are not printed: gpu-check's table then lists them as
/// missing).
inline int run_llama_rows(const std::shared_ptr<hpctrain::dist::ProcessGroup>& group, bool cuda,
                          const std::vector<std::string>& only = {}) {
  namespace hm = hpctrain::models;
  const auto config = llama_rows::model_config(cuda);
  const auto size = llama_rows::sizes(cuda);
  const auto shape = fmt::format("{}, batch {} x {}", hpctrain::lm::parameter_count_label(config.parameter_count()),
                                 size.batch, size.sequence);
  int failures = 0;
  // One row: a fresh model (seed 0), `prepare`d (LoRA, checkpointing), trained with `stage`.
  const auto row = [&](const char* id, const std::string& what, hpctrain::ZeroStage stage, bool with_mfu, auto prepare,
                       bool graphs = false) {
    if (!only.empty() && std::find(only.begin(), only.end(), id) == only.end()) return;
    const auto label = fmt::format("Llama {}: {}", shape, what);
    if (graphs && !cuda) {
      print(Row{id, label, Status::skip, "skipped: a CUDA graph captures a GPU's step", nlohmann::json::object()});
      return;
    }
    Row result;
    try {
      torch::manual_seed(0);
      hm::Llama model(config);
      prepare(model);
      const auto measured =
          llama_rows::train(group, model, hpctrain::make_zero_strategy(stage), cuda, trace_path(id), graphs);
      result = llama_rows::row_of(id, label, measured, group->device(), config, with_mfu);
    } catch (const std::exception& e) {
      result = failed_row(id, label, e.what());
    }
    print(result);
    failures += result.status == Status::fail;
  };
  row("llama.full", "full fine-tuning, Replicated, no recomputation", hpctrain::ZeroStage::none, true,
      [](hm::Llama&) {});
  {  // the same with one product per projection (q, k, v and gate, up unfused), as transformers computes them
    const hm::ScopedSwitch unfused(hm::set_fused_projections, hm::fused_projections, hm::FusedProjections::never);
    row("llama.full.unfused", "full fine-tuning, Replicated, no recomputation, projections unfused",
        hpctrain::ZeroStage::none, true, [](hm::Llama&) {});
  }
  {  // the same with autograd's casts of the gradients (bf16 products, then a cast kernel each), as transformers
    const hm::ScopedSwitch rounded(hm::set_fp32_product_gradients, hm::fp32_product_gradients,
                                   hm::WideProducts::nowhere);
    row("llama.full.rounded", "full fine-tuning, Replicated, no recomputation, gradients cast from bf16",
        hpctrain::ZeroStage::none, true, [](hm::Llama&) {});
  }
  {  // the same with LibTorch's operations where runtime-compiled kernels would run (SwiGLU, rotary)
    const hm::ScopedSwitch composite(hm::set_runtime_kernels, hm::runtime_kernels, false);
    row("llama.full.composite", "full fine-tuning, Replicated, no recomputation, no runtime-compiled kernels",
        hpctrain::ZeroStage::none, true, [](hm::Llama&) {});
  }
  row("llama.full.selective", "full fine-tuning, Replicated, selective recomputation", hpctrain::ZeroStage::none, true,
      [](hm::Llama& model) { model->set_activation_checkpointing(hm::Recompute::selective); });
  row("llama.full.zero3", "full fine-tuning, ZeRO-3 + checkpointing", hpctrain::ZeroStage::zero3, true,
      [](hm::Llama& model) { model->set_activation_checkpointing(true); });
  row("llama.full.zero3.keep", "full fine-tuning, ZeRO-3 keeping activations", hpctrain::ZeroStage::zero3, true,
      [](hm::Llama&) {});
  const auto with_lora = [](hm::Llama& model) {
    hm::LoraConfig lora;
    lora.r = 16;
    lora.alpha = 32;
    lora.targets = {"q_proj", "v_proj"};
    hm::apply_lora(*model, lora);
  };
  row("llama.lora", "LoRA r=16 q_proj,v_proj, no recomputation", hpctrain::ZeroStage::none, false, with_lora);
  // The step captured in a CUDA graph and replayed (--cuda-graphs): what the launches between kernels cost.
  row(
      "llama.full.graphs", "full fine-tuning, Replicated, no recomputation, the step in a CUDA graph",
      hpctrain::ZeroStage::none, true, [](hm::Llama&) {}, true);
  row("llama.lora.graphs", "LoRA r=16 q_proj,v_proj, no recomputation, the step in a CUDA graph",
      hpctrain::ZeroStage::none, false, with_lora, true);
  return failures;
}

}  // namespace hpctrain_gpu_suite
