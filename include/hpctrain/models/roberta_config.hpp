#pragma once
// RoBERTa's (and BERT's) configuration as transformers' RobertaConfig / BertConfig name it, with their
// published defaults (roberta-base), read from and written to `config.json`, validated, and the training
// FLOPs of an encoder. Torch-free.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/error.hpp>
#include <hpctrain/models/hf/config_json.hpp>

namespace hpctrain::models {

/// An encoder of post-LayerNorm blocks with learned positions (Liu et al. 2019; Devlin et al. 2019).
struct RobertaConfig {
  std::string model_type = "roberta";     ///< roberta or bert (positions from 0, no padding offset). Default: roberta
  std::int64_t vocab_size = 50265;        ///< Default: 50265
  std::int64_t hidden_size = 768;         ///< Default: 768
  std::int64_t num_hidden_layers = 12;    ///< Default: 12
  std::int64_t num_attention_heads = 12;  ///< Default: 12
  std::int64_t intermediate_size = 3072;  ///< Default: 3072
  std::string hidden_act = "gelu";        ///< only the exact "gelu". Default: "gelu"
  double hidden_dropout_prob = 0.1;       ///< Default: 0.1
  double attention_probs_dropout_prob = 0.1;     ///< Default: 0.1
  std::int64_t max_position_embeddings = 514;    ///< Default: 514 (512 positions + padding_idx + 1)
  std::int64_t type_vocab_size = 1;              ///< Default: 1 (BERT: 2)
  double initializer_range = 0.02;               ///< Default: 0.02
  double layer_norm_eps = 1e-5;                  ///< Default: 1e-5 (BERT: 1e-12)
  std::int64_t pad_token_id = 1;                 ///< Default: 1 (BERT: 0)
  std::optional<std::int64_t> bos_token_id = 0;  ///< Default: 0
  std::optional<std::int64_t> eos_token_id = 2;  ///< Default: 2
  /// The weights' dtype the config.json stated (`dtype` or `torch_dtype`). Default: "" (not stated)
  std::string stated_dtype;
  /// Keys of the config.json this was read from that hpctrain does not know (reported in one warning line).
  std::vector<std::string> unread_keys;

  /// RoBERTa counts positions from padding_idx + 1 (fairseq's convention); BERT from 0.
  std::int64_t position_offset() const { return model_type == "roberta" ? pad_token_id + 1 : 0; }
  std::int64_t head_dim() const { return hidden_size / num_attention_heads; }
  /// The longest sequence the learned positions cover.
  std::int64_t max_length() const { return max_position_embeddings - position_offset(); }

  /// Throws SpecError `[hpctrain.spec.roberta.<field>]` naming the first invalid field.
  void validate() const {
    using hpctrain::detail::require;
    require(model_type == "roberta" || model_type == "bert", "roberta.model_type", model_type,
            "must be roberta or bert");
    require(vocab_size >= 1, "roberta.vocab_size", vocab_size, "must be at least 1");
    require(hidden_size >= 1, "roberta.hidden_size", hidden_size, "must be at least 1");
    require(num_hidden_layers >= 1, "roberta.num_hidden_layers", num_hidden_layers, "must be at least 1");
    require(num_attention_heads >= 1 && hidden_size % num_attention_heads == 0, "roberta.num_attention_heads",
            num_attention_heads, fmt::format("must divide hidden_size = {}", hidden_size));
    require(intermediate_size >= 1, "roberta.intermediate_size", intermediate_size, "must be at least 1");
    require(hidden_act == "gelu", "roberta.hidden_act", hidden_act, "only the exact \"gelu\" is supported");
    require(type_vocab_size >= 1, "roberta.type_vocab_size", type_vocab_size, "must be at least 1");
    require(pad_token_id >= 0 && pad_token_id < vocab_size, "roberta.pad_token_id", pad_token_id, "must be a token id");
    require(max_length() >= 1, "roberta.max_position_embeddings", max_position_embeddings,
            fmt::format("must exceed the position offset {}", position_offset()));
  }

