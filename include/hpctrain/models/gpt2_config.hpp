#pragma once
// The GPT-2 family's configuration (torch-free): the fields of transformers' GPT2Config with its
// defaults (GPT-2 124M), read from and written to `config.json`, validated, and the training FLOPs
// per token used for MFU.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/error.hpp>
#include <hpctrain/models/hf/config_json.hpp>

namespace hpctrain::models {

/// GPT-2 (Radford et al. 2019): learned positions, pre-LayerNorm blocks, GELU (tanh) MLP, tied embeddings.
/// Field names are transformers' GPT2Config's; every default is GPT-2 124M's.
struct GPT2Config {
  std::int64_t vocab_size = 50257;      ///< Default: 50257
  std::int64_t n_positions = 1024;      ///< longest sequence (learned positions). Default: 1024
  std::int64_t n_embd = 768;            ///< width. Default: 768
  std::int64_t n_layer = 12;            ///< Default: 12
  std::int64_t n_head = 12;             ///< must divide n_embd. Default: 12
  std::optional<std::int64_t> n_inner;  ///< MLP width. Default: none, meaning 4 * n_embd
  std::string activation_function =
      "gelu_new";                    ///< "gelu_new" / "gelu_pytorch_tanh" (tanh) or "gelu". Default: "gelu_new"
  double resid_pdrop = 0.1;          ///< Default: 0.1
  double embd_pdrop = 0.1;           ///< Default: 0.1
  double attn_pdrop = 0.1;           ///< Default: 0.1
  double layer_norm_epsilon = 1e-5;  ///< Default: 1e-5
  double initializer_range = 0.02;   ///< std of the normal init. Default: 0.02
  bool tie_word_embeddings = true;   ///< the head reuses the token embedding. Default: true
  std::optional<std::int64_t> bos_token_id = 50256;  ///< Default: 50256
  std::optional<std::int64_t> eos_token_id = 50256;  ///< Default: 50256
  /// The weights' dtype the config.json stated (`dtype` or `torch_dtype`). Default: "" (not stated)
  std::string stated_dtype;
  /// Keys of the config.json this was read from that hpctrain does not know (reported in one warning line).
  std::vector<std::string> unread_keys;

  /// The MLP's hidden width.
  std::int64_t inner() const { return n_inner.value_or(4 * n_embd); }
  std::int64_t head_dim() const { return n_embd / n_head; }
  /// Whether the MLP uses the tanh approximation of GELU.
  bool gelu_tanh() const { return activation_function != "gelu"; }

  /// Throws SpecError `[hpctrain.spec.gpt2.<field>]` naming the first invalid field.
  void validate() const {
    using hpctrain::detail::require;
    require(vocab_size >= 1, "gpt2.vocab_size", vocab_size, "must be at least 1");
    require(n_positions >= 1, "gpt2.n_positions", n_positions, "must be at least 1");
    require(n_embd >= 1, "gpt2.n_embd", n_embd, "must be at least 1");
    require(n_layer >= 1, "gpt2.n_layer", n_layer, "must be at least 1");
    require(n_head >= 1, "gpt2.n_head", n_head, "must be at least 1");
    require(n_embd % n_head == 0, "gpt2.n_head", n_head, fmt::format("must divide n_embd = {}", n_embd));
    require(inner() >= 1, "gpt2.n_inner", inner(), "must be at least 1");
    require(activation_function == "gelu_new" || activation_function == "gelu_pytorch_tanh" ||
                activation_function == "gelu",
            "gpt2.activation_function", activation_function, "must be \"gelu_new\", \"gelu_pytorch_tanh\" or \"gelu\"");
    for (auto [name, p] : {std::pair{"gpt2.resid_pdrop", resid_pdrop}, std::pair{"gpt2.embd_pdrop", embd_pdrop},
                           std::pair{"gpt2.attn_pdrop", attn_pdrop}})
      require(p >= 0.0 && p < 1.0, name, p, "must be in [0, 1)");
    require(layer_norm_epsilon > 0.0, "gpt2.layer_norm_epsilon", layer_norm_epsilon, "must be positive");
    require(initializer_range > 0.0, "gpt2.initializer_range", initializer_range, "must be positive");
  }

