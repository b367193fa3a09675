#pragma once
// The Llama family's configuration (torch-free): the fields of transformers' LlamaConfig with its
// defaults, the Llama 3 rope scaling, read from and written to `config.json`, validated, and the training
// FLOPs per token used for MFU.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include <hpctrain/error.hpp>
#include <hpctrain/models/config_json.hpp>

namespace hpctrain::models {

/// `rope_scaling` of a Llama config: "llama3" (Llama 3.1's frequency-dependent scaling) or "linear".
struct RopeScaling {
  std::string rope_type = "llama3";                      ///< "llama3" or "linear". Default: "llama3"
  double factor = 8.0;                                   ///< Default: 8 (Llama 3.1)
  double low_freq_factor = 1.0;                          ///< llama3 only. Default: 1
  double high_freq_factor = 4.0;                         ///< llama3 only. Default: 4
  std::int64_t original_max_position_embeddings = 8192;  ///< llama3 only. Default: 8192
};

/// The `model_type`s this config reads: Llama itself and the families that differ from it in small, checked
/// ways — Qwen2 (biases on q, k and v but not o; its own rope theta; an optional sliding window) and Mistral
/// (Llama-shaped, with a sliding window).
inline constexpr std::string_view llama_family_types[] = {"llama", "qwen2", "mistral"};

/// Llama (Touvron et al. 2023; Llama 3, Dubey et al. 2024): RMSNorm, rotary positions, SwiGLU MLP,
/// grouped-query attention. Field names and defaults are transformers' LlamaConfig's.
struct LlamaConfig {
  std::string model_type = "llama";         ///< llama, qwen2 or mistral. Default: "llama"
  std::int64_t vocab_size = 32000;          ///< Default: 32000
  std::int64_t hidden_size = 4096;          ///< Default: 4096
  std::int64_t intermediate_size = 11008;   ///< SwiGLU width. Default: 11008
  std::int64_t num_hidden_layers = 32;      ///< Default: 32
  std::int64_t num_attention_heads = 32;    ///< Default: 32
  std::optional<std::int64_t> num_key_value_heads;  ///< must divide the heads. Default: none, meaning num_attention_heads
  std::optional<std::int64_t> head_dim;     ///< Default: none, meaning hidden_size / num_attention_heads
  std::int64_t max_position_embeddings = 2048;  ///< Default: 2048
  double rms_norm_eps = 1e-6;               ///< Default: 1e-6
  double rope_theta = 10000.0;              ///< Default: 10000 (Llama 3: 500000)
  std::optional<RopeScaling> rope_scaling;  ///< Default: none
  bool attention_bias = false;              ///< biases on q, k, v, o. Default: false
  bool qkv_bias = false;                    ///< biases on q, k, v only (Qwen2). Default: false
  /// Attention sees at most this many previous tokens (Mistral; Qwen2 with use_sliding_window). hpctrain does
  /// not implement the window: a sequence longer than it is refused rather than computed differently.
  std::optional<std::int64_t> sliding_window;
  bool mlp_bias = false;                    ///< biases on the MLP. Default: false
  double attention_dropout = 0.0;           ///< Default: 0
  double initializer_range = 0.02;          ///< Default: 0.02
  bool tie_word_embeddings = false;         ///< Default: false
  std::string hidden_act = "silu";          ///< only "silu". Default: "silu"
  std::optional<std::int64_t> bos_token_id = 1;  ///< Default: 1
  std::optional<std::int64_t> eos_token_id = 2;  ///< Default: 2

  std::int64_t kv_heads() const { return num_key_value_heads.value_or(num_attention_heads); }
  std::int64_t head_dimension() const { return head_dim.value_or(hidden_size / num_attention_heads); }

