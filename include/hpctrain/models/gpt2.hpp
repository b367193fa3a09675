#pragma once
// The GPT-2 family as a LibTorch module, shaped like nanoGPT's model.py: token + learned position
// embeddings, n_layer pre-LayerNorm blocks (x + attn(ln_1(x)), then x + mlp(ln_2(x))), a final LayerNorm and
// a head tied to the token embedding. Module names follow transformers' GPT2LMHeadModel without its
// `transformer.` prefix, so checkpoint names map one to one (models/hf/hf_checkpoint.hpp).
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include <torch/torch.h>

#include <hpctrain/models/causal_lm.hpp>
#include <hpctrain/models/gpt2_config.hpp>
#include <hpctrain/models/hf/hf_layout.hpp>
#include <hpctrain/models/initialization.hpp>
#include <hpctrain/models/weights_from_checkpoint.hpp>
#include <hpctrain/models/lora/lora_layer.hpp>
#include <hpctrain/models/recompute/activation_checkpoint.hpp>

namespace hpctrain::models {

/// Multi-head causal self-attention: one projection to q, k, v (`c_attn`), one back (`c_proj`).
class GPT2AttentionImpl : public torch::nn::Module {
 public:
  explicit GPT2AttentionImpl(const GPT2Config& config)
      : n_head_(config.n_head), head_dim_(config.head_dim()), attn_pdrop_(config.attn_pdrop) {
    c_attn = register_module("c_attn", make_linear(torch::nn::LinearOptions(config.n_embd, 3 * config.n_embd)));
    c_proj = register_module("c_proj", make_linear(torch::nn::LinearOptions(config.n_embd, config.n_embd)));
    resid_dropout = register_module("resid_dropout", torch::nn::Dropout(config.resid_pdrop));
  }

  torch::Tensor forward(const torch::Tensor& x, KVCache* cache, std::size_t layer, const PackedAttention& packed = {}) {
    const auto b = x.size(0), t = x.size(1), width = x.size(2);
    auto qkv = linear(c_attn, x).split(width, /*dim=*/2);
    auto heads = [&](const torch::Tensor& y) { return y.view({b, t, n_head_, head_dim_}).transpose(1, 2); };
    auto q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
    std::int64_t past = 0;
    if (cache != nullptr) {
      past = cache->length();
      std::tie(k, v) = cache->update(layer, k, v);
    }
    auto y = causal_attention(q, k, v, past, is_training() ? attn_pdrop_ : 0.0, packed);
    y = y.transpose(1, 2).contiguous().view({b, t, width});
    return resid_dropout(linear(c_proj, y));
  }

  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};
  torch::nn::Dropout resid_dropout{nullptr};

 private:
  std::int64_t n_head_, head_dim_;
  double attn_pdrop_;
};
TORCH_MODULE(GPT2Attention);

/// The MLP: widen (`c_fc`), GELU, narrow (`c_proj`).
class GPT2MLPImpl : public torch::nn::Module {
 public:
  explicit GPT2MLPImpl(const GPT2Config& config) : approximate_(config.gelu_tanh() ? "tanh" : "none") {
    c_fc = register_module("c_fc", make_linear(torch::nn::LinearOptions(config.n_embd, config.inner())));
    c_proj = register_module("c_proj", make_linear(torch::nn::LinearOptions(config.inner(), config.n_embd)));
    dropout = register_module("dropout", torch::nn::Dropout(config.resid_pdrop));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return dropout(linear(c_proj, torch::gelu(linear(c_fc, x), approximate_)));
  }

  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};
  torch::nn::Dropout dropout{nullptr};

 private:
  std::string approximate_;
};
TORCH_MODULE(GPT2MLP);

/// One pre-LayerNorm transformer block.
class GPT2BlockImpl : public torch::nn::Module {
 public:
  GPT2BlockImpl(const GPT2Config& config, std::size_t layer) : layer_(layer) {
    const auto norm = torch::nn::LayerNormOptions({config.n_embd}).eps(config.layer_norm_epsilon);
    ln_1 = register_module("ln_1", torch::nn::LayerNorm(norm));
    attn = register_module("attn", GPT2Attention(config));
    ln_2 = register_module("ln_2", torch::nn::LayerNorm(norm));
    mlp = register_module("mlp", GPT2MLP(config));
  }

  torch::Tensor forward(torch::Tensor x, KVCache* cache = nullptr, const PackedAttention& packed = {}) {
    x = x + attn->forward(ln_1(x), cache, layer_, packed);
    x = x + mlp(ln_2(x));
    return x;
  }

  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  GPT2Attention attn{nullptr};
  GPT2MLP mlp{nullptr};

 private:
  std::size_t layer_;
};
TORCH_MODULE(GPT2Block);

