#pragma once
// RoBERTa (Liu et al. 2019) and BERT (Devlin et al. 2019) for masked-language modelling, as transformers'
// RobertaForMaskedLM / BertForMaskedLM compute them: embeddings (words + learned positions + token types,
// LayerNorm, dropout), post-LayerNorm encoder blocks (x = LN(x + attention(x)), x = LN(x + MLP(x)), exact
// GELU) whose attention is bidirectional with a key padding mask, and the masked-LM head (dense → GELU →
// LayerNorm → the word embedding, tied, plus its own bias). Module names are transformers' own, so a
// checkpoint maps one to one (`roberta.encoder.layer.0.attention.self.query.weight`, `lm_head.dense.weight`).
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <hpctrain/models/blocks.hpp>
#include <hpctrain/models/hf/hf_checkpoint.hpp>
#include <hpctrain/models/hf/hf_layout.hpp>
#include <hpctrain/models/initialization.hpp>
#include <hpctrain/models/recompute/activation_checkpoint.hpp>
#include <hpctrain/models/roberta_config.hpp>
#include <hpctrain/models/weights_from_checkpoint.hpp>

namespace hpctrain::models {

/// Positions as transformers' `create_position_ids_from_input_ids` makes them for RoBERTa: real tokens count
/// from padding_idx + 1 in order, padding keeps padding_idx. BERT: 0, 1, 2, ... whatever the padding.
inline torch::Tensor roberta_position_ids(const torch::Tensor& input_ids, const RobertaConfig& config) {
  if (config.model_type == "bert")
    return torch::arange(input_ids.size(1), input_ids.options()).unsqueeze(0).expand_as(input_ids);
  const auto real = input_ids.ne(config.pad_token_id).to(torch::kLong);
  return real.cumsum(1) * real + config.pad_token_id;
}

class RobertaEmbeddingsImpl : public torch::nn::Module {
 public:
  explicit RobertaEmbeddingsImpl(const RobertaConfig& config) {
    word_embeddings = register_module(
        "word_embeddings", make_embedding(torch::nn::EmbeddingOptions(config.vocab_size, config.hidden_size)));
    position_embeddings = register_module(
        "position_embeddings",
        make_embedding(torch::nn::EmbeddingOptions(config.max_position_embeddings, config.hidden_size)));
    token_type_embeddings =
        register_module("token_type_embeddings",
                        make_embedding(torch::nn::EmbeddingOptions(config.type_vocab_size, config.hidden_size)));
    LayerNorm = register_module(
        "LayerNorm",
        torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.hidden_size}).eps(config.layer_norm_eps)));
    dropout = register_module("dropout", torch::nn::Dropout(config.hidden_dropout_prob));
  }
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& position_ids,
                        const torch::Tensor& token_type_ids) {
    return dropout(LayerNorm(word_embeddings(input_ids) + position_embeddings(position_ids) +
                             token_type_embeddings(token_type_ids)));
  }
  torch::nn::Embedding word_embeddings{nullptr}, position_embeddings{nullptr}, token_type_embeddings{nullptr};
  torch::nn::LayerNorm LayerNorm{nullptr};  // NOLINT: transformers' name
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(RobertaEmbeddings);

