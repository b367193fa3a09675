#pragma once
// The Llama family's configuration (torch-free): the fields of transformers' LlamaConfig with its
// defaults, the Llama 3 rope scaling, read from and written to `config.json` in transformers 4's layout
// (top-level `rope_theta`, `rope_scaling`) and 5's (`rope_parameters`), validated, and the training FLOPs per
// token used for MFU. A field that changes the math and is not implemented here is refused, never defaulted.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/error.hpp>
#include <hpctrain/models/hf/config_json.hpp>

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
/// ways — Qwen2 (biases on q, k and v but not o; its own rope theta; an optional sliding window), Qwen3 (no
/// biases; an RMSNorm over each query and key head; a head dimension of its own), Mistral (Llama-shaped,
/// with a sliding window), Phi-3 (q, k and v in one `qkv_proj`, gate and up in one `gate_up_proj`) and Gemma
/// (RMSNorms that scale by 1 + weight, embeddings scaled by √hidden_size, a tanh-GELU GLU; Gemma 2 adds norms after
/// attention and the MLP, soft-capped attention and final logits, sliding layers alternating with global ones and a
/// query scale of its own; Gemma 3 text adds Qwen3's query and key norms and a rope base of their own for the
/// sliding layers).
inline constexpr std::string_view llama_family_types[] = {"llama", "qwen2", "qwen3",  "mistral",
                                                          "phi3",  "gemma", "gemma2", "gemma3_text"};

/// Whether `model_type` is one of Gemma's (gemma, gemma2, gemma3_text).
inline bool is_gemma(std::string_view model_type) { return model_type.starts_with("gemma"); }

/// Whether a config.json's `model_type` is one of the Llama family's (llama_family_types): the one list.
inline bool is_llama_family(std::string_view model_type) {
  return std::find(std::begin(llama_family_types), std::end(llama_family_types), model_type) !=
         std::end(llama_family_types);
}

/// The family's model_types quoted and listed for an error ("\"llama\", \"qwen2\", ..."), from the one list.
inline std::string quoted_llama_family_types() {
  std::string out;
  for (const auto type : llama_family_types) out += fmt::format("{}\"{}\"", out.empty() ? "" : ", ", type);
  return out;
}

