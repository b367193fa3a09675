#pragma once
// The Llama family as a LibTorch module, shaped like torchtitan's llama3 model.py: token embedding,
// num_hidden_layers blocks (h = x + attention(norm(x)), out = h + mlp(norm(h))) with RMSNorm, rotary
// positions (rope_theta, optional Llama 3 scaling), grouped-query attention and a SwiGLU MLP, then a final
// RMSNorm and the head. Rotary embeddings turn the two halves of each head against each other
// ("rotate_half"), the layout of Hugging Face checkpoints. Module names follow transformers'
// LlamaForCausalLM without its `model.` prefix (models/hf/hf_checkpoint.hpp maps them).
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <torch/torch.h>

#include <hpctrain/models/causal_lm.hpp>
#include <hpctrain/models/hf/hf_layout.hpp>
#include <hpctrain/models/initialization.hpp>
#include <hpctrain/models/kernels/fused_projections.hpp>
#include <hpctrain/models/kernels/rms_norm.hpp>
#include <hpctrain/models/kernels/rotary.hpp>
#include <hpctrain/models/kernels/swiglu.hpp>
#include <hpctrain/models/llama_config.hpp>
#include <hpctrain/models/lora/lora_layer.hpp>
#include <hpctrain/models/recompute/activation_checkpoint.hpp>
#include <hpctrain/models/weights_from_checkpoint.hpp>

