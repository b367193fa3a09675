#pragma once
// Rows "llama8b.lora*": LoRA at Llama 3.1 8B's shape (the public config: 32 layers, width 4096, SwiGLU 14336, 32
// heads over 8 key-value heads, vocabulary 128,256, rope_theta 500000 with Llama 3.1's "llama3" rope scaling,
// rms_norm_eps 1e-5, an untied head), random weights, r 16, alpha 32, no dropout on every projection (q, k, v, o,
// gate, up, down), bf16 autocast, full recomputation (each block's input kept, the block run again in backward: what
// the peers' gradient checkpointing does), FusedAdamW over the adapters, clipping at 1, packed rows of 2048 tokens
// (several examples a row, models::TokenLayout: positions restart and attention stays inside each, the variable-length
// flash kernel on CUDA). scripts/gpu-check puts them beside PEFT's rows at the same shape, tokens and step
// (bench/llama8b_peer.py: eager, Liger's kernels, torch.compile).
//
//   llama8b.lora             ZeRO-3 at world 1 (`--sharding zero3 --shard-at-one-rank`): the whole frozen base (blocks,
//                            embedding, head) held in bf16 (FullyShardedStrategy's frozen_dtype under
//                            Precision::bf16), each unit gathered (at world 1 a bf16 copy) while it runs: the dtype the
//                            peers hold their base in, so the memory compares
//   llama8b.lora.chunked     llama8b.lora with the head and the loss 2048 tokens at a time (`--loss-chunk-tokens
//                            2048`, lm/chunked_loss.hpp): hpctrain's answer to Liger's fused linear cross entropy,
//                            whose peer row never holds the 16,384 x 128,256 logits either
//   llama8b.lora.replicated  Replicated (what `--local 1` runs for every --sharding unless --shard-at-one-rank): the
//                            frozen base in bf16 too (hold_frozen_in_compute_dtype), whole, no gathers
//
// Each row: tokens/s over the timed steps, the peak memory of the steps (the CUDA allocator's peak allocated bytes,
// counted from after the strategy's setup: the model in place, then the optimizer state, the activations, the head),
// the parameter bytes held between steps and so the base's bytes a parameter, MFU counted as for full fine-tuning
// (6N + attention, models/llama_config.hpp; the backward skips the frozen weights' gradient products and full
// recomputation runs the forward again, about the same work: docs/gpu.md), and the loss after the last step. The
// model is built uninitialised (WeightsFromCheckpoint) and drawn on the device, transformers' initialisation (every
// projection and embedding N(0, 0.02), the norms 1): drawn on the host an 8B model takes a minute. On the CPU the
// model is a tiny one of the same structure (GQA, llama3 rope scaling, LoRA on every projection, packed rows).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
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
#include <hpctrain/models/llama.hpp>
#include <hpctrain/models/lora/lora.hpp>
#include <hpctrain/models/weights_from_checkpoint.hpp>
#include <hpctrain/train/optim/fused_adamw.hpp>
#include <hpctrain/train/precision.hpp>
#include <hpctrain/train/strategies/sharded.hpp>

#include "device_memory.hpp"
#include "llama_rows.hpp"
#include "report.hpp"