/// q, k, v of the bidirectional self-attention (`attention.self`).
class RobertaSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit RobertaSelfAttentionImpl(const RobertaConfig& config)
      : heads_(config.num_attention_heads),
        head_dim_(config.head_dim()),
        dropout_(config.attention_probs_dropout_prob) {
    query = register_module("query", make_linear(torch::nn::LinearOptions(config.hidden_size, config.hidden_size)));
    key = register_module("key", make_linear(torch::nn::LinearOptions(config.hidden_size, config.hidden_size)));
    value = register_module("value", make_linear(torch::nn::LinearOptions(config.hidden_size, config.hidden_size)));
  }
  /// `keep` [B, 1, 1, T]: true where the key is a real token (or undefined: every key).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& keep) {
    const auto b = x.size(0), t = x.size(1);
    auto heads = [&](const torch::Tensor& y) { return y.view({b, t, heads_, head_dim_}).transpose(1, 2); };
    // An undefined mask must reach SDPA as no mask (nullopt), not as an undefined tensor: under bf16 autocast
    // SDPA checks the mask's dtype and refuses an undefined one.
    const auto mask = keep.defined() ? std::optional<torch::Tensor>(keep) : std::nullopt;
    auto y =
        torch::scaled_dot_product_attention(heads(linear(query, x)), heads(linear(key, x)), heads(linear(value, x)),
                                            mask, is_training() ? dropout_ : 0.0, /*is_causal=*/false);
    return y.transpose(1, 2).reshape({b, t, heads_ * head_dim_});
  }
  torch::nn::Linear query{nullptr}, key{nullptr}, value{nullptr};

 private:
  std::int64_t heads_, head_dim_;
  double dropout_;
};
TORCH_MODULE(RobertaSelfAttention);

/// A projection back into the residual stream, then dropout, the residual and LayerNorm (post-LN).
class RobertaResidualOutputImpl : public torch::nn::Module {
 public:
  RobertaResidualOutputImpl(std::int64_t in, const RobertaConfig& config) {
    dense = register_module("dense", make_linear(torch::nn::LinearOptions(in, config.hidden_size)));
    LayerNorm = register_module(
        "LayerNorm",
        torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.hidden_size}).eps(config.layer_norm_eps)));
    dropout = register_module("dropout", torch::nn::Dropout(config.hidden_dropout_prob));
  }
  torch::Tensor forward(const torch::Tensor& y, const torch::Tensor& residual) {
    return LayerNorm(dropout(linear(dense, y)) + residual);
  }
  torch::nn::Linear dense{nullptr};
  torch::nn::LayerNorm LayerNorm{nullptr};  // NOLINT: transformers' name
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(RobertaResidualOutput);

class RobertaAttentionImpl : public torch::nn::Module {
 public:
  explicit RobertaAttentionImpl(const RobertaConfig& config) {
    self_attention = register_module("self", RobertaSelfAttention(config));
    output = register_module("output", RobertaResidualOutput(config.hidden_size, config));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& keep) {
    return output(self_attention(x, keep), x);
  }
  RobertaSelfAttention self_attention{nullptr};
  RobertaResidualOutput output{nullptr};
};
TORCH_MODULE(RobertaAttention);