namespace hpctrain::models {

/// Root-mean-square normalisation (Zhang & Sennrich 2019), computed in fp32 whatever the input dtype.
/// An fp32 input, what training under autocast gives (the residual stream stays fp32: embedding plus bf16
/// projections promotes), goes through at::rms_norm, which on CUDA is one fused kernel each way
/// (`_fused_rms_norm`) instead of six elementwise and reduction kernels; on the CPU it computes the same in fp32
/// (equal within reassociation, tests/lm/lm_step_test.cpp). A 16-bit weight there (LoRA's frozen blocks held in bf16,
/// train/strategies/replicated.hpp) is widened for it: transformers' product of it with the fp32 normalised input
/// promotes to fp32 alike. A 16-bit input keeps transformers'
/// order (normalise in fp32, cast to the input's dtype, then scale), which the fused kernel does not: on CUDA a 16-bit
/// input with a weight of its dtype (the bf16 residual stream of ZeRO-3 and HSDP) in the row kernels of
/// models/kernels/rms_norm.hpp, one each way, elsewhere in ATen's operations.
/// With `unit_offset` (Gemma's norms) the scale is 1 + weight, its weights start at 0, and other dtypes scale in
/// fp32 before the cast back (Gemma's order).
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(std::int64_t dim, double eps, bool unit_offset = false) : eps_(eps), unit_offset_(unit_offset) {
    weight = register_parameter("weight", unit_offset ? torch::zeros({dim}) : torch::ones({dim}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    if (x.scalar_type() == torch::kFloat32) {
      const auto scale = weight.to(torch::kFloat32);
      return at::rms_norm(x, {scale.size(0)}, unit_offset_ ? scale + 1.0 : scale, eps_);
    }
    if (!unit_offset_) return rms_norm(x, weight, eps_);  // the row kernels for a bf16 x and weight on CUDA
    return unfused(x);
  }
  /// transformers' LlamaRMSNorm (or Gemma's) step by step (the reference the fused path is checked against).
  torch::Tensor unfused(const torch::Tensor& x) {
    if (!unit_offset_) return detail::rms_norm_composite(x, weight, eps_);
    auto y = x.to(torch::kFloat32);
    y = y * torch::rsqrt(y.pow(2).mean(-1, /*keepdim=*/true) + eps_);
    return (y * (weight.to(torch::kFloat32) + 1.0)).to(x.scalar_type());
  }
  /// The value that makes the scale 1 (a fresh norm's weight).
  double identity_weight() const { return unit_offset_ ? 0.0 : 1.0; }
  torch::Tensor weight;

 private:
  double eps_;
  bool unit_offset_;
};
TORCH_MODULE(RMSNorm);

/// The rotary frequencies θ_i = rope_theta^(-2i/d), rescaled as `rope_scaling` asks (Llama 3.1: long
/// wavelengths divided by `factor`, short ones kept, a smooth blend between), in fp32. `local`: those of the sliding
/// layers where the config gives them a base of their own (Gemma 3: local_rope_theta, unscaled).
inline torch::Tensor rotary_inverse_frequencies(const LlamaConfig& config, bool local = false) {
  const auto dim = config.head_dimension();
  auto exponents = torch::arange(0, dim, 2, torch::kInt64).to(torch::kFloat32) / static_cast<double>(dim);
  const double theta = local ? config.local_rope_theta.value() : config.rope_theta;
  auto inv_freq = 1.0 / torch::pow(theta, exponents);
  if (!config.rope_scaling || local) return inv_freq;
  const auto& s = *config.rope_scaling;
  if (s.rope_type == "linear") return inv_freq / s.factor;
  const double old_context = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / s.low_freq_factor;
  const double high_freq_wavelen = old_context / s.high_freq_factor;
  auto wavelen = 2.0 * M_PI / inv_freq;
  auto scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
  auto smooth = (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  auto smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  auto medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return torch::where(medium, smoothed, scaled);
}

/// Grouped-query attention: num_attention_heads query heads share num_key_value_heads key/value heads. q, k and v
/// are three Linears, or one `qkv_proj` whose outputs are [q | k | v] (Phi-3: LlamaConfig::stacked_projections).
/// Layer `layer` attends within its sliding window when the config gives it one (LlamaConfig::window_of).
class LlamaAttentionImpl : public torch::nn::Module {
 public:
  LlamaAttentionImpl(const LlamaConfig& config, std::size_t layer)
      : heads_(config.num_attention_heads),
        kv_heads_(config.kv_heads()),
        head_dim_(config.head_dimension()),
        dropout_(config.attention_dropout),
        window_(config.window_of(static_cast<std::int64_t>(layer)).value_or(0)),
        scoring_{config.attention_scale(), config.attn_logit_softcapping.value_or(0.0)} {
    const auto d = config.hidden_size;
    auto linear = [&](std::int64_t in, std::int64_t out, bool bias) {
      return make_linear(torch::nn::LinearOptions(in, out).bias(bias));
    };
    const bool qkv_bias = config.attention_bias || config.qkv_bias;  // Qwen2: q, k, v only
    if (config.stacked_projections) {
      qkv_proj = register_module("qkv_proj", linear(d, (heads_ + 2 * kv_heads_) * head_dim_, qkv_bias));
    } else {
      q_proj = register_module("q_proj", linear(d, heads_ * head_dim_, qkv_bias));
      k_proj = register_module("k_proj", linear(d, kv_heads_ * head_dim_, qkv_bias));
      v_proj = register_module("v_proj", linear(d, kv_heads_ * head_dim_, qkv_bias));
    }
    o_proj = register_module("o_proj", linear(heads_ * head_dim_, d, config.attention_bias));
    if (config.qk_norm) {  // Qwen3, Gemma 3: registered after the projections, in transformers' order
      q_norm = register_module("q_norm", RMSNorm(head_dim_, config.rms_norm_eps, config.unit_offset_norms));
      k_norm = register_module("k_norm", RMSNorm(head_dim_, config.rms_norm_eps, config.unit_offset_norms));
    }
  }

  torch::Tensor forward(const torch::Tensor& x, const RotaryAngles& angles, KVCache* cache, std::size_t layer,
                        const PackedAttention& packed = {}) {
    const auto b = x.size(0), t = x.size(1);
    const auto qkv = projections(x);
    auto q = normed(q_norm, qkv[0].reshape({b, t, heads_, head_dim_})).transpose(1, 2);
    auto k = normed(k_norm, qkv[1].reshape({b, t, kv_heads_, head_dim_})).transpose(1, 2);
    // v copied out of a fused product's output (a no-op for v_proj's own): attention keeps v for backward, and as a
    // view v would keep the whole q/k/v output alive (q and k are new tensors after rotary), q + kv more elements a
    // token and layer for kv's copy.
    auto v = qkv[2].contiguous().reshape({b, t, kv_heads_, head_dim_}).transpose(1, 2);
    q = apply_rotary(q, angles);
    k = apply_rotary(k, angles);
    std::int64_t past = 0;
    if (cache != nullptr) {
      past = cache->length();
      std::tie(k, v) = cache->update(layer, k, v);
    }
    auto y = causal_attention(q, k, v, past, is_training() ? dropout_ : 0.0, packed, window_, scoring_);
    return linear(o_proj, y.transpose(1, 2).reshape({b, t, heads_ * head_dim_}));
  }

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  torch::nn::Linear qkv_proj{nullptr};       ///< instead of q, k and v with LlamaConfig::stacked_projections (Phi-3)
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  ///< only with LlamaConfig::qk_norm (Qwen3, Gemma 3)

 private:
  /// q, k and v of `x`: one product either way under autocast (models/kernels/fused_projections.hpp), split where the
  /// three are one Linear.
  std::vector<torch::Tensor> projections(const torch::Tensor& x) {
    if (!qkv_proj) return linears({&q_proj, &k_proj, &v_proj}, x);
    return linear(qkv_proj, x).split_with_sizes({heads_ * head_dim_, kv_heads_ * head_dim_, kv_heads_ * head_dim_}, -1);
  }

  /// Each head normalised over its head_dim when the config asks for it (the last dimension of [B, T, heads, D]).
  static torch::Tensor normed(RMSNorm& norm, const torch::Tensor& heads) { return norm ? norm(heads) : heads; }

  std::int64_t heads_, kv_heads_, head_dim_;
  double dropout_;
  std::int64_t window_;  ///< the sliding window, 0 for full attention
  AttentionScoring scoring_;
};
TORCH_MODULE(LlamaAttention);

/// SwiGLU (Shazeer 2020): down(silu(gate(x)) * up(x)), the elementwise part one node (models/kernels/swiglu.hpp), or
/// GeGLU with GELU for silu (Gemma's: tanh-approximated, "gelu_pytorch_tanh", or exact, "gelu").
/// gate and up are two Linears, or one `gate_up_proj` whose outputs are [gate | up] (Phi-3).
class LlamaMLPImpl : public torch::nn::Module {
 public:
  explicit LlamaMLPImpl(const LlamaConfig& config)
      : gelu_(config.hidden_act == "silu"   ? ""
              : config.hidden_act == "gelu" ? "none"
                                            : "tanh") {
    auto linear = [&](std::int64_t in, std::int64_t out) {
      return make_linear(torch::nn::LinearOptions(in, out).bias(config.mlp_bias));
    };
    if (config.stacked_projections) {
      gate_up_proj = register_module("gate_up_proj", linear(config.hidden_size, 2 * config.intermediate_size));
    } else {
      gate_proj = register_module("gate_proj", linear(config.hidden_size, config.intermediate_size));
      up_proj = register_module("up_proj", linear(config.hidden_size, config.intermediate_size));
    }
    down_proj = register_module("down_proj", linear(config.intermediate_size, config.hidden_size));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    if (gate_up_proj) return linear(down_proj, glu(linear(gate_up_proj, x)));
    const auto gate_up = joined_linears({&gate_proj, &up_proj}, x);  // one product under autocast
    return linear(down_proj, gate_up.joined.defined() ? glu(gate_up.joined) : glu(gate_up.parts[0], gate_up.parts[1]));
  }

  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  torch::nn::Linear gate_up_proj{nullptr};  ///< instead of gate and up with LlamaConfig::stacked_projections (Phi-3)

 private:
  /// act(gate) * up of [gate | up] along the last dimension.
  torch::Tensor glu(const torch::Tensor& joined) {
    if (gelu_.empty()) return swiglu(joined);
    const auto halves = joined.chunk(2, -1);
    return glu(halves[0], halves[1]);
  }
  torch::Tensor glu(const torch::Tensor& gate, const torch::Tensor& up) {
    if (gelu_.empty()) return swiglu(gate, up);
    return torch::gelu(gate, gelu_) * up;
  }

  std::string gelu_;  ///< GELU's approximation ("tanh", "none"), empty for SwiGLU
};
TORCH_MODULE(LlamaMLP);

/// One pre-norm block.
class LlamaBlockImpl : public torch::nn::Module {
 public:
  LlamaBlockImpl(const LlamaConfig& config, std::size_t layer) : layer_(layer) {
    const auto norm = [&] { return RMSNorm(config.hidden_size, config.rms_norm_eps, config.unit_offset_norms); };
    input_layernorm = register_module("input_layernorm", norm());
    self_attn = register_module("self_attn", LlamaAttention(config, layer));
    post_attention_layernorm = register_module("post_attention_layernorm", norm());
    mlp = register_module("mlp", LlamaMLP(config));
    if (config.sandwich_norms) {
      pre_feedforward_layernorm = register_module("pre_feedforward_layernorm", norm());
      post_feedforward_layernorm = register_module("post_feedforward_layernorm", norm());
    }
  }

  /// Pre-norm: h = x + attention(norm(x)), out = h + mlp(norm(h)). With sandwich norms (Gemma 2, 3) each branch's
  /// output is normalised too before it joins: h = x + norm(attention(norm(x))), out = h + norm(mlp(norm(h))).
  torch::Tensor forward(const torch::Tensor& x, const RotaryAngles& angles, KVCache* cache = nullptr,
                        const PackedAttention& packed = {}) {
    const auto attention = self_attn->forward(input_layernorm(x), angles, cache, layer_, packed);
    if (!pre_feedforward_layernorm) {
      auto h = x + attention;
      return h + mlp(post_attention_layernorm(h));
    }
    auto h = x + post_attention_layernorm(attention);
    return h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)));
  }

