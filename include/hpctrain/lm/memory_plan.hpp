#pragma once
// `--plan`: what one rank of a language-model run will hold, from the model's config.json alone (no weights
// read, no LibTorch), for the strategy, precision, LoRA, batch and sequence the run declares at the job's
// geometry — before anything is queued. It counts what hpctrain holds today, not what an ideal sharder would:
//
//   parameters      fp32. Replicated, ZeRO-1 and ZeRO-2 hold the whole model; ZeRO-3 a 1/world shard of the
//                   blocks and of the edges (an untied embedding and head that train), the rest whole (final
//                   norm, a tied head, GPT-2's positions; train/strategies/fully_sharded.hpp). LoRA in bf16 holds
//                   its frozen blocks and edges in bf16 (hold_frozen_in_compute_dtype), under ZeRO-3 sharded
//   gradients       fp32, of what trains (LoRA: the adapters). Whole for Replicated and ZeRO-1, a shard for
//                   ZeRO-2, ZeRO-3's blocks and edges a shard and the rest whole
//   optimizer state AdamW's two fp32 moments of what trains: whole for Replicated, a shard for ZeRO-1/2/3
//   bf16 weights    autocast's bf16 copy of every fp32 Linear weight, cached for the forward (Replicated, ZeRO-1/2);
//                   under ZeRO-3 only autocast's copy of a tied head (each unit's shard is converted to bf16 as it
//                   is gathered: no copy kept, FSDP2's 16 bytes a parameter over N)
//   gathered unit   ZeRO-3: the largest unit gathered for compute, a block or the untied head
//   in flight       ZeRO-3's backward, besides the activations not yet consumed (train/strategies/fully_sharded.hpp):
//                   the unit computing and the one prefetched (gathered: 2 bytes a parameter in bf16, 4 in fp32),
//                   the computing unit's whole gradients (its parameters' .grad, in the compute dtype), and the
//                   padded fp32 inputs of the two reduce-scatters in flight (the head's first, then blocks'); on a
//                   CPU over Gloo (world > 1) each of those also has Gloo's all-reduce scratch of its size (Gloo
//                   reduce-scatters as an all-reduce). Measured on the CPU: 6 units beside the block's gradients.
//   activations     what autograd keeps for backward, counted tensor by tensor from the families' code (per
//                   token and layer, full fine-tuning: Llama 18·h + 4·kv + 8·i bytes under bf16 autocast (24·h +
//                   4·kv + 8·i with the projections of one input unfused, models/kernels/fused_projections.hpp; v is
//                   copied out of the fused q/k/v product, which attention would otherwise keep whole through it),
//                   28·h + 8·kv + 16·i in fp32 (fused under FusedProjections::always, the same and the concatenated
//                   fp32 weights of the fused groups, 4·(q + 2·kv + 2·i)·h bytes a layer whatever the tokens); GPT-2
//                   38·h and 68·h; a frozen Linear keeps no input), or with
//                   recomputation (--activation-checkpointing full, under ZeRO-3 too) each block's input (ZeRO-3's
//                   bf16 residual stream: 2 bytes a hidden unit after the first block, else 4) plus one
//                   block's worth, or with selective recomputation each block's input and its matrix products'
//                   outputs (Llama q + 2·kv + h + 2·i + h elements a token, GPT-2 3·h + h + 4·h + h; LoRA's rank-r
//                   middles besides; 2 bytes each under bf16 autocast, 4 in fp32) plus one block's worth
//   logits          the head's output, its fp32 copy and its gradient (10 bytes per token and vocabulary entry
//                   in bf16, 12 in fp32), or one chunk's (--loss-chunk-tokens); on a GPU in bf16, 6 (the fp32
//                   logits and their bf16 gradient: the row kernel of models/kernels/cross_entropy_rows.hpp, which
//                   takes all the tokens as one chunk at --loss-chunk-tokens 0; 5.9 measured on an H200)
//   host heap       on a CPU only: the C allocator's freed chunks the peak still holds, about the step's transient
//                   bytes (plan_memory says what was measured)
//
// --float8 (models/kernels/float8_projections.hpp) changes none of these figures, and the plan does not read it: the
// float8 node keeps what the bf16 node keeps for backward (the bf16 casts of each projection's input and weight, as
// torchao's recipe does: each gradient quantises them again along its own reduction dimension), and its e4m3 copies
// (1 byte a parameter or activation, with a 4-byte scale a row) live for one product each, inside the transient
// bytes of a step, not held between products.
//
// The peak is the weights, the optimizer state and the bf16 copies, plus the larger of the forward's end
// (activations and logits) and the backward's end (gradients and one block's activations), plus the runtime's
// own (the CUDA context and LibTorch's kernels: stated, not measured here). ZeRO-3 keeps its gradient shards
// between steps (they are where the reduce-scatters sum), so they are resident from the first step on, and its
// backward peaks while the activations of the blocks still to come are held beside the units in flight: the
// largest of those sums over the blocks, the head's backward (with the logits) first. Host memory at load is what each
// rank builds on the host before the strategy takes over, times the ranks of a node: under ZeRO-3 without LoRA
// the parameters outside the blocks and one block at a time (lm::from_pretrained leaves the blocks empty and
// each rank reads only its slices of them, models/blocks.hpp); otherwise the whole model in fp32 (LoRA in bf16: its
// blocks and edges read straight into bf16).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/models/gpt2_config.hpp>
#include <hpctrain/models/kernels/fused_projections_mode.hpp>
#include <hpctrain/models/llama_config.hpp>
#include <hpctrain/models/recompute/recompute.hpp>