class RobertaIntermediateImpl : public torch::nn::Module {
 public:
  explicit RobertaIntermediateImpl(const RobertaConfig& config) {
    dense =
        register_module("dense", make_linear(torch::nn::LinearOptions(config.hidden_size, config.intermediate_size)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::gelu(linear(dense, x)); }  // exact GELU
  torch::nn::Linear dense{nullptr};
};
TORCH_MODULE(RobertaIntermediate);

/// One post-LayerNorm block: x = LN(x + attention(x)); x = LN(x + down(gelu(up(x)))).
class RobertaLayerImpl : public torch::nn::Module {
 public:
  explicit RobertaLayerImpl(const RobertaConfig& config) {
    attention = register_module("attention", RobertaAttention(config));
    intermediate = register_module("intermediate", RobertaIntermediate(config));
    output = register_module("output", RobertaResidualOutput(config.intermediate_size, config));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& keep) {
    const auto h = attention(x, keep);
    return output(intermediate(h), h);
  }
  RobertaAttention attention{nullptr};
  RobertaIntermediate intermediate{nullptr};
  RobertaResidualOutput output{nullptr};
};
TORCH_MODULE(RobertaLayer);

/// The encoder without a head (`roberta.` in a checkpoint): hidden states [B, T, hidden_size].
class RobertaModelImpl : public torch::nn::Module {
 public:
  explicit RobertaModelImpl(const RobertaConfig& config) : config_(config) {
    embeddings = register_module("embeddings", RobertaEmbeddings(config));
    auto encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
    layer = encoder->register_module("layer", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < config.num_hidden_layers; ++i) {
      layers_.push_back(RobertaLayer(config));
      layer->push_back(layers_.back());
    }
  }
  /// `attention_mask` [B, T] (1 = token, 0 = padding; undefined: all tokens), `token_type_ids` (undefined: 0).
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {},
                        const torch::Tensor& token_type_ids = {}) {
    auto x = embed(input_ids, token_type_ids);
    const auto keep = keep_mask(attention_mask);
    for (auto& block : layers_) x = block(x, keep);
    return x;
  }
  /// The embeddings of `input_ids` (positions counted past the padding, types 0 when undefined).
  torch::Tensor embed(const torch::Tensor& input_ids, const torch::Tensor& token_type_ids) {
    const auto types = token_type_ids.defined() ? token_type_ids : torch::zeros_like(input_ids);
    return embeddings(input_ids, roberta_position_ids(input_ids, config_), types);
  }
  /// The attention's key mask [B, 1, 1, T] of a padding mask [B, T] (undefined: every token attends).
  static torch::Tensor keep_mask(const torch::Tensor& attention_mask) {
    return attention_mask.defined() ? attention_mask.to(torch::kBool).unsqueeze(1).unsqueeze(2) : torch::Tensor();
  }
  const std::vector<RobertaLayer>& layers() const { return layers_; }
  RobertaEmbeddings embeddings{nullptr};
  torch::nn::ModuleList layer{nullptr};

 private:
  RobertaConfig config_;
  std::vector<RobertaLayer> layers_;
};
TORCH_MODULE(RobertaModel);

namespace detail {
/// Our names are transformers' RobertaForMaskedLM names; BERT's checkpoints say `bert.` and `cls.predictions.`.
inline CheckpointNaming roberta_naming(const RobertaConfig& config) {
  const bool bert = config.model_type == "bert";
  return {[bert](const std::string& ours) -> std::pair<std::string, bool> {
            if (!bert) return {ours, false};
            if (ours.rfind("roberta.", 0) == 0) return {"bert." + ours.substr(8), false};
            if (ours == "lm_head.bias") return {"cls.predictions.bias", false};
            if (ours.rfind("lm_head.dense.", 0) == 0)
              return {"cls.predictions.transform.dense." + ours.substr(14), false};
            if (ours.rfind("lm_head.layer_norm.", 0) == 0)
              return {"cls.predictions.transform.LayerNorm." + ours.substr(19), false};
            return {ours, false};
          },
          [](const std::string& hf) {  // the tied decoder, position/type id buffers, BERT's pooler
            const std::string_view name = hf;
            return name.ends_with("decoder.weight") || name.ends_with("decoder.bias") ||
                   name.ends_with("position_ids") || name.ends_with("token_type_ids") ||
                   name.find(".pooler.") != std::string_view::npos;
          }};
}
}  // namespace detail

/// RoBERTa with its masked-LM head: ids [B, T] (and a padding mask) → logits [B, T, vocab_size].
/// Its encoder layers are its blocks (ListsBlocks: ZeRO-3 gathers one at a time; activation checkpointing recomputes
/// them); the head is tied to the word embedding, so the model has no edges.
class RobertaForMaskedLMImpl : public torch::nn::Module, public HuggingFaceLayout, public ListsBlocks {
 public:
  explicit RobertaForMaskedLMImpl(RobertaConfig config) : config_(std::move(config)) {
    config_.validate();
    roberta = register_module("roberta", RobertaModel(config_));
    auto head = register_module("lm_head", std::make_shared<torch::nn::Module>());
    head_dense =
        head->register_module("dense", make_linear(torch::nn::LinearOptions(config_.hidden_size, config_.hidden_size)));
    head_norm = head->register_module(
        "layer_norm",
        torch::nn::LayerNorm(torch::nn::LayerNormOptions({config_.hidden_size}).eps(config_.layer_norm_eps)));
    head_bias = head->register_parameter("bias", torch::zeros({config_.vocab_size}));
    initialize_weights();
  }