  /// post_attention_layernorm: before the MLP, or with sandwich norms after attention.
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  RMSNorm pre_feedforward_layernorm{nullptr}, post_feedforward_layernorm{nullptr};  ///< with sandwich norms only
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};

 private:
  std::size_t layer_;
};
TORCH_MODULE(LlamaBlock);

namespace detail {
/// Llama's (and Qwen2's, Qwen3's, Mistral's, Phi-3's) names in a checkpoint: ours under `model.`, the head as it is.
inline CheckpointNaming llama_naming(const LlamaConfig& config) {
  return {[](const std::string& ours) -> std::pair<std::string, bool> {
            if (ours == "lm_head.weight") return {ours, false};
            return {"model." + ours, false};
          },
          [tied = config.tie_word_embeddings](const std::string& hf) {
            return std::string_view(hf).ends_with(".rotary_emb.inv_freq") || (tied && hf == "lm_head.weight");
          }};
}
}  // namespace detail

/// Llama with its language-model head: ids [B, T] → logits [B, T, vocab_size].
class LlamaImpl : public CausalLM, public HuggingFaceLayout {
 public:
  explicit LlamaImpl(LlamaConfig config) : config_(std::move(config)) {
    config_.validate();
    auto embedding = torch::nn::EmbeddingOptions(config_.vocab_size, config_.hidden_size);
    if (config_.pad_token_id) embedding.padding_idx(*config_.pad_token_id);  // no gradient to that row, as transformers
    embed_tokens = register_module("embed_tokens", make_embedding(embedding));
    layers = register_module("layers", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < config_.num_hidden_layers; ++i) {
      block_list_.push_back(LlamaBlock(config_, static_cast<std::size_t>(i)));
      BlockConstruction::built(*block_list_.back());  // a loader may empty it before the next is built
      layers->push_back(block_list_.back());
    }
    norm = register_module("norm", RMSNorm(config_.hidden_size, config_.rms_norm_eps, config_.unit_offset_norms));
    if (!config_.tie_word_embeddings)
      lm_head = register_module(
          "lm_head", make_linear(torch::nn::LinearOptions(config_.hidden_size, config_.vocab_size).bias(false)));
    inv_freq_ = rotary_inverse_frequencies(config_);
    if (config_.local_rope_theta) local_inv_freq_ = rotary_inverse_frequencies(config_, /*local=*/true);
    initialize_weights();
  }

