#pragma once
// What every language-model family shares: the key/value cache for generation, causal attention through
// `torch::scaled_dot_product_attention`, and `CausalLM`, the interface generation, export and the
// fully-sharded strategy use without knowing the family.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <hpctrain/error.hpp>
#include <hpctrain/models/blocks.hpp>
#include <hpctrain/models/kernels/mixed_precision_products.hpp>
#include <hpctrain/models/recompute/activation_checkpoint.hpp>

namespace hpctrain::models {

/// Keys and values of the tokens already seen, one pair per layer, preallocated to `capacity` positions
/// (no reallocation while generating). A forward with a cache attends to the cached tokens and appends
/// its own.
class KVCache {
 public:
  /// Shape per layer: [batch, kv_heads, capacity, head_dim].
  KVCache(std::int64_t layers, std::int64_t batch, std::int64_t kv_heads, std::int64_t capacity, std::int64_t head_dim,
          torch::TensorOptions options)
      : capacity_(capacity) {
    for (std::int64_t i = 0; i < layers; ++i) {
      keys_.push_back(torch::zeros({batch, kv_heads, capacity, head_dim}, options));
      values_.push_back(torch::zeros({batch, kv_heads, capacity, head_dim}, options));
    }
  }

  /// Tokens already cached: the position of the next token.
  std::int64_t length() const { return length_; }
  std::int64_t capacity() const { return capacity_; }
  /// Forgets every token (the buffers are kept).
  void reset() { length_ = 0; }

  /// Stores `keys`/`values` ([batch, kv_heads, T, head_dim]) of `layer` after the cached tokens and returns
  /// every key and value of the layer so far ([batch, kv_heads, length + T, head_dim]).
  std::pair<torch::Tensor, torch::Tensor> update(std::size_t layer, const torch::Tensor& keys,
                                                 const torch::Tensor& values) {
    const auto t = keys.size(2);
    keys_.at(layer).narrow(2, length_, t).copy_(keys);
    values_.at(layer).narrow(2, length_, t).copy_(values);
    // In the new keys' dtype: a block computing in bf16 over fp32 parameters (ZeRO-3 under bf16) reads its
    // cache in bf16, though the cache was made in the parameters' dtype.
    return {keys_[layer].narrow(2, 0, length_ + t).to(keys.scalar_type()),
            values_[layer].narrow(2, 0, length_ + t).to(values.scalar_type())};
  }

  /// Called by the model once every layer has stored `tokens` new positions.
  void advance(std::int64_t tokens) { length_ += tokens; }

  /// RuntimeError unless `tokens` more positions fit.
  void check_room(std::int64_t tokens) const {
    if (length_ + tokens > capacity_)
      throw RuntimeError(
          errors::runtime_generation,
          fmt::format("the KV cache holds {} positions; {} cached + {} new do not fit", capacity_, length_, tokens));
  }