namespace hpctrain_gpu_suite {

namespace llama8b_rows {

/// Llama 3.1 8B's config.json on CUDA; on the CPU a tiny model of the same structure (bench/llama8b_peer.py's presets).
inline hpctrain::models::LlamaConfig model_config(bool cuda) {
  hpctrain::models::LlamaConfig config;
  config.vocab_size = cuda ? 128256 : 256;
  config.hidden_size = cuda ? 4096 : 64;
  config.intermediate_size = cuda ? 14336 : 160;
  config.num_hidden_layers = cuda ? 32 : 2;
  config.num_attention_heads = cuda ? 32 : 4;
  config.num_key_value_heads = cuda ? 8 : 2;
  config.max_position_embeddings = 131072;
  config.rms_norm_eps = 1e-5;
  config.rope_theta = 500000.0;
  config.rope_scaling = hpctrain::models::RopeScaling{"llama3", 8.0, 1.0, 4.0, 8192};
  config.tie_word_embeddings = false;
  if (cuda) {
    config.bos_token_id = 128000;
    config.eos_token_id = 128001;
  }
  return config;
}

struct Sizes {
  std::int64_t batch, sequence, warmup, steps;
};
/// 8 packed rows of 2048 on CUDA (16,384 tokens a step: about 1.8 s at 450 TFLOP/s, docs/gpu.md); two steps of
/// warm-up (the kernels' first calls, the optimizer's state) and four timed, to keep the group within its budget.
/// `sequence` (hpctrain_gpu_suite --seq, gpu-check --llama8b-seq): rows of that length instead, as many as keep the
/// step's tokens (4 x 4096 on CUDA).
inline Sizes sizes(bool cuda, std::int64_t sequence = 0) {
  auto size = cuda ? Sizes{8, 2048, 2, 4} : Sizes{2, 32, 1, 2};
  if (sequence > 0) {
    size.batch = std::max<std::int64_t>(1, size.batch * size.sequence / sequence);
    size.sequence = sequence;
  }
  return size;
}

/// Each packed row's examples in sixteenths of the row, rotated by the row's index (bench/llama8b_peer.py PATTERN).
inline std::vector<std::int64_t> example_lengths(std::int64_t sequence, std::int64_t row) {
  static constexpr std::int64_t pattern[] = {5, 3, 6, 2};
  std::vector<std::int64_t> lengths;
  for (std::int64_t i = 0; i < 4; ++i) lengths.push_back(sequence * pattern[(row + i) % 4] / 16);
  return lengths;
}

/// The packed batch both sides train on: random tokens (seed 2, drawn on the device, as the peer draws them), each
/// row's position_ids restarting per example and its document ids, and the next-token targets, -100 where the next
/// token starts another example (and at the row's end): what the peer's labels give after transformers' shift.
struct PackedBatch {
  torch::Tensor inputs, targets;
  hpctrain::models::TokenLayout layout;
};

inline PackedBatch packed_batch(std::int64_t vocab, const Sizes& size, const torch::Device& device) {
  TORCH_CHECK(size.sequence % 16 == 0, "llama8b rows: the sequence must be a multiple of 16");
  torch::manual_seed(2);
  const auto tokens =
      torch::randint(vocab, {size.batch, size.sequence}, torch::TensorOptions().dtype(torch::kLong).device(device));
  std::vector<torch::Tensor> positions, documents;
  for (std::int64_t r = 0; r < size.batch; ++r) {
    std::vector<torch::Tensor> row_positions, row_documents;
    std::int64_t document = 0;
    for (const auto n : example_lengths(size.sequence, r)) {
      row_positions.push_back(torch::arange(n, torch::kLong));
      row_documents.push_back(torch::full({n}, document++, torch::kLong));
    }
    positions.push_back(torch::cat(row_positions));
    documents.push_back(torch::cat(row_documents));
  }
  PackedBatch batch;
  batch.layout = {torch::stack(positions).to(device), torch::stack(documents).to(device)};
  batch.inputs = tokens;
  batch.targets = torch::full_like(tokens, hpctrain::lm::ignore_index);
  const auto s = size.sequence;
  batch.targets.narrow(1, 0, s - 1)
      .copy_(tokens.narrow(1, 1, s - 1)
                 .masked_fill(batch.layout.position_ids.narrow(1, 1, s - 1) == 0, hpctrain::lm::ignore_index));
  return batch;
}

/// The Llama of `config` with random weights drawn on `device` as transformers' from_config draws them (projections
/// and embeddings N(0, initializer_range), the norms 1), never drawn or touched on the host.
inline hpctrain::models::Llama build_on(const hpctrain::models::LlamaConfig& config, const torch::Device& device) {
  auto model = [&] {
    const hpctrain::models::WeightsFromCheckpoint uninitialised;  // torch::empty weights: host pages never touched
    return hpctrain::models::Llama(config);
  }();
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  for (auto& parameter : model->parameters()) {
    parameter.set_data(torch::empty(parameter.sizes(), parameter.options().device(device)));
    if (parameter.dim() == 1) parameter.fill_(1.0);  // RMSNorm weights (Llama 3.1 has no biases)
    else parameter.normal_(0.0, config.initializer_range);
  }
  model->to(device);  // buffers, if any
  return model;
}

/// LoRA r 16, alpha 32, no dropout, on every projection (PEFT's target_modules of bench/llama8b_peer.py).
inline void with_lora(hpctrain::models::Llama& model) {
  hpctrain::models::LoraConfig lora;
  lora.r = 16;
  lora.alpha = 32;
  lora.dropout = 0.0;
  lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  hpctrain::models::apply_lora(*model, lora);
}

/// AdamW over the adapters at the peers' learning rate (FusedAdamW, the Trainer's; the peers' fused AdamW).
inline std::unique_ptr<torch::optim::Optimizer> adamw(const hpctrain::NamedParameters& named) {
  std::vector<torch::Tensor> tensors;
  for (const auto& item : named) tensors.push_back(item.second);
  return std::make_unique<hpctrain::FusedAdamW>(tensors, torch::optim::AdamWOptions(1e-4).weight_decay(0.0));
}

struct Measurement {
  llama_rows::Measurement figures;
  std::int64_t parameter_bytes = 0;  // parameters held between steps: the frozen base, the adapters
  std::int64_t adapter_bytes = 0;    // the adapters' part of it (fp32, as apply_lora makes them beside an fp32 weight)
  double setup_s = 0;                // build, LoRA and the strategy's setup (not timed in tokens/s)
  double planned_peak = 0;           // lm::plan_memory's peak for the same run (`--plan`), beside the measured one
};

/// What `--plan` says this row's run holds at its peak (lm/memory_plan.hpp), to set beside the measured peak.
inline double planned_peak(const hpctrain::models::LlamaConfig& config, hpctrain::ZeroStage stage,
                           hpctrain::Precision precision, const Sizes& size, bool cuda, std::int64_t loss_chunk) {
  hpctrain::lm::PlanInput in;
  in.model = hpctrain::lm::model_shape(config);
  in.strategy = stage == hpctrain::ZeroStage::zero3 ? "zero3" : "none";
  in.bf16 = precision == hpctrain::Precision::bf16;
  in.activation_checkpointing = hpctrain::models::Recompute::full;
  in.lora_rank = 16;
  in.lora_targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  in.micro_batch = size.batch;
  in.sequence = size.sequence;
  in.loss_chunk_tokens = loss_chunk;
  in.cpu = !cuda;
  return hpctrain::lm::plan_memory(in).peak;
}

/// Builds the model on the device, adds the adapters, sets up `stage`'s strategy, then trains on the packed batch:
/// warm-up steps, then timed ones. `loss_chunk`: --loss-chunk-tokens (0: the Trainer's default, all the tokens as one
/// chunk of the cross-entropy row kernel on CUDA).
inline Measurement train(const std::shared_ptr<hpctrain::dist::ProcessGroup>& group, hpctrain::ZeroStage stage,
                         bool cuda, const Sizes& size, std::int64_t loss_chunk) {
  const auto device = group->device();
  const auto config = model_config(cuda);
  const auto precision = hpctrain::resolve_precision(hpctrain::auto_precision, device);
  const auto started = std::chrono::steady_clock::now();
  reset_peak_memory(device);
  auto model = build_on(config, device);
  with_lora(model);
  model->set_activation_checkpointing(hpctrain::models::Recompute::full);
  model->train();
  Measurement measurement;
  measurement.planned_peak = planned_peak(config, stage, precision, size, cuda, loss_chunk);
  for (const auto& parameter : model->parameters()) {
    if (!parameter.requires_grad()) continue;
    measurement.figures.trainable += parameter.numel();
    measurement.adapter_bytes += static_cast<std::int64_t>(parameter.nbytes());
  }
  auto strategy = hpctrain::make_zero_strategy(stage);
  strategy->setup({group, model.ptr(), adamw, precision});
  if (const auto* sharded = dynamic_cast<const hpctrain::FullyShardedStrategy*>(strategy.get())) {
    measurement.parameter_bytes = static_cast<std::int64_t>(sharded->resident_parameter_bytes());
  } else {
    for (const auto& parameter : model->parameters())
      measurement.parameter_bytes += static_cast<std::int64_t>(parameter.nbytes());
  }
  const auto batch = packed_batch(config.vocab_size, size, device);
  auto synchronize = [&] {
    if (device.is_cuda()) torch::cuda::synchronize();
  };
  synchronize();
  measurement.setup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  // The steps' peak: from the model in place (ZeRO-3's setup held the fp32 model and its bf16 shards at once for a
  // moment, which a run that loads a bf16 checkpoint slice by slice never does).
  reset_peak_memory(device);
  torch::Tensor loss;
  // The Trainer's step on the device at one micro-batch (llama_rows::train's, with the packed layout).
  const auto step = [&] {
    strategy->zero_grad();
    strategy->set_sync(true);
    torch::Tensor step_loss;
    {
      hpctrain::AutocastScope autocast(precision, device);
      step_loss = hpctrain::lm::causal_lm_loss(*model, batch.inputs, batch.targets, &batch.layout, loss_chunk);
    }
    step_loss.backward();
    strategy->finish_gradients();
    strategy->clip_grad_norm(1.0);
    strategy->step();
    loss = step_loss.detach();
  };
  for (std::int64_t i = 0; i < size.warmup; ++i) step();
  synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < size.steps; ++i) step();
  synchronize();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto& m = measurement.figures;
  m.tokens_per_s = static_cast<double>(size.batch * size.sequence * size.steps) / seconds;
  m.peak_bytes = peak_memory_bytes(device);
  m.loss = loss.item<double>();
  std::tie(m.optimizer_state_bytes, m.gradient_bytes) = llama_rows::state_and_gradient_bytes(*strategy, model);
  return measurement;
}

inline Row row_of(const std::string& id, const std::string& label, const Measurement& measured,
                  const torch::Device& device, const Sizes& size) {
  const auto config = model_config(device.is_cuda());
  const auto& m = measured.figures;
  Row row{id, label, Status::pass, "", nlohmann::json::object()};
  const auto gib = [](std::int64_t bytes) { return static_cast<double>(bytes) / double(1 << 30); };
  const double mfu =
      m.tokens_per_s * hpctrain::models::flops_per_token(config, size.sequence) / (llama_rows::peak_tflops * 1e12);
  // The base's bytes a parameter (2: bf16, 4: fp32): what the frozen base is held in, measured from the tensors the
  // strategy keeps.
  const auto base_bytes = measured.parameter_bytes - measured.adapter_bytes;
  const double bytes_a_parameter = static_cast<double>(base_bytes) / static_cast<double>(config.parameter_count());
  row.result = fmt::format(
      "{:.0f} tokens/s, {} {:.2f} GiB (--plan: {:.2f}), base held in {:.2f} GiB ({:.2f} bytes a parameter), {} "
      "trainable, loss {:.4f} after {} steps",
      m.tokens_per_s, llama_rows::memory_label(device), gib(m.peak_bytes), measured.planned_peak / double(1 << 30),
      gib(base_bytes), bytes_a_parameter, hpctrain::lm::parameter_count_label(m.trainable), m.loss,
      size.warmup + size.steps);
  if (device.is_cuda()) row.result += fmt::format(", MFU {:.1f}%", 100 * mfu);
  row.figures["tokens_per_s"] = m.tokens_per_s;
  row.figures["ms_per_step"] = 1e3 * static_cast<double>(size.batch * size.sequence) / m.tokens_per_s;
  row.figures["peak_bytes"] = m.peak_bytes;
  row.figures["peak_memory_kind"] = llama_rows::memory_label(device);
  row.figures["parameter_bytes"] = measured.parameter_bytes;
  row.figures["base_bytes"] = base_bytes;
  row.figures["bytes_a_base_parameter"] = bytes_a_parameter;
  row.figures["trainable_parameters"] = m.trainable;
  row.figures["optimizer_state_bytes"] = m.optimizer_state_bytes;
  row.figures["gradient_bytes"] = m.gradient_bytes;
  row.figures["parameters"] = config.parameter_count();
  row.figures["flops_per_token"] = hpctrain::models::flops_per_token(config, size.sequence);
  row.figures["mfu"] = mfu;
  row.figures["loss"] = m.loss;
  row.figures["batch"] = size.batch;
  row.figures["seq"] = size.sequence;
  row.figures["steps"] = size.steps;
  row.figures["warmup"] = size.warmup;
  row.figures["setup_s"] = measured.setup_s;
  row.figures["planned_peak_bytes"] = measured.planned_peak;
  if (!std::isfinite(m.loss)) {
    row.status = Status::fail;
    row.result += fmt::format(", loss {}", m.loss);
  }
  return row;
}

}  // namespace llama8b_rows