/// Llama (Touvron et al. 2023; Llama 3, Dubey et al. 2024): RMSNorm, rotary positions, SwiGLU MLP,
/// grouped-query attention. Field names and defaults are transformers' LlamaConfig's.
struct LlamaConfig {
  std::string model_type = "llama";        ///< one of llama_family_types. Default: "llama"
  std::int64_t vocab_size = 32000;         ///< Default: 32000
  std::int64_t hidden_size = 4096;         ///< Default: 4096
  std::int64_t intermediate_size = 11008;  ///< SwiGLU width. Default: 11008
  std::int64_t num_hidden_layers = 32;     ///< Default: 32
  std::int64_t num_attention_heads = 32;   ///< Default: 32
  std::optional<std::int64_t>
      num_key_value_heads;                      ///< must divide the heads. Default: none, meaning num_attention_heads
  std::optional<std::int64_t> head_dim;         ///< Default: none, meaning hidden_size / num_attention_heads
  std::int64_t max_position_embeddings = 2048;  ///< Default: 2048
  double rms_norm_eps = 1e-6;                   ///< Default: 1e-6
  double rope_theta = 10000.0;                  ///< Default: 10000 (Llama 3: 500000)
  std::optional<RopeScaling> rope_scaling;      ///< Default: none
  bool attention_bias = false;                  ///< biases on q, k, v, o. Default: false
  bool qkv_bias = false;                        ///< biases on q, k, v only (Qwen2). Default: false
  /// An RMSNorm over each query and key head (weights of head_dim), before the rotary turn (Qwen3's
  /// q_norm and k_norm; model_type "qwen3" has them, the others not). Default: false
  bool qk_norm = false;
  /// q, k and v as one Linear `qkv_proj` (outputs [q | k | v]) and gate and up as one `gate_up_proj` ([gate | up]):
  /// Phi-3's modules, so its checkpoints, LoRA targets and PEFT adapters keep their names (model_type "phi3" has
  /// them, the others not). The same products as separate Linears, in other tensors. Default: false
  bool stacked_projections = false;
  /// A query attends to itself and the sliding_window - 1 tokens before it, on the layers that slide (Mistral, Phi-3:
  /// every layer; Qwen2, Qwen3 with use_sliding_window: those layer_types says). Default: none (full attention)
  std::optional<std::int64_t> sliding_window;
  /// Each layer's attention, "full_attention" or "sliding_attention", as transformers lists them (Qwen2, Qwen3: from
  /// `layer_types`, else the layers from `max_window_layers` on slide). Empty: every layer slides when there is a
  /// sliding_window. Default: empty
  std::vector<std::string> layer_types;
  bool mlp_bias = false;  ///< biases on the MLP. Default: false
  /// Every RMSNorm scales by 1 + weight (its weights start at 0), in fp32 before the cast back (Gemma's). Default:
  /// false
  bool unit_offset_norms = false;
  /// The token embeddings multiplied by √hidden_size (rounded to their dtype first, as transformers does: Gemma's).
  /// Default: false
  bool scaled_embeddings = false;
  /// A norm after attention and after the MLP, before each joins the stream, and the MLP's own norm before it
  /// (`pre_feedforward_layernorm`; `post_attention_layernorm` then normalises attention's output): Gemma 2's and
  /// 3's. Default: false
  bool sandwich_norms = false;
  /// Attention scores scaled by query_pre_attn_scalar^-1/2 instead of head_dim^-1/2 (Gemma 2, 3). Default: none
  std::optional<double> query_pre_attn_scalar;
  /// Attention scores soft-capped to ±cap (cap·tanh(s / cap)) before the mask and softmax, computed in plain
  /// products (Gemma 2; transformers' SDPA path skips it, its eager, flash and flex paths apply it). Default: none
  std::optional<double> attn_logit_softcapping;
  /// The logits soft-capped to ±cap (Gemma 2, and Gemma 3 when set). Default: none
  std::optional<double> final_logit_softcapping;
  /// The rotary base of the sliding layers, which take no rope scaling (Gemma 3's rope_local_base_freq; the
  /// global layers keep rope_theta and rope_scaling). Default: none (every layer the same)
  std::optional<double> local_rope_theta;
  double attention_dropout = 0.0;    ///< Default: 0
  double initializer_range = 0.02;   ///< Default: 0.02
  bool tie_word_embeddings = false;  ///< Default: false
  /// The MLP's gate activation: "silu" (SwiGLU), "gelu_pytorch_tanh" (GeGLU with tanh-approximated GELU, Gemma's;
  /// Gemma 2's and 3's `hidden_activation`) or "gelu" (GeGLU with the exact GELU). Default: "silu"
  std::string hidden_act = "silu";
  std::optional<std::int64_t> bos_token_id = 1;  ///< Default: 1
  std::optional<std::int64_t> eos_token_id = 2;  ///< Default: 2
  /// The embedding's padding_idx, as transformers' models build it: that row gets no gradient from the lookup.
  /// Default: none
  std::optional<std::int64_t> pad_token_id;
  /// The weights' dtype the config.json stated (`dtype` or `torch_dtype`); informative, the safetensors' own
  /// dtypes are what is read. Default: "" (not stated)
  std::string stated_dtype;
  /// Keys of the config.json this was read from that hpctrain does not know (reported in one warning line).
  std::vector<std::string> unread_keys;

  std::int64_t kv_heads() const { return num_key_value_heads.value_or(num_attention_heads); }
  std::int64_t head_dimension() const { return head_dim.value_or(hidden_size / num_attention_heads); }
  /// The attention scores' scale: query_pre_attn_scalar^-1/2 when given, else head_dim^-1/2 (SDPA's default).
  std::optional<double> attention_scale() const {
    if (!query_pre_attn_scalar) return std::nullopt;
    return 1.0 / std::sqrt(*query_pre_attn_scalar);
  }
  /// Whether layer `layer` turns its queries and keys with local_rope_theta (a sliding layer of Gemma 3's).
  bool local_rotary(std::int64_t layer) const {
    return local_rope_theta && !layer_types.empty() && layer_types.at(layer) == "sliding_attention";
  }
  /// The window layer `layer` attends within, or none for full attention.
  std::optional<std::int64_t> window_of(std::int64_t layer) const {
    if (!sliding_window || (!layer_types.empty() && layer_types.at(layer) != "sliding_attention")) return std::nullopt;
    return sliding_window;
  }

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
    require(max_position_embeddings >= 1, "llama.max_position_embeddings", max_position_embeddings,
            "must be at least 1");
    if (sliding_window) require(*sliding_window >= 1, "llama.sliding_window", *sliding_window, "must be at least 1");
    require(layer_types.empty() || static_cast<std::int64_t>(layer_types.size()) == num_hidden_layers,
            "llama.layer_types", fmt::format("{} entries", layer_types.size()),
            fmt::format("must list num_hidden_layers = {} layers", num_hidden_layers));
    for (const auto& type : layer_types)
      require(type == "full_attention" || type == "sliding_attention", "llama.layer_types", type,
              "must be full_attention or sliding_attention");
    require(rms_norm_eps > 0.0, "llama.rms_norm_eps", rms_norm_eps, "must be positive");
    require(rope_theta > 0.0, "llama.rope_theta", rope_theta, "must be positive");
    require(attention_dropout >= 0.0 && attention_dropout < 1.0, "llama.attention_dropout", attention_dropout,
            "must be in [0, 1)");
    if (pad_token_id)  // negative counts from the end, as nn.Embedding's padding_idx does
      require(*pad_token_id >= -vocab_size && *pad_token_id < vocab_size, "llama.pad_token_id", *pad_token_id,
              fmt::format("must be a token id below vocab_size = {} (or a negative one from its end)", vocab_size));
    require(initializer_range > 0.0, "llama.initializer_range", initializer_range, "must be positive");
    require(hidden_act == "silu" || hidden_act == "gelu_pytorch_tanh" || hidden_act == "gelu", "llama.hidden_act",
            hidden_act, "must be \"silu\" (SwiGLU), \"gelu_pytorch_tanh\" or \"gelu\" (GeGLU)");
    if (query_pre_attn_scalar)
      require(*query_pre_attn_scalar > 0.0, "llama.query_pre_attn_scalar", *query_pre_attn_scalar, "must be positive");
    if (attn_logit_softcapping)
      require(*attn_logit_softcapping > 0.0, "llama.attn_logit_softcapping", *attn_logit_softcapping,
              "must be positive (or null for none)");
    if (final_logit_softcapping)
      require(*final_logit_softcapping > 0.0, "llama.final_logit_softcapping", *final_logit_softcapping,
              "must be positive (or null for none)");
    if (local_rope_theta)
      require(*local_rope_theta > 0.0, "llama.rope_local_base_freq", *local_rope_theta, "must be positive");
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