 private:
  std::vector<torch::Tensor> keys_, values_;
  std::int64_t capacity_ = 0;
  std::int64_t length_ = 0;
};

/// How packed rows attend (several examples in one row, each attending only within itself): a boolean mask
/// ([B, 1, T, T], true = may attend; SDPA's masked kernels), or, on CUDA in bf16/fp16, the examples as
/// variable-length sequences over the flattened [B·T] tokens (`cu_seqlens`, int32 [n + 1], as flash-attention's
/// varlen interface and transformers' packed path take them) for ATen's flash kernel, which a mask rules out.
struct PackedAttention {
  torch::Tensor mask;
  torch::Tensor cu_seqlens;
  std::int64_t max_length = 0;
};

namespace detail {
/// Whether packed rows on CUDA take the variable-length flash kernel (on by default; the switch is the
/// suite's and the tests', to run the masked path beside it).
inline bool& varlen_attention_switch() {
  static bool on = true;
  return on;
}
}  // namespace detail

/// Turns the variable-length path for packed rows on CUDA on or off (process-wide; default on).
inline void set_varlen_attention(bool on) { detail::varlen_attention_switch() = on; }
inline bool varlen_attention() { return detail::varlen_attention_switch(); }

/// How attention scores its queries against its keys: SDPA's scale (none: head_dim^-1/2) and an optional soft cap
/// (cap·tanh(s / cap) on the scaled scores before the mask, Gemma 2's; 0: none).
struct AttentionScoring {
  std::optional<double> scale;
  double softcap = 0.0;
};

namespace detail {
/// Soft-capped attention in plain products, as transformers' eager_attention_forward computes it (SDPA's kernels
/// have no soft cap): scores q·kᵀ·scale capped, masked by `allowed` ([.., T, past + T], true = may attend), softmax
/// in fp32 cast back, dropout, then the values. Keys and values repeated for grouped-query attention.
inline torch::Tensor softcapped_attention(const torch::Tensor& q, torch::Tensor k, torch::Tensor v,
                                          const torch::Tensor& allowed, double dropout, const AttentionScoring& scoring,
                                          bool training) {
  if (k.size(1) != q.size(1)) {
    const auto groups = q.size(1) / k.size(1);
    k = k.repeat_interleave(groups, 1);
    v = v.repeat_interleave(groups, 1);
  }
  const double scale = scoring.scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  auto scores = torch::matmul(q, k.transpose(-2, -1)) * scale;
  scores = torch::tanh(scores / scoring.softcap) * scoring.softcap;
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  auto weights = torch::softmax(scores, -1, torch::kFloat32).to(q.scalar_type());
  if (dropout > 0.0) weights = torch::dropout(weights, dropout, training);
  return torch::matmul(weights, v.to(weights.scalar_type()));
}
}  // namespace detail

/// Causal self-attention of `q` [B, H, T, D] over `k`, `v` [B, KV, past + T, D]. Without cached tokens
/// this is `is_causal` (the flash / memory-efficient kernels on CUDA). With them, a single new token sees
/// everything; several new tokens need the causal mask aligned to the bottom right, which is_causal
/// (aligned top left) does not give. KV < H is grouped-query attention (enable_gqa). Packed rows (no cache)
/// attend within each example: through the variable-length flash kernel when `packed` holds cu_seqlens,
/// else through its mask. With a `window` (0: none), query i (at position past + i) attends only to the keys after
/// past + i - window, as transformers' sliding_window_overlay has it: flash's window_size_left is window - 1; the
/// masked kernels get the band as a mask, only when the keys reach beyond the window (else it changes nothing).
/// `scoring` scales the scores (SDPA's and flash's scale) and soft-caps them, which only plain products compute.
inline torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      std::int64_t past, double dropout, const PackedAttention& packed = {},
                                      std::int64_t window = 0, const AttentionScoring& scoring = {}) {
  const bool grouped = k.size(1) != q.size(1);
  const auto t = q.size(2);
  const auto scale = scoring.scale;
  if (past + t <= window) window = 0;  // every key is within the window of every query
  if (scoring.softcap > 0.0) {
    TORCH_CHECK(!packed.cu_seqlens.defined(), "soft-capped attention takes packed rows as a mask, not cu_seqlens");
    auto allowed = torch::ones({t, past + t}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).tril(past);
    if (window > 0) allowed = allowed.triu(past - window + 1);
    if (packed.mask.defined()) allowed = packed.mask.logical_and(allowed);
    return detail::softcapped_attention(q, k, v, allowed, dropout, scoring, dropout > 0.0);
  }
  if (packed.cu_seqlens.defined()) {
    // [B, H, T, D] -> [B·T, H, D] in the kernel's dtype (autocast's: this ATen op is not on its lists).
    const auto dtype = at::autocast::is_autocast_enabled(q.device().type())
                           ? at::autocast::get_autocast_dtype(q.device().type())
                           : q.scalar_type();
    const auto flat = [&](const torch::Tensor& x) {
      return x.transpose(1, 2).reshape({-1, x.size(1), x.size(3)}).to(dtype);
    };
    const auto out = std::get<0>(at::_flash_attention_forward(
        flat(q), flat(k), flat(v), packed.cu_seqlens, packed.cu_seqlens, packed.max_length, packed.max_length, dropout,
        /*is_causal=*/true,
        /*return_debug_mask=*/false, scale, window > 0 ? std::optional<std::int64_t>(window - 1) : std::nullopt,
        window > 0 ? std::optional<std::int64_t>(0) : std::nullopt));
    return out.view({q.size(0), q.size(2), q.size(1), q.size(3)}).transpose(1, 2);
  }
  if (window > 0) {  // causal and within the window: key j of query i when past + i - window < j <= past + i
    auto band = torch::ones({t, past + t}, torch::TensorOptions().dtype(torch::kBool).device(q.device()))
                    .tril(past)
                    .triu(past - window + 1);
    if (packed.mask.defined()) band = packed.mask.logical_and(band);  // a packed example's tokens are consecutive
    return torch::scaled_dot_product_attention(q, k, v, band, dropout, false, scale, grouped);
  }
  if (packed.mask.defined())
    return torch::scaled_dot_product_attention(q, k, v, packed.mask, dropout, false, scale, grouped);
  if (past == 0) return torch::scaled_dot_product_attention(q, k, v, {}, dropout, /*is_causal=*/true, scale, grouped);
  if (t == 1) return torch::scaled_dot_product_attention(q, k, v, {}, dropout, false, scale, grouped);
  auto causal = torch::ones({t, past + t}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).tril(past);
  return torch::scaled_dot_product_attention(q, k, v, causal, dropout, false, scale, grouped);
}