  /// Throws SpecError `[hpctrain.spec.llama.<field>]` naming the first invalid field.
  void validate() const {
    using hpctrain::detail::require;
    require(vocab_size >= 1, "llama.vocab_size", vocab_size, "must be at least 1");
    require(hidden_size >= 1, "llama.hidden_size", hidden_size, "must be at least 1");
    require(intermediate_size >= 1, "llama.intermediate_size", intermediate_size, "must be at least 1");
    require(num_hidden_layers >= 1, "llama.num_hidden_layers", num_hidden_layers, "must be at least 1");
    require(num_attention_heads >= 1, "llama.num_attention_heads", num_attention_heads, "must be at least 1");
    if (!head_dim)
      require(hidden_size % num_attention_heads == 0, "llama.num_attention_heads", num_attention_heads,
              fmt::format("must divide hidden_size = {} (or give head_dim)", hidden_size));
    require(head_dimension() >= 2 && head_dimension() % 2 == 0, "llama.head_dim", head_dimension(),
            "must be even (rotary embeddings turn pairs of dimensions)");
    require(kv_heads() >= 1, "llama.num_key_value_heads", kv_heads(), "must be at least 1");
    require(num_attention_heads % kv_heads() == 0, "llama.num_key_value_heads", kv_heads(),
            fmt::format("must divide num_attention_heads = {}", num_attention_heads));
    require(max_position_embeddings >= 1, "llama.max_position_embeddings", max_position_embeddings, "must be at least 1");
    require(rms_norm_eps > 0.0, "llama.rms_norm_eps", rms_norm_eps, "must be positive");
    require(rope_theta > 0.0, "llama.rope_theta", rope_theta, "must be positive");
    require(attention_dropout >= 0.0 && attention_dropout < 1.0, "llama.attention_dropout", attention_dropout, "must be in [0, 1)");
    require(initializer_range > 0.0, "llama.initializer_range", initializer_range, "must be positive");
    require(hidden_act == "silu", "llama.hidden_act", hidden_act, "must be \"silu\" (SwiGLU)");
    if (rope_scaling) {
      const auto& s = *rope_scaling;
      require(s.rope_type == "llama3" || s.rope_type == "linear", "llama.rope_scaling.rope_type", s.rope_type,
              "must be \"llama3\" or \"linear\"");
      require(s.factor >= 1.0, "llama.rope_scaling.factor", s.factor, "must be at least 1");
      if (s.rope_type == "llama3") {
        require(s.low_freq_factor > 0.0, "llama.rope_scaling.low_freq_factor", s.low_freq_factor, "must be positive");
        require(s.high_freq_factor > s.low_freq_factor, "llama.rope_scaling.high_freq_factor", s.high_freq_factor,
                fmt::format("must exceed low_freq_factor = {}", s.low_freq_factor));
        require(s.original_max_position_embeddings >= 1, "llama.rope_scaling.original_max_position_embeddings",
                s.original_max_position_embeddings, "must be at least 1");
      }
    }
  }

  /// Reads a transformers `config.json` object; absent fields keep LlamaConfig's defaults.
  static LlamaConfig from_json(const nlohmann::json& json) {
    constexpr std::string_view family = "llama";
    LlamaConfig c;
    if (const auto type = json.find("model_type"); type != json.end()) {
      const bool known = type->is_string() && std::find(std::begin(llama_family_types), std::end(llama_family_types),
                                                        type->get<std::string>()) != std::end(llama_family_types);
      if (!known) throw SpecError(detail::field_id(family, "model_type"), type->dump(), "this is not a llama, qwen2 or mistral config");
      c.model_type = type->get<std::string>();
    }
    c.qkv_bias = c.model_type == "qwen2";
    if (c.model_type == "qwen2") {
      bool use_sliding_window = false;
      detail::read_field(json, family, "use_sliding_window", use_sliding_window);
      if (use_sliding_window) detail::read_optional_field(json, family, "sliding_window", c.sliding_window);
    } else if (c.model_type == "mistral") {
      detail::read_optional_field(json, family, "sliding_window", c.sliding_window);
    }
    detail::read_field(json, family, "vocab_size", c.vocab_size);
    detail::read_field(json, family, "hidden_size", c.hidden_size);
    detail::read_field(json, family, "intermediate_size", c.intermediate_size);
    detail::read_field(json, family, "num_hidden_layers", c.num_hidden_layers);
    detail::read_field(json, family, "num_attention_heads", c.num_attention_heads);
    detail::read_optional_field(json, family, "num_key_value_heads", c.num_key_value_heads);
    detail::read_optional_field(json, family, "head_dim", c.head_dim);
    detail::read_field(json, family, "max_position_embeddings", c.max_position_embeddings);
    detail::read_field(json, family, "rms_norm_eps", c.rms_norm_eps);
    detail::read_field(json, family, "rope_theta", c.rope_theta);
    detail::read_field(json, family, "attention_bias", c.attention_bias);
    detail::read_field(json, family, "mlp_bias", c.mlp_bias);
    detail::read_field(json, family, "attention_dropout", c.attention_dropout);
    detail::read_field(json, family, "initializer_range", c.initializer_range);
    detail::read_field(json, family, "tie_word_embeddings", c.tie_word_embeddings);
    detail::read_field(json, family, "hidden_act", c.hidden_act);
    detail::read_token_id(json, family, "bos_token_id", c.bos_token_id);
    detail::read_token_id(json, family, "eos_token_id", c.eos_token_id);
    std::int64_t pretraining_tp = 1;
    detail::read_field(json, family, "pretraining_tp", pretraining_tp);
    if (pretraining_tp != 1) throw SpecError("llama.pretraining_tp", std::to_string(pretraining_tp), "only 1 is supported");
    const auto scaling = json.find("rope_scaling");
    if (scaling != json.end() && !scaling->is_null()) {
      auto read = read_rope_scaling(*scaling);
      if (read.rope_type != "default") c.rope_scaling = read;  // "default" is transformers' "no scaling"
    }
    c.validate();
    return c;
  }