  /// Reads a transformers `config.json` object, in transformers 4's layout or 5's; absent fields keep
  /// LlamaConfig's defaults (transformers' own). Throws SpecError naming the field for a wrong value, for
  /// two layouts that disagree, and for a setting that changes the math that hpctrain does not implement.
  static LlamaConfig from_json(const nlohmann::json& json) {
    constexpr std::string_view family = "llama";
    LlamaConfig c;
    if (const auto type = json.find("model_type"); type != json.end()) {
      const bool known = type->is_string() && is_llama_family(type->get<std::string>());
      if (!known)
        throw SpecError(detail::field_id(family, "model_type"), type->dump(),
                        fmt::format("this is not a config of the Llama family ({})", quoted_llama_family_types()));
      c.model_type = type->get<std::string>();
    }
    c.qkv_bias = c.model_type == "qwen2";
    c.qk_norm = c.model_type == "qwen3" || c.model_type == "gemma3_text";
    c.stacked_projections = c.model_type == "phi3";
    if (is_gemma(c.model_type)) read_gemma(json, c);
    std::int64_t max_window_layers = 28;  // Qwen2Config's and Qwen3Config's default
    if (c.model_type == "qwen2" || c.model_type == "qwen3") {
      bool use_sliding_window = false;
      detail::read_field(json, family, "use_sliding_window", use_sliding_window);
      if (use_sliding_window) detail::read_optional_field(json, family, "sliding_window", c.sliding_window);
      detail::read_field(json, family, "max_window_layers", max_window_layers);
    } else if (c.model_type == "mistral" || c.model_type == "phi3") {
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
    detail::read_field(json, family, "attention_bias", c.attention_bias);
    detail::read_field(json, family, "mlp_bias", c.mlp_bias);
    detail::read_field(json, family, "attention_dropout", c.attention_dropout);
    detail::read_field(json, family, "initializer_range", c.initializer_range);
    detail::read_field(json, family, "tie_word_embeddings", c.tie_word_embeddings);
    if (c.model_type == "gemma2" || c.model_type == "gemma3_text")  // their MLPs read hidden_activation
      detail::read_field(json, family, "hidden_activation", c.hidden_act);
    else detail::read_field(json, family, "hidden_act", c.hidden_act);
    detail::read_token_id(json, family, "bos_token_id", c.bos_token_id);
    detail::read_token_id(json, family, "eos_token_id", c.eos_token_id);
    detail::read_optional_field(json, family, "pad_token_id", c.pad_token_id);
    c.stated_dtype = detail::read_dtype(json, family);
    std::int64_t pretraining_tp = 1;
    detail::read_field(json, family, "pretraining_tp", pretraining_tp);
    if (pretraining_tp != 1)
      throw SpecError("llama.pretraining_tp", std::to_string(pretraining_tp), "only 1 is supported");
    read_rope(json, c);
    refuse_unimplemented(json, c);
    read_layer_types(json, c, max_window_layers);
    c.unread_keys = detail::unread_keys(
        json, {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta",
               "rope_scaling", "rope_parameters", "partial_rotary_factor", "attention_bias", "mlp_bias",
               "attention_dropout", "tie_word_embeddings", "hidden_act", "pretraining_tp", "use_sliding_window",
               "sliding_window", "max_window_layers", "layer_types", "attn_logit_softcapping",
               "final_logit_softcapping", "quantization_config", "use_qk_norm", "attention_chunk_size", "resid_pdrop",
               // Phi-3's: transformers' Phi3Model never applies it; nor does hpctrain
               "embd_pdrop",
               // Phi-3's: read by longrope only, which is refused
               "original_max_position_embeddings",
               // Gemma's (gemma reads hidden_act, the later ones hidden_activation; Gemma 3 never applies
               // attn_logit_softcapping, in transformers 4.57 or 5.x)
               "hidden_activation", "query_pre_attn_scalar", "rope_local_base_freq", "sliding_window_pattern",
               "use_bidirectional_attention"});
    c.validate();
    return c;
  }

  /// The `config.json` transformers reads back as its model_type's ...ForCausalLM.
  nlohmann::ordered_json to_json() const {
    nlohmann::ordered_json j;
    j["architectures"] = {model_type == "qwen2"         ? "Qwen2ForCausalLM"
                          : model_type == "qwen3"       ? "Qwen3ForCausalLM"
                          : model_type == "mistral"     ? "MistralForCausalLM"
                          : model_type == "phi3"        ? "Phi3ForCausalLM"
                          : model_type == "gemma"       ? "GemmaForCausalLM"
                          : model_type == "gemma2"      ? "Gemma2ForCausalLM"
                          : model_type == "gemma3_text" ? "Gemma3ForCausalLM"
                                                        : "LlamaForCausalLM"};
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
    // Both layouts, as transformers keeps old checkpoints readable: 4.x reads `rope_theta` and `rope_scaling`
    // (and ignores `rope_parameters`), 5.x reads `rope_parameters` (`rope_scaling`, when not null, first).
    j["rope_theta"] = rope_theta;
    j["rope_scaling"] = rope_scaling ? scaling_json(*rope_scaling) : nlohmann::ordered_json(nullptr);
    auto parameters = rope_scaling ? scaling_json(*rope_scaling) : nlohmann::ordered_json({{"rope_type", "default"}});
    parameters["rope_theta"] = rope_theta;
    j["rope_parameters"] = parameters;
    if (is_gemma(model_type)) {
      gemma_json(j);
    } else if (model_type == "llama") {
      j["attention_bias"] = attention_bias;
      j["mlp_bias"] = mlp_bias;
    } else if (model_type == "qwen2" || model_type == "qwen3") {
      if (model_type == "qwen3") j["attention_bias"] = attention_bias;
      j["use_sliding_window"] = sliding_window.has_value();
      j["sliding_window"] = sliding_window ? nlohmann::ordered_json(*sliding_window) : nlohmann::ordered_json(nullptr);
      // Both releases read layer_types when given; max_window_layers (the full layers before the first that slides)
      // is what an older reader goes by.
      auto types = nlohmann::ordered_json::array();
      std::int64_t full_before = num_hidden_layers;
      for (std::int64_t i = num_hidden_layers - 1; i >= 0; --i)
        if (window_of(i)) full_before = i;
      for (std::int64_t i = 0; i < num_hidden_layers; ++i)
        types.push_back(window_of(i) ? "sliding_attention" : "full_attention");
      j["max_window_layers"] = full_before;
      j["layer_types"] = types;
    } else {  // mistral, phi3
      j["sliding_window"] = sliding_window ? nlohmann::ordered_json(*sliding_window) : nlohmann::ordered_json(nullptr);
    }
    if (model_type == "phi3") {  // no dropout on the residual branches or the embedding; no longrope
      j["resid_pdrop"] = 0.0;
      j["embd_pdrop"] = 0.0;
      j["original_max_position_embeddings"] = max_position_embeddings;
    }
    j["attention_dropout"] = attention_dropout;
    j["initializer_range"] = initializer_range;
    j["tie_word_embeddings"] = tie_word_embeddings;
    if (model_type != "gemma2" && model_type != "gemma3_text") j["hidden_act"] = hidden_act;
    j["pretraining_tp"] = 1;
    detail::set_optional(j, "bos_token_id", bos_token_id);
    detail::set_optional(j, "eos_token_id", eos_token_id);
    detail::set_optional(j, "pad_token_id", pad_token_id);  // null when none (Phi3Config's default is 32000)
    detail::state_dtype(j, "float32");
    return j;
  }

  /// The Linear layers of the module by name (what LoRA targets name); lm_head only when untied.
  std::vector<std::string> linear_layers() const {
    std::vector<std::string> names =
        stacked_projections
            ? std::vector<std::string>{"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}
            : std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    if (!tie_word_embeddings) names.emplace_back("lm_head");
    return names;
  }

  /// What was understood, in one line: the values that shape the math, to compare with the model card.
  std::string summary() const {
    std::string rope = fmt::format("rope theta {}", rope_theta);
    if (rope_scaling) {
      const auto& r = *rope_scaling;
      rope += r.rope_type == "llama3"
                  ? fmt::format(" with llama3 scaling (factor {:g}, low/high freq {:g}/{:g}, original length {})",
                                r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_position_embeddings)
                  : fmt::format(" with linear scaling (factor {:g})", r.factor);
    }
    return fmt::format(
        "{}: {} layers, hidden {}, MLP {}, {} heads / {} KV heads of dim {}, {}, rms_norm_eps {:g}, {} head, "
        "vocabulary {}, {} positions{}{}{}{}{}, dtype {}",
        model_type, num_hidden_layers, hidden_size, intermediate_size, num_attention_heads, kv_heads(),
        head_dimension(), rope, rms_norm_eps, tie_word_embeddings ? "tied" : "untied", vocab_size,
        max_position_embeddings,
        sliding_window ? fmt::format(", sliding window {} on {} of {} layers", *sliding_window, sliding_layers(),
                                     num_hidden_layers)
                       : "",
        qkv_bias || attention_bias ? ", attention biases" : "", qk_norm ? ", query and key norms" : "",
        stacked_projections ? ", q/k/v and gate/up stacked (qkv_proj, gate_up_proj)" : "", gemma_summary(),
        stated_dtype.empty() ? "not stated" : stated_dtype);
  }

  /// Gemma's part of summary(): what differs from Llama, with its values.
  std::string gemma_summary() const {
    std::string out;
    if (hidden_act != "silu") out += fmt::format(", {} GLU", hidden_act);
    if (unit_offset_norms) out += ", norms scaling by 1 + weight";
    if (scaled_embeddings) out += ", embeddings scaled by sqrt(hidden)";
    if (sandwich_norms) out += ", norms after attention and MLP";
    if (query_pre_attn_scalar) out += fmt::format(", query scale 1/sqrt({:g})", *query_pre_attn_scalar);
    if (attn_logit_softcapping) out += fmt::format(", attention soft-capped at {:g}", *attn_logit_softcapping);
    if (final_logit_softcapping) out += fmt::format(", logits soft-capped at {:g}", *final_logit_softcapping);
    if (local_rope_theta) out += fmt::format(", rope theta {:g} on the sliding layers", *local_rope_theta);
    return out;
  }

  /// How many layers attend within the sliding window.
  std::int64_t sliding_layers() const {
    std::int64_t n = 0;
    for (std::int64_t i = 0; i < num_hidden_layers; ++i) n += window_of(i).has_value();
    return n;
  }

  /// Parameters, counted from the config (equals the module's parameter count).
  std::int64_t parameter_count() const {
    const auto d = hidden_size, hd = head_dimension(), q = num_attention_heads * hd, kv = kv_heads() * hd,
               f = intermediate_size;
    const auto attention = d * q + 2 * d * kv + q * d + (attention_bias ? q + 2 * kv + d : qkv_bias ? q + 2 * kv : 0);
    const auto mlp = 3 * d * f + (mlp_bias ? 2 * f + d : 0);
    const auto per_block = attention + mlp + (sandwich_norms ? 4 : 2) * d + (qk_norm ? 2 * hd : 0);
    return vocab_size * d + num_hidden_layers * per_block + d + (tie_word_embeddings ? 0 : vocab_size * d);
  }

 private:
  /// Gemma's own fields, in the names its config classes take; Gemma 3's rotary settings per layer type as well
  /// (transformers 5's layout; 4.57 reads rope_theta, rope_scaling and rope_local_base_freq).
  void gemma_json(nlohmann::ordered_json& j) const {
    j["attention_bias"] = attention_bias;
    if (model_type == "gemma") return;
    j["hidden_activation"] = hidden_act;
    // An integer where it is one: transformers 5's strict config takes no float here.
    const double scalar = query_pre_attn_scalar.value_or(static_cast<double>(head_dimension()));
    j["query_pre_attn_scalar"] = scalar == std::floor(scalar)
                                     ? nlohmann::ordered_json(static_cast<std::int64_t>(scalar))
                                     : nlohmann::ordered_json(scalar);
    j["sliding_window"] = sliding_window ? nlohmann::ordered_json(*sliding_window) : nlohmann::ordered_json(nullptr);
    auto types = nlohmann::ordered_json::array();
    for (std::int64_t i = 0; i < num_hidden_layers; ++i)
      types.push_back(!layer_types.empty() ? layer_types[i] : window_of(i) ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
    const auto optional = [](const std::optional<double>& v) {
      return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
    };
    j["final_logit_softcapping"] = optional(final_logit_softcapping);
    if (model_type == "gemma2") {
      j["attn_logit_softcapping"] = optional(attn_logit_softcapping);
      return;
    }
    const double local = local_rope_theta.value_or(rope_theta);
    j["rope_local_base_freq"] = local;
    nlohmann::ordered_json per_type;
    per_type["full_attention"] = j["rope_parameters"];
    per_type["sliding_attention"] = {{"rope_type", "default"}, {"rope_theta", local}};
    j["rope_parameters"] = per_type;
  }

  static nlohmann::ordered_json scaling_json(const RopeScaling& s) {
    nlohmann::ordered_json r;
    r["rope_type"] = s.rope_type;
    r["factor"] = s.factor;
    if (s.rope_type == "llama3") {
      r["low_freq_factor"] = s.low_freq_factor;
      r["high_freq_factor"] = s.high_freq_factor;
      r["original_max_position_embeddings"] = s.original_max_position_embeddings;
    }
    return r;
  }

  /// One layout's rotary settings: its theta when it states one, its scaling (none for "default").
  struct Rotary {
    std::optional<double> theta;
    std::optional<RopeScaling> scaling;
  };

  /// A `rope_scaling` (4.x) or `rope_parameters` (5.x) object; `field` names it in errors.
  static Rotary read_rotary_object(const nlohmann::json& json, const std::string& field, std::int64_t max_positions) {
    if (!json.is_object()) throw SpecError(field, json.dump(), "must be an object or null");
    for (const auto& item : json.items())
      if (item.value().is_object())  // {"full_attention": {...}, "sliding_attention": {...}} (Gemma 3, ...)
        throw SpecError(field, json.dump(), "rotary parameters per layer type are not implemented by hpctrain");
    Rotary rotary;
    RopeScaling s;
    s.original_max_position_embeddings = max_positions;  // transformers 5's default where llama3 omits it
    // transformers accepts the older key "type" for "rope_type"; "default" when neither is given.
    std::string type = "default";
    detail::read_field(json, field, json.contains("rope_type") || !json.contains("type") ? "rope_type" : "type", type);
    if (type != "default" && type != "linear" && type != "llama3")
      throw SpecError(field + ".rope_type", type,
                      "is not implemented by hpctrain (it implements default, linear and llama3)");
    s.rope_type = type;
    detail::read_optional_field(json, field, "rope_theta", rotary.theta);
    double partial = 1.0;
    detail::read_field(json, field, "partial_rotary_factor", partial);
    if (partial != 1.0)
      throw SpecError(field + ".partial_rotary_factor", fmt::format("{:g}", partial),
                      "partial rotary embeddings are not implemented by hpctrain");
    detail::read_field(json, field, "factor", s.factor);
    detail::read_field(json, field, "low_freq_factor", s.low_freq_factor);
    detail::read_field(json, field, "high_freq_factor", s.high_freq_factor);
    detail::read_field(json, field, "original_max_position_embeddings", s.original_max_position_embeddings);
    if (type != "default") rotary.scaling = s;
    return rotary;
  }

  static bool same_scaling(const std::optional<RopeScaling>& a, const std::optional<RopeScaling>& b) {
    if (!a || !b) return !a && !b;
    return a->rope_type == b->rope_type && a->factor == b->factor &&
           (a->rope_type != "llama3" ||
            (a->low_freq_factor == b->low_freq_factor && a->high_freq_factor == b->high_freq_factor &&
             a->original_max_position_embeddings == b->original_max_position_embeddings));
  }

  /// The rotary settings in either layout: transformers 4's top-level `rope_theta` and `rope_scaling`, 5's
  /// `rope_parameters` (theta and type inside). Where both are present they must agree.
  static void read_rope(const nlohmann::json& json, LlamaConfig& c) {
    Rotary legacy;
    detail::read_optional_field(json, "llama", "rope_theta", legacy.theta);
    if (const auto it = json.find("rope_scaling"); it != json.end() && !it->is_null())
      legacy.scaling = read_rotary_object(*it, "llama.rope_scaling", c.max_position_embeddings).scaling;
    double partial = 1.0;
    detail::read_field(json, "llama", "partial_rotary_factor", partial);
    if (partial != 1.0)
      throw SpecError("llama.partial_rotary_factor", fmt::format("{:g}", partial),
                      "partial rotary embeddings are not implemented by hpctrain");
    const auto it = json.find("rope_parameters");
    if (c.model_type == "gemma3_text" && it != json.end() && it->is_object() &&
        (it->contains("full_attention") || it->contains("sliding_attention"))) {
      read_rope_per_layer_type(*it, legacy, json, c);
      return;
    }
    if (it == json.end() || it->is_null()) {
      c.rope_theta = legacy.theta.value_or(c.rope_theta);
      c.rope_scaling = legacy.scaling;
      return;
    }
    const auto current = read_rotary_object(*it, "llama.rope_parameters", c.max_position_embeddings);
    if (current.theta && legacy.theta && *current.theta != *legacy.theta)
      throw SpecError("llama.rope_parameters.rope_theta",
                      fmt::format("{:g} but rope_theta = {:g}", *current.theta, *legacy.theta),
                      "the transformers 5 and 4 layouts of the config disagree");
    if (json.contains("rope_scaling") && !json["rope_scaling"].is_null() &&
        !same_scaling(current.scaling, legacy.scaling))
      throw SpecError("llama.rope_parameters",
                      fmt::format("{} but rope_scaling = {}", it->dump(), json["rope_scaling"].dump()),
                      "the transformers 5 and 4 layouts of the config disagree");
    c.rope_theta = current.theta.value_or(legacy.theta.value_or(c.rope_theta));
    c.rope_scaling = current.scaling;
  }

  /// Gemma's defaults (transformers' GemmaConfig, Gemma2Config, Gemma3TextConfig: a config.json may leave them out)
  /// and the fields only Gemma has. A field given as null means none, whatever its default.
  static void read_gemma(const nlohmann::json& json, LlamaConfig& c) {
    constexpr std::string_view family = "llama";
    const bool gemma2 = c.model_type == "gemma2", gemma3 = c.model_type == "gemma3_text";
    c.unit_offset_norms = c.scaled_embeddings = c.tie_word_embeddings = true;
    c.sandwich_norms = gemma2 || gemma3;
    c.hidden_act = "gelu_pytorch_tanh";
    c.vocab_size = gemma3 ? 262208 : 256000;
    c.hidden_size = gemma2 || gemma3 ? 2304 : 3072;
    c.intermediate_size = gemma2 || gemma3 ? 9216 : 24576;
    c.num_hidden_layers = gemma2 || gemma3 ? 26 : 28;
    c.num_attention_heads = gemma2 || gemma3 ? 8 : 16;
    c.num_key_value_heads = gemma2 || gemma3 ? 4 : 16;
    c.head_dim = 256;
    c.max_position_embeddings = gemma3 ? 131072 : 8192;
    c.rope_theta = gemma3 ? 1000000.0 : 10000.0;
    c.bos_token_id = 2;
    c.eos_token_id = 1;
    c.pad_token_id = 0;
    if (!gemma2 && !gemma3) return;
    c.query_pre_attn_scalar = 256.0;
    c.sliding_window = 4096;
    if (gemma2) {
      c.attn_logit_softcapping = 50.0;
      c.final_logit_softcapping = 30.0;
    } else {
      c.local_rope_theta = 10000.0;
    }
    const auto nullable = [&](const char* key, auto& out) {
      if (const auto it = json.find(key); it != json.end() && it->is_null()) out.reset();
      detail::read_optional_field(json, family, key, out);
    };
    nullable("query_pre_attn_scalar", c.query_pre_attn_scalar);
    nullable("sliding_window", c.sliding_window);
    nullable("final_logit_softcapping", c.final_logit_softcapping);
    if (gemma2) nullable("attn_logit_softcapping", c.attn_logit_softcapping);
    if (gemma3) nullable("rope_local_base_freq", c.local_rope_theta);
    detail::refuse_unless_off(json, family, "use_bidirectional_attention", "bidirectional attention");
  }

  /// Gemma 3's `rope_parameters` in transformers 5's layout, one object per layer type: the global layers' theta and
  /// scaling, the sliding layers' theta (their scaling stays none, as transformers 4.57 has it). Where the 4.x fields
  /// (`rope_theta`, `rope_local_base_freq`) are there too, they must agree.
  static void read_rope_per_layer_type(const nlohmann::json& parameters, const Rotary& legacy,
                                       const nlohmann::json& json, LlamaConfig& c) {
    const auto part = [&](const char* type, const std::string& field) {
      const auto it = parameters.find(type);
      if (it == parameters.end() || it->is_null()) return Rotary{};
      return read_rotary_object(*it, field, c.max_position_embeddings);
    };
    const auto global = part("full_attention", "llama.rope_parameters.full_attention");
    const auto local = part("sliding_attention", "llama.rope_parameters.sliding_attention");
    if (local.scaling)
      throw SpecError("llama.rope_parameters.sliding_attention.rope_type", local.scaling->rope_type,
                      "rope scaling on the sliding layers is not implemented by hpctrain (only on the global ones)");
    std::optional<double> legacy_local;
    detail::read_optional_field(json, "llama", "rope_local_base_freq", legacy_local);
    const auto disagree = [](const std::optional<double>& a, const std::optional<double>& b) {
      return a && b && *a != *b;
    };
    if (disagree(global.theta, legacy.theta) || disagree(local.theta, legacy_local))
      throw SpecError("llama.rope_parameters", parameters.dump(),
                      "the transformers 5 and 4 layouts of the config disagree (rope_theta, rope_local_base_freq)");
    c.rope_theta = global.theta.value_or(legacy.theta.value_or(c.rope_theta));
    c.rope_scaling = global.scaling;
    if (local.theta || legacy_local) c.local_rope_theta = local.theta ? local.theta : legacy_local;
  }

  /// Settings other families of transformers' Llama lineage carry that change the math and that hpctrain does
  /// not implement: refused by name rather than read as the plain model.
  static void refuse_unimplemented(const nlohmann::json& json, const LlamaConfig& c) {
    constexpr std::string_view family = "llama";
    if (c.model_type != "gemma2" && c.model_type != "gemma3_text") {  // theirs read_gemma reads
      detail::refuse_unless_off(json, family, "attn_logit_softcapping", "attention logit soft-capping");
      detail::refuse_unless_off(json, family, "final_logit_softcapping", "final logit soft-capping");
    }
    detail::refuse_unless_off(json, family, "quantization_config", "loading quantized weights");
    detail::refuse_unless_off(json, family, "use_qk_norm", "normalising queries and keys");
    detail::refuse_unless_off(json, family, "attention_chunk_size", "chunked attention");
    double residual_dropout = 0.0;  // Phi-3's, on the output of each attention and MLP before it joins the stream
    detail::read_field(json, family, "resid_pdrop", residual_dropout);
    if (residual_dropout != 0.0)
      throw SpecError(detail::field_id(family, "resid_pdrop"), fmt::format("{:g}", residual_dropout),
                      "dropout on the residual branches is not implemented by hpctrain (fine-tune with 0)");
  }

  /// Each layer's attention. transformers 5 lists it in `layer_types` (Qwen2 writes it always); Qwen2's and Qwen3's
  /// classes attend as it says (without it, the layers from max_window_layers on slide), Mistral's and Phi-3's slide
  /// on every layer whatever it says (Mistral's warns that it ignores it).
  static void read_layer_types(const nlohmann::json& json, LlamaConfig& c, std::int64_t max_window_layers) {
    const auto types = json.find("layer_types");
    const bool stated = types != json.end() && !types->is_null();
    if (stated) {
      if (!types->is_array()) throw SpecError("llama.layer_types", types->dump(), "must be a list");
      for (const auto& type : *types) {
        const bool full = type == "full_attention", sliding = type == "sliding_attention";
        if (!full && !(sliding && c.sliding_window))
          throw SpecError("llama.layer_types", type.dump(),
                          sliding ? "sliding attention without a sliding_window is not implemented by hpctrain"
                                  : "is not implemented by hpctrain (it implements full_attention and "
                                    "sliding_attention)");
      }
      if (static_cast<std::int64_t>(types->size()) != c.num_hidden_layers)
        throw SpecError("llama.layer_types", fmt::format("{} entries", types->size()),
                        fmt::format("must list num_hidden_layers = {} layers", c.num_hidden_layers));
    }
    const bool gemma = c.model_type == "gemma2" || c.model_type == "gemma3_text";
    if (c.model_type != "qwen2" && c.model_type != "qwen3" && !gemma) return;
    if (stated) {
      for (const auto& type : *types) c.layer_types.push_back(type.get<std::string>());
      return;
    }
    // Gemma 2 slides on every other layer from the first, Gemma 3 on five of every six (sliding_window_pattern).
    std::int64_t pattern = c.model_type == "gemma2" ? 2 : 6;
    if (c.model_type == "gemma3_text") detail::read_field(json, "llama", "sliding_window_pattern", pattern);
    if (pattern < 1) throw SpecError("llama.sliding_window_pattern", std::to_string(pattern), "must be at least 1");
    for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const bool slides = gemma ? (i + 1) % pattern != 0 : c.sliding_window && i >= max_window_layers;
      if (slides && !c.sliding_window)
        throw SpecError("llama.sliding_window", "null",
                        "sliding layers (by the family's pattern) without a sliding_window are not implemented by "
                        "hpctrain (give layer_types)");
      c.layer_types.push_back(slides ? "sliding_attention" : "full_attention");
    }
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