/// Where each token of a packed row sits: `position_ids` [B, T] (int64, restarting at 0 for every packed
/// example) and `document_ids` [B, T] (which example a token belongs to; padding has its own id, -1).
/// Attention stays causal and within one example, so a packed row computes what its examples would alone.
struct TokenLayout {
  torch::Tensor position_ids;
  torch::Tensor document_ids;
};

/// The block-diagonal causal mask of `document_ids` [B, T]: [B, 1, T, T], true where query i may attend to
/// key j (j ≤ i and both in the same example). On CPU SDPA takes it as it is; on CUDA a boolean mask rules out
/// the flash kernel (the memory-efficient one takes it), which the variable-length path avoids.
inline torch::Tensor packed_attention_mask(const torch::Tensor& document_ids) {
  const auto t = document_ids.size(1);
  const auto same = document_ids.unsqueeze(2) == document_ids.unsqueeze(1);  // [B, T, T]
  const auto causal =
      torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(document_ids.device())).tril();
  return same.logical_and(causal).unsqueeze(1);
}

/// The examples of packed rows as variable-length sequences over the flattened [B·T] tokens: a sequence
/// starts at every row's start and wherever the document id changes (padding, id -1, is one more sequence:
/// it attends only to itself, as under the mask). cu_seqlens int32 [n + 1] and the longest length. Reads
/// two numbers back to the host (the sequence count and the longest), once per forward.
inline PackedAttention varlen_sequences(const torch::Tensor& document_ids) {
  const auto rows = document_ids.size(0), t = document_ids.size(1);
  auto starts = torch::ones_like(document_ids, torch::kBool);
  if (t > 1) starts.narrow(1, 1, t - 1).copy_(document_ids.narrow(1, 1, t - 1) != document_ids.narrow(1, 0, t - 1));
  const auto begins = starts.reshape({-1}).nonzero().squeeze(1);
  const auto cu = torch::cat({begins, torch::full({1}, rows * t, begins.options())}).to(torch::kInt32);
  const auto n = cu.size(0) - 1;
  PackedAttention packed;
  packed.max_length = (cu.narrow(0, 1, n) - cu.narrow(0, 0, n)).max().item<std::int64_t>();
  packed.cu_seqlens = cu;
  return packed;
}

/// How packed rows of `document_ids` attend in a forward whose activations are `activations`: the
/// variable-length flash kernel on CUDA in bf16/fp16 (autocast's or the model's dtype; flash has no fp32),
/// else the mask.
inline PackedAttention packed_attention(const torch::Tensor& document_ids, const torch::Tensor& activations,
                                        bool varlen_allowed = true) {
  const bool half = at::autocast::is_autocast_enabled(torch::kCUDA) || activations.scalar_type() == torch::kBFloat16 ||
                    activations.scalar_type() == torch::kFloat16;
  if (document_ids.is_cuda() && varlen_attention() && varlen_allowed && half) return varlen_sequences(document_ids);
  PackedAttention packed;
  packed.mask = packed_attention_mask(document_ids);
  return packed;
}