  /// Reads a transformers `config.json` object (model_type roberta or bert); an absent field takes the default
  /// of transformers' config class, which is BERT's for both (512 positions, 2 token types, eps 1e-12), not
  /// roberta-base's published values (this struct's defaults).
  static RobertaConfig from_json(const nlohmann::json& json) {
    constexpr std::string_view family = "roberta";
    RobertaConfig c;
    detail::read_field(json, family, "model_type", c.model_type);
    c.max_position_embeddings = 512, c.type_vocab_size = 2, c.layer_norm_eps = 1e-12;
    if (c.model_type == "bert") {  // BertConfig's own defaults where they differ from RobertaConfig's
      c.vocab_size = 30522, c.pad_token_id = 0;
      c.bos_token_id.reset(), c.eos_token_id.reset();
    }
    detail::read_field(json, family, "vocab_size", c.vocab_size);
    detail::read_field(json, family, "hidden_size", c.hidden_size);
    detail::read_field(json, family, "num_hidden_layers", c.num_hidden_layers);
    detail::read_field(json, family, "num_attention_heads", c.num_attention_heads);
    detail::read_field(json, family, "intermediate_size", c.intermediate_size);
    detail::read_field(json, family, "hidden_act", c.hidden_act);
    detail::read_field(json, family, "hidden_dropout_prob", c.hidden_dropout_prob);
    detail::read_field(json, family, "attention_probs_dropout_prob", c.attention_probs_dropout_prob);
    detail::read_field(json, family, "max_position_embeddings", c.max_position_embeddings);
    detail::read_field(json, family, "type_vocab_size", c.type_vocab_size);
    detail::read_field(json, family, "initializer_range", c.initializer_range);
    detail::read_field(json, family, "layer_norm_eps", c.layer_norm_eps);
    detail::read_field(json, family, "pad_token_id", c.pad_token_id);
    detail::read_token_id(json, family, "bos_token_id", c.bos_token_id);
    detail::read_token_id(json, family, "eos_token_id", c.eos_token_id);
    std::string positions = "absolute";
    detail::read_field(json, family, "position_embedding_type", positions);
    if (positions != "absolute")
      throw SpecError("roberta.position_embedding_type", positions, "only \"absolute\" is supported");
    detail::refuse_unless_off(json, family, "quantization_config", "loading quantized weights");
    c.stated_dtype = detail::read_dtype(json, family);
    c.unread_keys = detail::unread_keys(
        json, {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
               "type_vocab_size", "layer_norm_eps", "position_embedding_type", "tie_word_embeddings",
               "quantization_config", "gradient_checkpointing"});
    c.validate();
    return c;
  }

  /// The `config.json` transformers reads back as a RobertaForMaskedLM (or BertForMaskedLM).
  nlohmann::ordered_json to_json() const {
    nlohmann::ordered_json j;
    j["architectures"] = {model_type == "bert" ? "BertForMaskedLM" : "RobertaForMaskedLM"};
    j["model_type"] = model_type;
    j["vocab_size"] = vocab_size;
    j["hidden_size"] = hidden_size;
    j["num_hidden_layers"] = num_hidden_layers;
    j["num_attention_heads"] = num_attention_heads;
    j["intermediate_size"] = intermediate_size;
    j["hidden_act"] = hidden_act;
    j["hidden_dropout_prob"] = hidden_dropout_prob;
    j["attention_probs_dropout_prob"] = attention_probs_dropout_prob;
    j["max_position_embeddings"] = max_position_embeddings;
    j["type_vocab_size"] = type_vocab_size;
    j["initializer_range"] = initializer_range;
    j["layer_norm_eps"] = layer_norm_eps;
    j["pad_token_id"] = pad_token_id;
    detail::set_optional(j, "bos_token_id", bos_token_id);
    detail::set_optional(j, "eos_token_id", eos_token_id);
    j["position_embedding_type"] = "absolute";
    j["tie_word_embeddings"] = true;
    detail::state_dtype(j, "float32");
    return j;
  }

  /// The Linear layers by name for LoRA's login check: none listed (the worker checks the module's).
  std::vector<std::string> linear_layers() const { return {}; }

  /// What was understood, in one line: the values that shape the math, to compare with the model card.
  std::string summary() const {
    return fmt::format(
        "{}: {} layers, hidden {}, MLP {}, {} heads of dim {}, {} positions (offset {}), {} token types, "
        "layer_norm_eps {:g}, vocabulary {}, dtype {}",
        model_type, num_hidden_layers, hidden_size, intermediate_size, num_attention_heads, head_dim(),
        max_position_embeddings, position_offset(), type_vocab_size, layer_norm_eps, vocab_size,
        stated_dtype.empty() ? "not stated" : stated_dtype);
  }

  /// Parameters, counted from the config (the tied decoder counts once, as the word embedding).
  std::int64_t parameter_count() const {
    const auto d = hidden_size, f = intermediate_size;
    const auto embeddings = (vocab_size + max_position_embeddings + type_vocab_size) * d + 2 * d;
    const auto block = 4 * (d * d + d) + 2 * d + (d * f + f) + (f * d + d) + 2 * d;
    const auto head = (d * d + d) + 2 * d + vocab_size;
    return embeddings + num_hidden_layers * block + head;
  }
};

/// Training FLOPs per token of an encoder over sequences of `seq_len` (forward + backward): 6N over the
/// parameters in matrix products (all but the position and token-type embeddings) plus 12·L·d·T for the
/// attention scores and their weighted sum — the same count as flops_per_token of a decoder, every token
/// seeing all T (not T/2: the attention is bidirectional, but the kernels compute the full square either way).
inline double flops_per_token(const RobertaConfig& config, std::int64_t seq_len) {
  const double n = static_cast<double>(config.parameter_count() -
                                       (config.max_position_embeddings + config.type_vocab_size) * config.hidden_size);
  return 6.0 * n + 12.0 * static_cast<double>(config.num_hidden_layers * config.hidden_size * seq_len);
}

}  // namespace hpctrain::models