  /// Reads a transformers `config.json` object; absent fields keep GPT2Config's defaults. Options GPT-2
  /// checkpoints leave at their defaults and hpctrain does not implement are refused, naming the field.
  static GPT2Config from_json(const nlohmann::json& json) {
    constexpr std::string_view family = "gpt2";
    detail::check_model_type(json, family, "gpt2");
    GPT2Config c;
    detail::read_field(json, family, "vocab_size", c.vocab_size);
    detail::read_field(json, family, "n_positions", c.n_positions);
    detail::read_field(json, family, "n_embd", c.n_embd);
    detail::read_field(json, family, "n_layer", c.n_layer);
    detail::read_field(json, family, "n_head", c.n_head);
    detail::read_optional_field(json, family, "n_inner", c.n_inner);
    detail::read_field(json, family, "activation_function", c.activation_function);
    detail::read_field(json, family, "resid_pdrop", c.resid_pdrop);
    detail::read_field(json, family, "embd_pdrop", c.embd_pdrop);
    detail::read_field(json, family, "attn_pdrop", c.attn_pdrop);
    detail::read_field(json, family, "layer_norm_epsilon", c.layer_norm_epsilon);
    detail::read_field(json, family, "initializer_range", c.initializer_range);
    detail::read_field(json, family, "tie_word_embeddings", c.tie_word_embeddings);
    detail::read_token_id(json, family, "bos_token_id", c.bos_token_id);
    detail::read_token_id(json, family, "eos_token_id", c.eos_token_id);
    for (const char* unsupported :
         {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"}) {
      bool on = false;
      detail::read_field(json, family, unsupported, on);
      if (on) throw SpecError(detail::field_id(family, unsupported), "true", "is not supported by hpctrain's GPT-2");
    }
    bool scale = true;
    detail::read_field(json, family, "scale_attn_weights", scale);
    if (!scale) throw SpecError("gpt2.scale_attn_weights", "false", "is not supported by hpctrain's GPT-2");
    detail::refuse_unless_off(json, family, "quantization_config", "loading quantized weights");
    c.stated_dtype = detail::read_dtype(json, family);
    // n_ctx: 4.x wrote it beside n_positions (5.x no longer does); summary_*: the sequence-classification head's.
    c.unread_keys = detail::unread_keys(json, {"vocab_size",
                                               "n_positions",
                                               "n_ctx",
                                               "n_embd",
                                               "n_layer",
                                               "n_head",
                                               "n_inner",
                                               "activation_function",
                                               "resid_pdrop",
                                               "embd_pdrop",
                                               "attn_pdrop",
                                               "layer_norm_epsilon",
                                               "tie_word_embeddings",
                                               "scale_attn_by_inverse_layer_idx",
                                               "reorder_and_upcast_attn",
                                               "scale_attn_weights",
                                               "quantization_config",
                                               "summary_type",
                                               "summary_use_proj",
                                               "summary_activation",
                                               "summary_proj_to_labels",
                                               "summary_first_dropout"});
    c.validate();
    return c;
  }

  /// The `config.json` transformers reads back as a GPT2LMHeadModel.
  nlohmann::ordered_json to_json() const {
    nlohmann::ordered_json j;
    j["architectures"] = {"GPT2LMHeadModel"};
    j["model_type"] = "gpt2";
    j["vocab_size"] = vocab_size;
    j["n_positions"] = n_positions;
    j["n_ctx"] = n_positions;
    j["n_embd"] = n_embd;
    j["n_layer"] = n_layer;
    j["n_head"] = n_head;
    detail::set_optional(j, "n_inner", n_inner);
    j["activation_function"] = activation_function;
    j["resid_pdrop"] = resid_pdrop;
    j["embd_pdrop"] = embd_pdrop;
    j["attn_pdrop"] = attn_pdrop;
    j["layer_norm_epsilon"] = layer_norm_epsilon;
    j["initializer_range"] = initializer_range;
    j["scale_attn_weights"] = true;
    j["tie_word_embeddings"] = tie_word_embeddings;
    detail::set_optional(j, "bos_token_id", bos_token_id);
    detail::set_optional(j, "eos_token_id", eos_token_id);
    detail::state_dtype(j, "float32");
    return j;
  }

  /// The Linear layers of the module by name (what LoRA targets name); lm_head only when untied.
  std::vector<std::string> linear_layers() const {
    std::vector<std::string> names{"c_attn", "c_proj", "c_fc"};
    if (!tie_word_embeddings) names.emplace_back("lm_head");
    return names;
  }

  /// What was understood, in one line: the values that shape the math, to compare with the model card.
  std::string summary() const {
    return fmt::format(
        "gpt2: {} layers, width {}, MLP {}, {} heads of dim {}, {} positions, {}, layer_norm_epsilon {:g}, "
        "{} head, vocabulary {}, dtype {}",
        n_layer, n_embd, inner(), n_head, head_dim(), n_positions, activation_function, layer_norm_epsilon,
        tie_word_embeddings ? "tied" : "untied", vocab_size, stated_dtype.empty() ? "not stated" : stated_dtype);
  }

  /// Parameters, counted from the config (equals the module's parameter count).
  std::int64_t parameter_count() const {
    const auto d = n_embd, f = inner();
    const auto per_block = 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * f + f) + (f * d + d);
    return vocab_size * d + n_positions * d + n_layer * per_block + 2 * d + (tie_word_embeddings ? 0 : vocab_size * d);
  }
};

/// Training FLOPs per token (forward + backward) for a sequence of `seq_len`, as PaLM (appendix B) and
/// nanoGPT count them: 6N + 12·L·d·T, where N is every parameter that takes part in a matrix product
/// (all but the position embedding; the tied token embedding counts once, as the head) and the second
/// term is the attention scores and their weighted sum (L layers, width d, T = seq_len).
inline double flops_per_token(const GPT2Config& config, std::int64_t seq_len) {
  const double n = static_cast<double>(config.parameter_count() - config.n_positions * config.n_embd);
  return 6.0 * n + 12.0 * static_cast<double>(config.n_layer * config.n_embd * seq_len);
}

}  // namespace hpctrain::models