/// The llama8b group's C++ rows, one after the other in this process (world 1); `only` as run_llama_rows's,
/// `sequence` as llama8b_rows::sizes's.
inline int run_llama8b_rows(const std::shared_ptr<hpctrain::dist::ProcessGroup>& group, bool cuda,
                            const std::vector<std::string>& only = {}, std::int64_t sequence = 0) {
  const auto config = llama8b_rows::model_config(cuda);
  const auto size = llama8b_rows::sizes(cuda, sequence);
  const auto shape = fmt::format("Llama 3.1 8B shape ({}{}), packed batch {} x {}",
                                 cuda ? "" : "tiny: ", hpctrain::lm::parameter_count_label(config.parameter_count()),
                                 size.batch, size.sequence);
  int failures = 0;
  const auto row = [&](const char* id, const std::string& what, hpctrain::ZeroStage stage, std::int64_t loss_chunk) {
    if (!only.empty() && std::find(only.begin(), only.end(), id) == only.end()) return;
    const auto label = fmt::format("{}: hpctrain, LoRA r=16 every projection, {}", shape, what);
    Row result;
    try {
      result = llama8b_rows::row_of(id, label, llama8b_rows::train(group, stage, cuda, size, loss_chunk),
                                    group->device(), size);
    } catch (const std::exception& e) {
      result = failed_row(id, label, e.what());
    }
    print(result);
    failures += result.status == Status::fail;
    // The next row builds its own 8B model: nothing of this one stays cached.
    reset_peak_memory(group->device());
  };
  // The head's chunk on the CPU: a quarter of the step's tokens, so that the chunked path runs there too.
  const std::int64_t chunk = cuda ? 2048 : size.batch * size.sequence / 4;
  row("llama8b.lora", "ZeRO-3 at world 1 (frozen base bf16), full recomputation", hpctrain::ZeroStage::zero3, 0);
  row("llama8b.lora.chunked",
      fmt::format("ZeRO-3 at world 1 (frozen base bf16), full recomputation, "
                  "--loss-chunk-tokens {}",
                  chunk),
      hpctrain::ZeroStage::zero3, chunk);
  row("llama8b.lora.replicated", "Replicated (frozen base bf16), full recomputation", hpctrain::ZeroStage::none, 0);
  return failures;
}

}  // namespace hpctrain_gpu_suite