  /// The `config.json` transformers reads back as a LlamaForCausalLM.
  nlohmann::ordered_json to_json() const {
    nlohmann::ordered_json j;
    j["architectures"] = {model_type == "qwen2" ? "Qwen2ForCausalLM" : model_type == "mistral" ? "MistralForCausalLM" : "LlamaForCausalLM"};
    j["model_type"] = model_type;
    j["vocab_size"] = vocab_size;
    j["hidden_size"] = hidden_size;
    j["intermediate_size"] = intermediate_size;
    j["num_hidden_layers"] = num_hidden_layers;
    j["num_attention_heads"] = num_attention_heads;
    j["num_key_value_heads"] = kv_heads();
    j["head_dim"] = head_dimension();
    j["max_position_embeddings"] = max_position_embeddings;
    j["rms_norm_eps"] = rms_norm_eps;
    j["rope_theta"] = rope_theta;
    if (rope_scaling) {
      const auto& s = *rope_scaling;
      nlohmann::ordered_json r;
      r["rope_type"] = s.rope_type;
      r["factor"] = s.factor;
      if (s.rope_type == "llama3") {
        r["low_freq_factor"] = s.low_freq_factor;
        r["high_freq_factor"] = s.high_freq_factor;
        r["original_max_position_embeddings"] = s.original_max_position_embeddings;
      }
      j["rope_scaling"] = r;
    } else {
      j["rope_scaling"] = nullptr;
    }
    if (model_type == "llama") {
      j["attention_bias"] = attention_bias;
      j["mlp_bias"] = mlp_bias;
    } else if (model_type == "qwen2") {
      j["use_sliding_window"] = sliding_window.has_value();
      j["sliding_window"] = sliding_window ? nlohmann::ordered_json(*sliding_window) : nlohmann::ordered_json(nullptr);
      j["max_window_layers"] = num_hidden_layers;
    } else {
      j["sliding_window"] = sliding_window ? nlohmann::ordered_json(*sliding_window) : nlohmann::ordered_json(nullptr);
    }
    j["attention_dropout"] = attention_dropout;
    j["initializer_range"] = initializer_range;
    j["tie_word_embeddings"] = tie_word_embeddings;
    j["hidden_act"] = hidden_act;
    j["pretraining_tp"] = 1;
    detail::set_optional(j, "bos_token_id", bos_token_id);
    detail::set_optional(j, "eos_token_id", eos_token_id);
    j["torch_dtype"] = "float32";
    return j;
  }

  /// Parameters, counted from the config (equals the module's parameter count).
  std::int64_t parameter_count() const {
    const auto d = hidden_size, hd = head_dimension(), q = num_attention_heads * hd, kv = kv_heads() * hd, f = intermediate_size;
    const auto attention = d * q + 2 * d * kv + q * d + (attention_bias ? q + 2 * kv + d : qkv_bias ? q + 2 * kv : 0);
    const auto mlp = 3 * d * f + (mlp_bias ? 2 * f + d : 0);
    const auto per_block = attention + mlp + 2 * d;
    return vocab_size * d + num_hidden_layers * per_block + d + (tie_word_embeddings ? 0 : vocab_size * d);
  }

 private:
  static RopeScaling read_rope_scaling(const nlohmann::json& json) {
    constexpr std::string_view family = "llama.rope_scaling";
    if (!json.is_object()) throw SpecError("llama.rope_scaling", json.dump(), "must be an object or null");
    RopeScaling s;
    // transformers accepts the older key "type" for "rope_type".
    if (json.contains("type") && !json.contains("rope_type")) {
      detail::read_field(json, family, "type", s.rope_type);
    } else {
      detail::read_field(json, family, "rope_type", s.rope_type);
    }
    detail::read_field(json, family, "factor", s.factor);
    detail::read_field(json, family, "low_freq_factor", s.low_freq_factor);
    detail::read_field(json, family, "high_freq_factor", s.high_freq_factor);
    detail::read_field(json, family, "original_max_position_embeddings", s.original_max_position_embeddings);
    return s;
  }
};

/// Training FLOPs per token (forward + backward) for a sequence of `seq_len`, as PaLM (appendix B) counts
/// them: 6N + 12·L·H·Q·T, where N is every parameter that takes part in a matrix product (all but the
/// token embedding when the head is untied; a tied one counts once, as the head), L layers, H heads of
/// dimension Q, T = seq_len.
inline double flops_per_token(const LlamaConfig& config, std::int64_t seq_len) {
  const auto embedding = config.tie_word_embeddings ? 0 : config.vocab_size * config.hidden_size;
  const double n = static_cast<double>(config.parameter_count() - embedding);
  return 6.0 * n + 12.0 * static_cast<double>(config.num_hidden_layers * config.num_attention_heads *
                                              config.head_dimension() * seq_len);
}

}  // namespace hpctrain::models