  torch::Tensor head_weight() override { return config_.tie_word_embeddings ? embed_tokens->weight : lm_head->weight; }
  torch::Tensor tied_embedding() override {
    return config_.tie_word_embeddings ? embed_tokens->weight : torch::Tensor();
  }
  /// The embedding and the head, when untied (ListsBlocks::edge).
  std::shared_ptr<torch::nn::Module> edge(Edge edge) override {
    if (config_.tie_word_embeddings) return nullptr;
    if (edge == Edge::embedding) return embed_tokens.ptr();
    return lm_head.ptr();
  }

  /// transformers' Llama initialisation: every weight N(0, initializer_range), biases 0, norms the identity (weights
  /// 1, or 0 where they scale by 1 + weight).
  void initialize_weights() {
    initialize_normal(*this, config_.initializer_range);
    for (auto& module : modules(/*include_self=*/false))
      if (auto* rms = module->as<RMSNorm>()) init_fill(rms->weight, rms->identity_weight());
  }

  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override {
    std::vector<std::shared_ptr<torch::nn::Module>> out;
    for (auto& block : block_list_) out.push_back(block.ptr());
    return out;
  }
  KVCache make_cache(std::int64_t batch, std::int64_t capacity) override {
    return KVCache(config_.num_hidden_layers, batch, config_.kv_heads(), capacity, config_.head_dimension(),
                   torch::TensorOptions().dtype(embed_tokens->weight.dtype()).device(embed_tokens->weight.device()));
  }
  std::optional<std::int64_t> max_positions() const override { return std::nullopt; }
  std::optional<std::int64_t> eos_token_id() const override { return config_.eos_token_id; }
  const LlamaConfig& config() const { return config_; }
  nlohmann::ordered_json hf_config() const override { return config_.to_json(); }
  CheckpointNaming hf_naming() const override { return detail::llama_naming(config_); }
  std::string hf_stated_dtype() const override { return config_.stated_dtype; }
  double final_logit_softcap() const override { return config_.final_logit_softcapping.value_or(0.0); }

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};  ///< only when tie_word_embeddings is false

 private:
  /// Rotary positions have no limit, and a sliding window is applied, not refused: any length is computed.
  void check_sequence(std::int64_t /*length*/) const override {}

  torch::Tensor body(const torch::Tensor& input_ids, const torch::Tensor& positions, KVCache* cache,
                     const torch::Tensor& document_ids) override {
    auto x = run_edge(
        Edge::embedding, [this](const torch::Tensor& ids) { return embed_tokens(ids); }, input_ids);
    // √hidden_size rounded to the embeddings' dtype first (a 0-dim tensor of it), as transformers' Gemma does.
    if (config_.scaled_embeddings)
      x = x * torch::scalar_tensor(std::sqrt(static_cast<double>(config_.hidden_size)), x.options());
    // Soft-capped scores have no flash kernel: packed rows take the mask.
    const auto packed = document_ids.defined()
                            ? packed_attention(document_ids, x, /*varlen_allowed=*/!config_.attn_logit_softcapping)
                            : PackedAttention{};
    const auto global_angles = rotary_angles_of(positions, x, inv_freq_);
    const auto local_angles =
        local_inv_freq_.defined() ? rotary_angles_of(positions, x, local_inv_freq_) : global_angles;
    for (std::size_t i = 0; i < block_list_.size(); ++i) {
      const auto& angles = config_.local_rotary(static_cast<std::int64_t>(i)) ? local_angles : global_angles;
      x = call_block(
          i,
          [block = block_list_[i], angles, cache, packed](const torch::Tensor& input) mutable {
            return block->forward(input, angles, cache, packed);
          },
          x, cache);
    }
    return norm(x);
  }

  /// The rotary angles of `positions` (models::RotaryAngles): cos and sin [T, head_dim] for positions [T],
  /// [B, 1, T, head_dim] for per-row positions [B, T] (packed rows), in x's dtype. The frequencies stay fp32 (a
  /// plain member, not a buffer, so that casting the module leaves them alone).
  RotaryAngles rotary_angles_of(const torch::Tensor& positions, const torch::Tensor& x, torch::Tensor& inv_freq) {
    if (inv_freq.device() != x.device()) inv_freq = inv_freq.to(x.device());
    auto freqs = positions.to(torch::kFloat32).unsqueeze(-1) * inv_freq;  // [..., T, head_dim / 2]
    auto angles = torch::cat({freqs, freqs}, -1);
    if (angles.dim() == 3) angles = angles.unsqueeze(1);  // [B, 1, T, D]: broadcast over heads
    return {angles.cos().to(x.scalar_type()), angles.sin().to(x.scalar_type())};
  }

  LlamaConfig config_;
  std::vector<LlamaBlock> block_list_;
  torch::Tensor inv_freq_;
  torch::Tensor local_inv_freq_;  ///< the sliding layers' (LlamaConfig::local_rope_theta), when they have their own
};
TORCH_MODULE(Llama);

}  // namespace hpctrain::models