namespace hpctrain::lm {

/// What the plan reads of a model's config.
struct ModelShape {
  std::string family;           ///< "llama" or "gpt2"
  std::int64_t parameters = 0;  ///< every parameter
  std::int64_t layers = 0, hidden = 0, intermediate = 0, kv_width = 0, vocab = 0;
  std::int64_t block_parameters = 0;  ///< one transformer block's
  std::int64_t linear_weights = 0;    ///< every Linear weight (what autocast casts), the head included
  std::int64_t head_parameters = 0;   ///< the head's weight (vocab · hidden), tied or not
  bool tied = true;                   ///< the head is the token embedding (then neither is a ZeRO-3 edge)
  /// A Linear of a block: its name (LoRA's targets), its widths, and the group of Linears that read the same
  /// input (in fp32 they save one tensor between them; under autocast one bf16 cast when they run as one product,
  /// models/kernels/fused_projections.hpp, else each its own).
  struct Linear {
    std::string name;
    std::int64_t in = 0, out = 0;
    int group = 0;
  };
  std::vector<Linear> block_linears;
  /// Bytes per token and layer that autograd keeps besides the Linears' inputs (norm inputs, attention's
  /// q, k, v and output, the MLP's activation), under bf16 autocast and in fp32.
  std::int64_t other_saved_bf16 = 0, other_saved_fp32 = 0;
  /// Bytes per token, layer and key that attention computed in plain products keeps (soft-capped scores: the capped
  /// scores and the softmax, a head at a time), 0 where SDPA's kernels run; times the sequence.
  std::int64_t score_bytes_per_key = 0;
};

inline ModelShape model_shape(const models::LlamaConfig& c) {
  const auto h = c.hidden_size, q = c.num_attention_heads * c.head_dimension(), kv = c.kv_heads() * c.head_dimension();
  const auto i = c.intermediate_size;
  ModelShape shape{"llama", c.parameter_count(), c.num_hidden_layers,   h,  i, kv, c.vocab_size, 0,
                   0,       c.vocab_size * h,    c.tie_word_embeddings, {}, 0, 0};
  if (c.stacked_projections)  // Phi-3: the same products, q/k/v and gate/up each one Linear
    shape.block_linears = {
        {"qkv_proj", h, q + 2 * kv, 0}, {"o_proj", q, h, 1}, {"gate_up_proj", h, 2 * i, 2}, {"down_proj", i, h, 3}};
  else
    shape.block_linears = {{"q_proj", h, q, 0},    {"k_proj", h, kv, 0}, {"v_proj", h, kv, 0},  {"o_proj", q, h, 1},
                           {"gate_proj", h, i, 2}, {"up_proj", h, i, 2}, {"down_proj", i, h, 3}};
  // The input of each RMSNorm (fp32: the residual stream), SDPA's q, k, v and output, and gate_proj's and
  // up_proj's outputs (models::swiglu keeps those two only, and computes silu(gate) again in backward).
  shape.other_saved_bf16 = 4 * h + 2 * q + 4 * kv + 2 * q + 4 * h + 4 * i;
  shape.other_saved_fp32 = 4 * h + 4 * q + 8 * kv + 4 * q + 4 * h + 8 * i;
  if (c.qk_norm) {  // Qwen3's norms of q and k: under autocast (the unfused path) their bf16 input, its fp32 copy and
    // the bf16 normalised value; in fp32 (at::rms_norm) their input
    shape.other_saved_bf16 += (2 + 4 + 2) * (q + kv);
    shape.other_saved_fp32 += 4 * (q + kv);
  }
  if (c.sandwich_norms) {  // Gemma 2, 3: two more norms, of attention's and the MLP's bf16 outputs under autocast
                           // (their
    // fp32 copy and fp32 normalised value), of the fp32 stream in fp32
    shape.other_saved_bf16 += 2 * (4 + 4) * h;
    shape.other_saved_fp32 += 2 * 4 * h;
  }
  if (c.hidden_act != "silu") {  // GeGLU keeps gelu(gate) besides gate and up (the SwiGLU node recomputes silu)
    shape.other_saved_bf16 += 2 * i;
    shape.other_saved_fp32 += 4 * i;
  }
  if (c.attn_logit_softcapping) {  // Gemma 2: the capped scores (bf16 or fp32) and the fp32 softmax, per head and key
    shape.score_bytes_per_key = (2 + 4 + 2) * c.num_attention_heads;
    shape.other_saved_bf16 += 2 * (q - kv);  // the keys repeated to every query head
    shape.other_saved_fp32 += 4 * (q - kv);
  }
  const auto outside = c.vocab_size * h * (c.tie_word_embeddings ? 1 : 2) + h;
  shape.block_parameters = (shape.parameters - outside) / c.num_hidden_layers;
  for (const auto& linear : shape.block_linears) shape.linear_weights += linear.in * linear.out;
  shape.linear_weights = shape.linear_weights * c.num_hidden_layers + c.vocab_size * h;
  return shape;
}

inline ModelShape model_shape(const models::GPT2Config& c) {
  const auto h = c.n_embd, f = c.inner();
  ModelShape shape{"gpt2",           c.parameter_count(),   c.n_layer, h, f, h, c.vocab_size, 0, 0,
                   c.vocab_size * h, c.tie_word_embeddings, {},        0, 0};
  shape.block_linears = {{"c_attn", h, 3 * h, 0}, {"attn.c_proj", h, h, 1}, {"c_fc", h, f, 2}, {"mlp.c_proj", f, h, 3}};
  // Each LayerNorm's input, SDPA's q, k, v and output, GELU's input.
  shape.other_saved_bf16 = 4 * h + 6 * h + 2 * h + 4 * h + 2 * f;
  shape.other_saved_fp32 = 4 * h + 12 * h + 4 * h + 4 * h + 4 * f;
  const auto outside = c.vocab_size * h * (c.tie_word_embeddings ? 1 : 2) + c.n_positions * h + 2 * h;
  shape.block_parameters = (shape.parameters - outside) / c.n_layer;
  for (const auto& linear : shape.block_linears) shape.linear_weights += linear.in * linear.out;
  shape.linear_weights = shape.linear_weights * c.n_layer + c.vocab_size * h;
  return shape;
}

/// What the run declares.
struct PlanInput {
  ModelShape model;
  std::string strategy = "none";  ///< none (Replicated), zero1, zero2, zero3, hsdp
  int shard_group = 0;            ///< hsdp: the ranks a shard group holds (ZeRO-3 within it, replicated across)
  bool bf16 = false;              ///< autocast in bf16
  models::Recompute activation_checkpointing = models::Recompute::none;  ///< --activation-checkpointing
  std::int64_t lora_rank = 0;                                            ///< 0: every parameter trains
  std::vector<std::string> lora_targets;
  std::int64_t micro_batch = 1, sequence = 1;
  std::int64_t loss_chunk_tokens = 0;  ///< 0: whole logits
  /// The head's loss through the row kernel of models/kernels/cross_entropy_rows.hpp where it runs (a GPU, bf16), as
  /// the Trainer's step takes it; false: through ATen's operations (as before it, or where its probe fails).
  bool cross_entropy_kernel = true;
  int world = 1, ranks_per_node = 1;
  bool cpu = false;                                    ///< the ranks compute on the host over Gloo (no GPU asked for)
  std::int64_t runtime_bytes = std::int64_t{1} << 30;  ///< the CUDA context and LibTorch's kernels (stated)
  std::optional<double> gpu_bytes;                     ///< the memory of one GPU, when known
};

/// One rank's figures, in bytes.
struct MemoryPlan {
  std::int64_t trainable = 0;
  double parameters = 0, gradients = 0, optimizer_state = 0, bf16_weights = 0, gathered_unit = 0, activations = 0,
         activations_recomputed = 0, activations_selective = 0, logits = 0, runtime = 0;
  double in_flight = 0;        ///< ZeRO-3: the units in flight where its backward peaks (above the activations then)
  double host_heap_slack = 0;  ///< on a CPU: the C allocator's freed memory the step's peak still holds
  double peak = 0;             ///< per GPU
  double host_at_load = 0;     ///< per node
  std::optional<double> gpu;   ///< the GPU's memory, when known