/// A decoder-only language model: token ids [B, T] in, logits [B, T, vocab] out.
class CausalLM : public torch::nn::Module, public ListsBlocks {
 public:
  /// Logits for `input_ids` [B, T]; with a cache, the tokens continue the cached ones and are appended.
  torch::Tensor forward(const torch::Tensor& input_ids, KVCache* cache = nullptr) {
    const auto t = input_ids.size(1);
    const std::int64_t past = cache != nullptr ? cache->length() : 0;
    if (cache != nullptr) cache->check_room(t);
    check_sequence(past + t);
    const auto positions =
        torch::arange(past, past + t, torch::TensorOptions().dtype(torch::kLong).device(input_ids.device()));
    auto logits = head(body(input_ids, positions, cache, {}));
    if (cache != nullptr) cache->advance(t);
    return logits;
  }
  /// Logits for packed rows: positions from `layout.position_ids`, attention causal within each example.
  torch::Tensor forward(const torch::Tensor& input_ids, const TokenLayout& layout) {
    return head(hidden_states(input_ids, &layout));
  }
  /// The logits of `hidden` [..., hidden]: hidden · head_weight()ᵀ, run as the head (ListsBlocks::run_edge),
  /// soft-capped where the family caps them (final_logit_softcap).
  torch::Tensor head(const torch::Tensor& hidden) {
    auto logits = run_edge(
        Edge::head, [this](const torch::Tensor& h) { return head_projection(h, head_weight()); }, hidden);
    if (const auto cap = final_logit_softcap(); cap > 0.0) logits = torch::tanh(logits / cap) * cap;
    return logits;
  }
  /// The cap of the logits (cap·tanh(logits / cap), Gemma 2's), 0 for none: a loss that applies head_weight() itself
  /// must apply it too, or refuse a model that has one.
  virtual double final_logit_softcap() const { return 0.0; }
  /// `call(hidden)` run as the head: for a loss that applies head_weight() itself (in chunks), so that under the
  /// fully sharded strategy the head's weight is whole during the call and its gradient is reduced after it.
  torch::Tensor with_head(const torch::Tensor& hidden, const BlockCall& call) {
    return run_edge(Edge::head, call, hidden);
  }
  /// The hidden states the head reads ([B, T, hidden], after the final norm) of a training forward without
  /// cache, packed when `layout` is given: what a loss takes that applies the head a chunk of tokens at a time,
  /// so that the tokens × vocabulary logits are never whole (lm::chunked_token_loss_sum).
  torch::Tensor hidden_states(const torch::Tensor& input_ids, const TokenLayout* layout = nullptr) {
    const auto t = input_ids.size(1);
    check_sequence(t);
    if (layout != nullptr) return body(input_ids, layout->position_ids, nullptr, layout->document_ids);
    return body(input_ids, torch::arange(t, torch::TensorOptions().dtype(torch::kLong).device(input_ids.device())),
                nullptr, {});
  }
  /// The head's weight [vocabulary, hidden] (the token embedding's when tied): logits = hidden · weightᵀ.
  virtual torch::Tensor head_weight() = 0;
  // blocks() (ListsBlocks): the transformer blocks in order; forward runs each through run_block, so the
  // fully sharded strategy can gather block by block.
  /// An empty cache for `batch` sequences of up to `capacity` positions, on the model's device and dtype.
  virtual KVCache make_cache(std::int64_t batch, std::int64_t capacity) = 0;
  /// The longest sequence the model accepts (learned positions), or nullopt (rotary positions).
  virtual std::optional<std::int64_t> max_positions() const = 0;
  /// The token that ends generation, from the config.
  virtual std::optional<std::int64_t> eos_token_id() const = 0;

 protected:
  /// Block `index` on `x`: through the block runner when a strategy installed one (the fully sharded one
  /// recomputes the block in backward itself when activation checkpointing is on), else checkpointed when
  /// activation checkpointing is on (selective or full) and this is a training forward without cache, else directly.
  torch::Tensor call_block(std::size_t index, const BlockCall& call, const torch::Tensor& x, const KVCache* cache) {
    if (has_block_runner()) return run_block(index, call, x);
    const auto recompute = activation_checkpointing();
    if (recompute != Recompute::none && cache == nullptr && is_training() && torch::GradMode::is_enabled())
      return checkpointed(call, x, {}, recompute);
    return call(x);
  }

  /// Refuses a sequence of `length` positions the family cannot compute (GPT-2's learned positions, a sliding
  /// window hpctrain does not implement): RuntimeError.
  virtual void check_sequence(std::int64_t length) const = 0;
  /// The embeddings at `positions` ([T], or [B, T] for packed rows), the blocks (attending within each example
  /// of `document_ids` when defined; through `cache` when given) and the final norm: what the head reads.
  virtual torch::Tensor body(const torch::Tensor& input_ids, const torch::Tensor& positions, KVCache* cache,
                             const torch::Tensor& document_ids) = 0;
};

}  // namespace hpctrain::models