  /// Logits for every position; the decoder is the word embedding (tied, as transformers saves it).
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {},
                        const torch::Tensor& token_type_ids = {}) {
    check_length(input_ids.size(1));
    auto h = roberta->embed(input_ids, token_type_ids);
    const auto keep = RobertaModelImpl::keep_mask(attention_mask);
    const auto& layers = roberta->layers();
    for (std::size_t i = 0; i < layers.size(); ++i)
      h = call_block(
          i, [layer = layers[i], keep](const torch::Tensor& x) mutable { return layer->forward(x, keep); }, h);
    const auto transformed = head_norm(torch::gelu(linear(head_dense, h)));
    return torch::linear(transformed, roberta->embeddings->word_embeddings->weight, head_bias);
  }

  /// transformers' `_init_weights`: linear and embedding weights N(0, initializer_range), biases 0, the
  /// padding rows of the embeddings 0, LayerNorms 1 and 0.
  void initialize_weights() {
    initialize_normal(*this, config_.initializer_range);
    torch::NoGradGuard no_grad;
    roberta->embeddings->word_embeddings->weight[config_.pad_token_id].zero_();
    if (config_.model_type == "roberta") roberta->embeddings->position_embeddings->weight[config_.pad_token_id].zero_();
    head_bias.zero_();
  }

  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override {
    std::vector<std::shared_ptr<torch::nn::Module>> out;
    for (const auto& layer : roberta->layers()) out.push_back(layer.ptr());
    return out;
  }
  const RobertaConfig& config() const { return config_; }
  nlohmann::ordered_json hf_config() const override { return config_.to_json(); }
  CheckpointNaming hf_naming() const override { return detail::roberta_naming(config_); }
  std::string hf_stated_dtype() const override { return config_.stated_dtype; }

  RobertaModel roberta{nullptr};
  torch::nn::Linear head_dense{nullptr};
  torch::nn::LayerNorm head_norm{nullptr};
  torch::Tensor head_bias;

 private:
  /// Block `index` on `x`: through the strategy's runner when one is installed, else checkpointed when activation
  /// checkpointing is on in a training forward, else directly (CausalLM::call_block's rule).
  torch::Tensor call_block(std::size_t index, const BlockCall& call, const torch::Tensor& x) {
    if (has_block_runner()) return run_block(index, call, x);
    const auto recompute = activation_checkpointing();
    if (recompute != Recompute::none && is_training() && torch::GradMode::is_enabled())
      return checkpointed(call, x, {}, recompute);
    return call(x);
  }
  void check_length(std::int64_t length) const {
    if (length > config_.max_length())
      throw RuntimeError(
          errors::runtime_sequence_length,
          fmt::format("{} sees at most {} tokens (max_position_embeddings = {}); got {}", config_.model_type,
                      config_.max_length(), config_.max_position_embeddings, length));
  }
  RobertaConfig config_;
};
TORCH_MODULE(RobertaForMaskedLM);

/// Reads `directory/config.json` as a RoBERTa (or BERT) config.
inline RobertaConfig read_roberta_config(const std::filesystem::path& directory) {
  return detail::read_config_file<RobertaConfig>(directory / "config.json");
}

/// A RobertaForMaskedLM (or BertForMaskedLM) from a Hugging Face directory; RuntimeError naming the file and
/// the tensor for a missing, misshapen or truncated one.
inline RobertaForMaskedLM load_roberta(const std::filesystem::path& directory, torch::Dtype dtype = torch::kFloat32) {
  const auto config = read_roberta_config(directory);
  const safetensors::Checkpoint checkpoint(directory);
  RobertaForMaskedLM model(nullptr);
  {
    WeightsFromCheckpoint uninitialised;  // the load writes every parameter (and refuses a checkpoint lacking one)
    model = RobertaForMaskedLM(config);
  }
  model->to(dtype);
  load_weights(*model, checkpoint, detail::roberta_naming(config), directory);
  return model;
}

}  // namespace hpctrain::models