  bool fits() const { return !gpu || peak <= *gpu; }
};

/// Whether LoRA puts an adapter on `linear` (a target names it, or its last part, or "all-linear").
inline bool lora_targets(const PlanInput& in, const ModelShape::Linear& linear) {
  return std::any_of(in.lora_targets.begin(), in.lora_targets.end(), [&](const std::string& target) {
    return target == "all-linear" || linear.name == target || linear.name.ends_with("." + target);
  });
}

/// The trainable parameters: every one, or LoRA's adapters ((in + out) · r per targeted Linear and layer).
inline std::int64_t trainable_parameters(const PlanInput& in) {
  if (in.lora_rank == 0) return in.model.parameters;
  std::int64_t per_layer = 0;
  for (const auto& linear : in.model.block_linears)
    if (lora_targets(in, linear)) per_layer += (linear.in + linear.out) * in.lora_rank;
  return per_layer * in.model.layers;
}

/// Whether the Linears of `group` run as one product (models/kernels/fused_projections.hpp): the switch allows it at
/// this precision (FusedProjections::under_autocast: under bf16 autocast only), the group has two Linears or more, and
/// none of them carries a LoRA adapter.
inline bool group_fuses(const PlanInput& in, int group) {
  const auto mode = models::fused_projections();
  if (mode == models::FusedProjections::never || (!in.bf16 && mode != models::FusedProjections::always)) return false;
  const auto& linears = in.model.block_linears;
  const auto members = std::count_if(linears.begin(), linears.end(), [&](const auto& l) { return l.group == group; });
  return members >= 2 && std::none_of(linears.begin(), linears.end(), [&](const ModelShape::Linear& l) {
           return l.group == group && in.lora_rank > 0 && lora_targets(in, l);
         });
}

/// Bytes autograd keeps per token and layer: the family's other saved tensors, plus the input of every Linear
/// whose weight trains or that carries an adapter (a frozen Linear needs only its weight for backward).
inline std::int64_t activation_bytes_per_token(const PlanInput& in) {
  const auto& m = in.model;
  const std::int64_t element = in.bf16 ? 2 : 4;
  std::int64_t bytes = in.bf16 ? m.other_saved_bf16 : m.other_saved_fp32;
  bytes += m.score_bytes_per_key * in.sequence;
  std::vector<int> groups_saved;
  for (const auto& linear : m.block_linears) {
    if (in.lora_rank > 0 && !lora_targets(in, linear)) continue;
    // fp32: one tensor, the input itself; under autocast one bf16 cast for a fused group, else each Linear its own.
    const bool shared = !in.bf16 || group_fuses(in, linear.group);
    if (!shared) {
      bytes += 2 * linear.in;
    } else if (std::find(groups_saved.begin(), groups_saved.end(), linear.group) == groups_saved.end()) {
      groups_saved.push_back(linear.group);
      bytes += element * linear.in;
    }
  }
  return bytes;
}

/// Bytes a layer keeps whatever its tokens: in fp32 under FusedProjections::always, the concatenation of each fused
/// group's weights (models/kernels/fused_projections.hpp: a fresh fp32 tensor each forward, which the product keeps for
/// its input's gradient). Under autocast the concatenation is of the weights' bf16 casts, counted as the bf16 weights.
inline std::int64_t fused_weight_bytes_per_layer(const PlanInput& in) {
  if (in.bf16) return 0;
  std::int64_t bytes = 0;
  for (const auto& linear : in.model.block_linears)
    if (group_fuses(in, linear.group)) bytes += 4 * linear.in * linear.out;
  return bytes;
}

/// Bytes a selectively recomputed block keeps per token besides its input: the outputs of its matrix products
/// (models/recompute/selective_recompute.hpp), in the compute dtype, and the rank-r middle of every adapter.
inline std::int64_t selective_bytes_per_token(const PlanInput& in) {
  const std::int64_t element = in.bf16 ? 2 : 4;
  std::int64_t bytes = 0;
  for (const auto& linear : in.model.block_linears) {
    bytes += element * linear.out;
    if (in.lora_rank > 0 && lora_targets(in, linear)) bytes += element * in.lora_rank;
  }
  return bytes;
}

/// Whether each rank reads only its slices of the blocks at load (ZeRO-3 and HSDP: the Trainer's defer_blocks).
inline bool reads_slices(const PlanInput& in) { return in.strategy == "zero3" || in.strategy == "hsdp"; }

/// Where ZeRO-3's backward peaks: the activations still held then and the units in flight beside them.
struct BackwardPeak {
  double activations = 0, in_flight = 0;
};

/// ZeRO-3's units as its backward holds them: bytes a block (the head) holds gathered, and the elements whose gradients
/// it computes and reduce-scatters (all of them in full fine-tuning; LoRA's adapters only). The embedding is not
/// gathered in backward: its gradient needs only the ids (fully_sharded.hpp's look_up_embedding).
struct Zero3Units {
  double block_gathered = 0, block_trained = 0, head_gathered = 0, head_trained = 0;
};

/// ZeRO-3's backward, unit by unit from the head (the header's "in flight"): before the backward of the k-th unit
/// from the end, the activations of the blocks not yet through backward (the current one's included; with the
/// logits while the head's runs) are held beside two gathered units, the computing unit's whole gradients, and the
/// reduce-scatters in flight (two at most: fully_sharded.hpp's max_reduce_scatters_in_flight), each with Gloo's
/// scratch copy on a CPU. `kept`: every block's activations; `per_layer`: one block's.
inline BackwardPeak zero3_backward_peak(const PlanInput& in, double kept, double per_layer, double logits,
                                        const Zero3Units& units) {
  const auto& m = in.model;
  const double compute_bytes = in.bf16 ? 2.0 : 4.0;
  const double reduce_copies = in.cpu && in.world > 1 ? 2.0 : 1.0;  // the fp32 input, and Gloo's scratch of it
  const double layers = static_cast<double>(m.layers);
  // The other blocks' activations are what `kept` holds beyond one block's (recomputation: their inputs).
  const double others = std::max(0.0, kept - per_layer) / std::max(1.0, layers - 1.0);
  BackwardPeak peak;
  std::vector<double> reducing;  // the parameters of the units whose reduce-scatter started, oldest first
  // Before a unit's backward: it and the previous one (prefetched) gathered, its gradients whole, two reduce-scatters.
  const auto consider = [&](double activations, double gathered, double trained, double previous_bytes) {
    double in_flight = gathered + compute_bytes * trained + previous_bytes;
    for (std::size_t r = reducing.size() > 2 ? reducing.size() - 2 : 0; r < reducing.size(); ++r)
      in_flight += 4.0 * reduce_copies * reducing[r];
    if (activations + in_flight > peak.activations + peak.in_flight) peak = {activations, in_flight};
    reducing.push_back(trained);
  };
  if (units.head_gathered > 0) consider(kept + logits, units.head_gathered, units.head_trained, units.block_gathered);
  for (double k = 0; k < layers; ++k)  // the bottom block prefetches nothing
    consider(per_layer + others * (layers - 1.0 - k), units.block_gathered, units.block_trained,
             k + 1 < layers ? units.block_gathered : 0.0);
  return peak;
}

/// The activations the run keeps, as --activation-checkpointing asks.
inline double kept_activations(const PlanInput& in, const MemoryPlan& plan) {
  switch (in.activation_checkpointing) {
    case models::Recompute::selective: return plan.activations_selective;
    case models::Recompute::full: return plan.activations_recomputed;
    default: return plan.activations;
  }
}

/// Bytes a logit costs at the head's peak: on a GPU in bf16 the row kernel's fp32 logits and bf16 gradient
/// (switches.cross_entropy_rows, 2026-11-28 on an H200: 5.9 a logit above the step's other memory), elsewhere
/// ATen's operations' (bf16 output, fp32 copy, fp32 gradient: 10; fp32: 12).
inline double logit_bytes(const PlanInput& in) {
  if (in.bf16 && !in.cpu && in.cross_entropy_kernel) return 6.0;
  return in.bf16 ? 10.0 : 12.0;
}

inline MemoryPlan plan_memory(const PlanInput& in) {
  const auto& m = in.model;
  // hsdp is ZeRO-3 within its shard group: the model states are sharded over the group only.
  const bool zero3 = in.strategy == "zero3" || in.strategy == "hsdp";
  const double world = in.strategy == "hsdp" && in.shard_group > 0 ? in.shard_group : in.world;
  const double blocks = static_cast<double>(m.layers * m.block_parameters);
  const double outside = static_cast<double>(m.parameters) - blocks;
  MemoryPlan plan;
  plan.trainable = trainable_parameters(in);
  const double trainable = static_cast<double>(plan.trainable);
  const bool lora = in.lora_rank > 0;
  const double compute_bytes = in.bf16 ? 2.0 : 4.0, block = static_cast<double>(m.block_parameters);
  // ZeRO-3's edges: an untied embedding and head, units whether they train or not (LoRA's, frozen, held as its blocks).
  const double head = static_cast<double>(m.head_parameters), edge_head = !m.tied ? head : 0.0, edges = 2.0 * edge_head;
  // What trains of the blocks, the edges and the rest (LoRA's adapters are all in the blocks).
  const double trainable_blocks = lora ? trainable : blocks, trainable_outside = lora ? 0.0 : outside - edges,
               trained_edges = lora ? 0.0 : edges;
  // LoRA's frozen base: its blocks, edges and a tied table in the compute dtype (hold_frozen_in_compute_dtype, ZeRO-3's
  // frozen_dtype), the rest (norms, GPT-2's positions) in fp32. A tied table is read in fp32, then held narrow.
  const double tied_table = m.tied ? head : 0.0, rest = outside - edges - tied_table;
  const double frozen_base = compute_bytes * (blocks + edges + tied_table) + 4.0 * rest;
  if (zero3 && lora)  // the blocks' and edges' frozen parameters sharded, the adapters' fp32 shards
    plan.parameters =
        (compute_bytes * (blocks + edges) + 4.0 * trainable) / world + compute_bytes * tied_table + 4.0 * rest;
  else if (lora)  // the frozen base whole
    plan.parameters = frozen_base + 4.0 * trainable;
  else
    plan.parameters = 4.0 * (zero3 ? (blocks + edges) / world + outside - edges : static_cast<double>(m.parameters)) +
                      (lora ? 4.0 * trainable : 0.0);
  if (in.strategy == "none" || in.strategy == "zero1") plan.gradients = 4.0 * trainable;
  else if (in.strategy == "zero2") plan.gradients = 4.0 * trainable / world;
  else plan.gradients = 4.0 * ((trainable_blocks + trained_edges) / world + trainable_outside);
  plan.optimizer_state = 8.0 * (in.strategy == "none" ? trainable : trainable / world);
  // ZeRO-3 in bf16 converts each unit's shard as it gathers it (no copy kept); autocast casts a tied head (outside the
  // units) for each forward, unless LoRA's (frozen, held in bf16). LoRA's frozen head is gathered in the dtype it is
  // held in, the compute dtype.
  Zero3Units units;
  units.block_gathered = compute_bytes * (lora ? block + trainable / static_cast<double>(m.layers) : block);
  units.block_trained = lora ? trainable / static_cast<double>(m.layers) : block;
  units.head_gathered = compute_bytes * edge_head;
  units.head_trained = lora ? 0.0 : edge_head;
  if (zero3) plan.gathered_unit = std::max(units.block_gathered, units.head_gathered);
  if (zero3 && in.bf16) plan.bf16_weights = m.tied && !lora ? 2.0 * head : 0.0;
  else if (in.bf16 && lora)  // autocast casts the adapters; the frozen blocks, edges and tied table are bf16
    plan.bf16_weights = 2.0 * trainable;
  else if (in.bf16) plan.bf16_weights = 2.0 * static_cast<double>(m.linear_weights);
  const double tokens = static_cast<double>(in.micro_batch * in.sequence);
  const double per_layer = tokens * static_cast<double>(activation_bytes_per_token(in)) +
                           static_cast<double>(fused_weight_bytes_per_layer(in));
  plan.activations = per_layer * static_cast<double>(m.layers);
  // Each block's input: fp32 (autocast's residual stream), or under ZeRO-3 in bf16 the first fp32 and the rest bf16.
  const double stream_bytes = zero3 && in.bf16 ? 2.0 : 4.0;
  const double block_inputs =
      tokens * static_cast<double>(m.hidden) * (4.0 + stream_bytes * static_cast<double>(m.layers - 1));
  plan.activations_recomputed = block_inputs + per_layer;
  // The block being recomputed holds its own products in its graph: counted once, in its worth (per_layer).
  plan.activations_selective =
      block_inputs + tokens * static_cast<double>(selective_bytes_per_token(in) * (m.layers - 1)) + per_layer;
  const double kept = kept_activations(in, plan);
  const double logit_tokens =
      in.loss_chunk_tokens > 0 ? std::min<double>(tokens, static_cast<double>(in.loss_chunk_tokens)) : tokens;
  plan.logits = logit_tokens * static_cast<double>(m.vocab) * logit_bytes(in);
  plan.runtime = static_cast<double>(in.runtime_bytes);
  const double resident = plan.parameters + plan.optimizer_state + plan.bf16_weights + plan.runtime;
  double transient = 0;  // what the step allocates and frees again, at its peak
  if (zero3) {
    const auto backward = zero3_backward_peak(in, kept, per_layer, plan.logits, units);
    plan.in_flight = backward.in_flight;
    transient = std::max(kept + plan.logits + plan.gathered_unit, backward.activations + backward.in_flight);
    plan.peak = resident + plan.gradients + transient;
  } else {
    transient = std::max(kept + plan.logits, plan.gradients + per_layer);
    plan.peak = resident + plan.gathered_unit + transient;
  }
  // The host's heap (glibc under the Trainer's keep_freed_memory, train/host_memory.hpp) keeps every chunk freed,
  // and a step's tensors are not laid back where the previous step's were: its resident peak exceeds the most it
  // holds in use by about the step's transient bytes. Measured on the 137M Llama of bench/plan_vs_measured (zero3,
  // fp32, glibc's mallinfo2 around every unit): the heap's high-water above the most it held in use was 0.61, 1.24
  // and 1.34-1.82 times the transient bytes at --local 1, 2 and 4; counted as once them.
  if (in.cpu) plan.host_heap_slack = transient;
  plan.peak += plan.host_heap_slack;
  // At load a rank builds one block at a time and what is outside the units whole (ZeRO-3: the edges read as slices);
  // else the whole model, LoRA's blocks and edges read straight into the compute dtype (trainer_reads_blocks).
  plan.host_at_load = (reads_slices(in) ? 4.0 * (outside - edges + static_cast<double>(m.block_parameters))
                                        : (lora ? frozen_base + (4.0 - compute_bytes) * tied_table
                                                : 4.0 * static_cast<double>(m.parameters))) *
                      in.ranks_per_node;
  plan.gpu = in.gpu_bytes;
  return plan;
}

/// A number of bytes for the plan's table: "14.96 GiB", "512.0 MiB".
inline std::string plan_bytes(double bytes) {
  constexpr double gib = 1024.0 * 1024.0 * 1024.0;
  if (bytes >= gib) return fmt::format("{:.2f} GiB", bytes / gib);
  return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024.0));
}