namespace detail {
/// GPT-2's names in a checkpoint: `prefix` is "transformer." (transformers) or "" (OpenAI's original files); the
/// Conv1D projections are stored transposed.
inline CheckpointNaming gpt2_naming(const GPT2Config& config, std::string prefix) {
  return {[prefix](const std::string& ours) -> std::pair<std::string, bool> {
            if (ours == "lm_head.weight") return {ours, false};
            const std::string_view name = ours;
            const bool conv1d = name.ends_with(".weight") && (name.find(".c_attn.") != std::string_view::npos ||
                                                              name.find(".c_proj.") != std::string_view::npos ||
                                                              name.find(".c_fc.") != std::string_view::npos);
            return {prefix + ours, conv1d};
          },
          [tied = config.tie_word_embeddings](const std::string& hf) {
            const std::string_view name = hf;
            return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") ||
                   (tied && hf == "lm_head.weight");
          }};
}
}  // namespace detail

/// GPT-2 with its language-model head: ids [B, T] → logits [B, T, vocab_size].
class GPT2Impl : public CausalLM, public HuggingFaceLayout {
 public:
  explicit GPT2Impl(GPT2Config config) : config_(std::move(config)) {
    config_.validate();
    wte = register_module("wte", make_embedding(torch::nn::EmbeddingOptions(config_.vocab_size, config_.n_embd)));
    wpe = register_module("wpe", make_embedding(torch::nn::EmbeddingOptions(config_.n_positions, config_.n_embd)));
    drop = register_module("drop", torch::nn::Dropout(config_.embd_pdrop));
    h = register_module("h", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < config_.n_layer; ++i) {
      block_list_.push_back(GPT2Block(config_, static_cast<std::size_t>(i)));
      BlockConstruction::built(*block_list_.back());  // a loader may empty it before the next is built
      h->push_back(block_list_.back());
    }
    ln_f = register_module(
        "ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config_.n_embd}).eps(config_.layer_norm_epsilon)));
    if (!config_.tie_word_embeddings)
      lm_head = register_module("lm_head",
                                make_linear(torch::nn::LinearOptions(config_.n_embd, config_.vocab_size).bias(false)));
    initialize_weights();
  }

  torch::Tensor head_weight() override { return config_.tie_word_embeddings ? wte->weight : lm_head->weight; }
  torch::Tensor tied_embedding() override { return config_.tie_word_embeddings ? wte->weight : torch::Tensor(); }
  /// The token embedding and the head, when untied (ListsBlocks::edge); the position embedding stays whole.
  std::shared_ptr<torch::nn::Module> edge(Edge edge) override {
    if (config_.tie_word_embeddings) return nullptr;
    if (edge == Edge::embedding) return wte.ptr();
    return lm_head.ptr();
  }

  /// GPT-2's initialisation (Radford et al. 2019, as in nanoGPT and transformers): every weight
  /// N(0, initializer_range), biases 0, LayerNorms 1/0, and the projections back into the residual stream
  /// (`attn.c_proj`, `mlp.c_proj`) scaled by 1/sqrt(2·n_layer) since each block adds two of them.
  void initialize_weights() {
    const double std = config_.initializer_range;
    const double residual_std = std / std::sqrt(2.0 * static_cast<double>(config_.n_layer));
    initialize_normal(*this, std);
    for (auto& block : block_list_) {
      init_normal(block->attn->c_proj->weight, 0.0, residual_std);
      init_normal(block->mlp->c_proj->weight, 0.0, residual_std);
    }
  }

  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override {
    std::vector<std::shared_ptr<torch::nn::Module>> out;
    for (auto& block : block_list_) out.push_back(block.ptr());
    return out;
  }

  KVCache make_cache(std::int64_t batch, std::int64_t capacity) override {
    return KVCache(config_.n_layer, batch, config_.n_head, capacity, config_.head_dim(),
                   torch::TensorOptions().dtype(wte->weight.dtype()).device(wte->weight.device()));
  }
  std::optional<std::int64_t> max_positions() const override { return config_.n_positions; }
  std::optional<std::int64_t> eos_token_id() const override { return config_.eos_token_id; }
  const GPT2Config& config() const { return config_; }
  nlohmann::ordered_json hf_config() const override { return config_.to_json(); }
  CheckpointNaming hf_naming() const override { return detail::gpt2_naming(config_, "transformer."); }
  std::string hf_stated_dtype() const override { return config_.stated_dtype; }

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList h{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};  ///< only when tie_word_embeddings is false

 private:
  void check_sequence(std::int64_t length) const override {
    if (length > config_.n_positions)
      throw RuntimeError(
          errors::runtime_sequence_length,
          fmt::format("GPT-2 sees at most n_positions = {} tokens; got {}", config_.n_positions, length));
  }

  torch::Tensor body(const torch::Tensor& input_ids, const torch::Tensor& positions, KVCache* cache,
                     const torch::Tensor& document_ids) override {
    auto x = drop(run_edge(
                      Edge::embedding, [this](const torch::Tensor& ids) { return wte(ids); }, input_ids) +
                  wpe(positions));
    const auto packed = document_ids.defined() ? packed_attention(document_ids, x) : PackedAttention{};
    for (std::size_t i = 0; i < block_list_.size(); ++i) {
      x = call_block(
          i,
          [block = block_list_[i], cache, packed](const torch::Tensor& input) mutable {
            return block->forward(input, cache, packed);
          },
          x, cache);
    }
    return ln_f(x);
  }

  GPT2Config config_;
  std::vector<GPT2Block> block_list_;
};
TORCH_MODULE(GPT2);

}  // namespace hpctrain::models