/// "8.03B", "6.8M", "7.2K": a parameter count.
inline std::string parameter_count_label(std::int64_t count) {
  const double n = static_cast<double>(count);
  if (n >= 1e9) return fmt::format("{:.2f}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.1f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}K", n / 1e3);
  return std::to_string(count);
}

/// The plan as `--plan` prints it.
inline std::string format_plan(const PlanInput& in, const MemoryPlan& plan) {
  std::string out = fmt::format(
      "memory plan: {} ({} parameters, {} trainable{}), {}, {}, {} rank(s) ({}), micro-batch {} x {} tokens{}\n",
      in.model.family, parameter_count_label(in.model.parameters), parameter_count_label(plan.trainable),
      in.lora_rank > 0 ? fmt::format(", LoRA r={}", in.lora_rank) : "",
      in.strategy == "none" ? "replicated" : in.strategy, in.bf16 ? "bf16" : "fp32", in.world,
      in.strategy == "hsdp" ? fmt::format("{} per node, shard groups of {}", in.ranks_per_node, in.shard_group)
                            : fmt::format("{} per node", in.ranks_per_node),
      in.micro_batch, in.sequence,
      in.loss_chunk_tokens > 0 ? fmt::format(", loss in chunks of {}", in.loss_chunk_tokens) : "");
  const auto row = [&](const char* name, double bytes, const std::string& note = {}) {
    out += fmt::format("  {:<28} {:>12}{}\n", name, plan_bytes(bytes), note.empty() ? "" : "  " + note);
  };
  out += in.cpu ? "per rank (host memory):\n" : "per GPU:\n";
  const bool zero3 = in.strategy == "zero3" || in.strategy == "hsdp";
  const auto base = [&](const char* held) {
    return fmt::format("the frozen base {}, its blocks and untied edges in {}; the adapters in fp32", held,
                       in.bf16 ? "bf16" : "fp32");
  };
  row(in.lora_rank > 0 ? "parameters" : "parameters (fp32)", plan.parameters,
      in.lora_rank > 0 ? base(zero3 ? "sharded" : "whole") : "");
  row("gradients (fp32)", plan.gradients);
  row("optimizer state (AdamW)", plan.optimizer_state);
  if (plan.bf16_weights > 0) row("bf16 weights (autocast)", plan.bf16_weights);
  if (plan.gathered_unit > 0)
    row("gathered unit", plan.gathered_unit,
        plan.gathered_unit > (in.bf16 ? 2.0 : 4.0) * static_cast<double>(in.model.block_parameters) * 1.01 ? "the head"
                                                                                                           : "a block");
  if (plan.in_flight > 0)
    row("in flight in backward", plan.in_flight, "gathered units, a unit's gradients, reduce-scatter inputs");
  const auto alternatives = [&](models::Recompute recompute) {
    std::string others;
    for (const auto other : {models::Recompute::none, models::Recompute::selective, models::Recompute::full}) {
      if (other == recompute) continue;
      PlanInput with = in;
      with.activation_checkpointing = other;
      others += fmt::format("{}{} {}", others.empty() ? "" : ", ", plan_bytes(kept_activations(with, plan)),
                            models::recompute_name(other));
    }
    return others;
  };
  const auto recompute = in.activation_checkpointing;
  const char* how = recompute == models::Recompute::none        ? "kept"
                    : recompute == models::Recompute::selective ? "selective: matrix products kept"
                                                                : "recomputed";
  row("activations", kept_activations(in, plan),
      fmt::format("{}; {} (--activation-checkpointing)", how, alternatives(recompute)));
  row("logits", plan.logits);
  if (plan.host_heap_slack > 0)
    row("host heap's freed memory", plan.host_heap_slack, "kept by the C allocator: about the step's transient bytes");
  row("runtime (stated)", plan.runtime, in.cpu ? "LibTorch, Gloo, the data" : "CUDA context and kernels");
  row("peak", plan.peak,
      plan.gpu ? fmt::format("of {} per GPU: {}", plan_bytes(*plan.gpu), plan.fits() ? "fits" : "DOES NOT FIT") : "");
  out += fmt::format(
      "per node at load: at least {} of host memory ({})\n", plan_bytes(plan.host_at_load),
      reads_slices(in)
          ? "each rank builds the parameters outside the blocks and edges and one block at a time, and reads "
            "only its slices of the rest"
      : in.lora_rank > 0 && in.bf16 ? "each rank builds the whole model, the frozen blocks and edges in bf16"
                                    : "each rank builds the whole model in fp32");
  return out;
}

}  // namespace hpctrain::lm
