// config.json in transformers 4's layout and 5's: the same model from either, both written on export, two
// layouts that disagree refused naming both, and settings that change the math that hpctrain does not
// implement refused by name (issue: checkpoints saved by transformers 5 loaded with the default rope theta).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <hpctrain/models/hf/pretrained_config.hpp>

#include "models_test_support.hpp"

namespace hm = hpctrain::models;

namespace {

std::string error_of(const std::string& json) {
  try {
    (void)hm::LlamaConfig::from_json(nlohmann::json::parse(json));
  } catch (const hpctrain::SpecError& error) {
    return error.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("A Llama config gives the same rotary settings in transformers 4's layout and 5's", "[models][config]") {
  auto [json, theta, scaling] = GENERATE(table<std::string, double, std::string>({
      {R"({"rope_theta": 20000.0, "rope_scaling": null})", 20000.0, "none"},
      {R"({"rope_parameters": {"rope_theta": 20000.0, "rope_type": "default"}})", 20000.0, "none"},
      {R"({"rope_theta": 20000.0, "rope_parameters": {"rope_theta": 20000.0, "rope_type": "default"}})", 20000.0,
       "none"},
      {R"({"rope_parameters": {"rope_type": "default"}, "rope_theta": 30000.0})", 30000.0, "none"},
      {R"({"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})",
       500000.0, "llama3 8 8192"},
      {R"({"rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})",
       500000.0, "llama3 8 8192"},
      // transformers 5 defaults a llama3 scaling's original length to max_position_embeddings
      {R"({"max_position_embeddings": 4096, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0}})",
       500000.0, "llama3 8 4096"},
      {R"({"rope_scaling": {"type": "linear", "factor": 2.0}})", 10000.0, "linear 2 2048"},
      {R"({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0}})", 1000000.0,
       "linear 2 2048"},
      {R"({})", 10000.0, "none"},
  }));
  CAPTURE(json);
  const auto config = hm::LlamaConfig::from_json(nlohmann::json::parse(json));
  CHECK(config.rope_theta == theta);
  const auto& s = config.rope_scaling;
  CHECK((s ? fmt::format("{} {:g} {}", s->rope_type, s->factor, s->original_max_position_embeddings) : "none") ==
        scaling);
}

TEST_CASE("A config.json that transformers 5 cannot read as hpctrain does is refused naming the field",
          "[models][config]") {
  auto [json, message] = GENERATE(table<std::string, std::string>({
      {R"({"rope_theta": 10000.0, "rope_parameters": {"rope_theta": 20000.0, "rope_type": "default"}})",
       "[hpctrain.spec.llama.rope_parameters.rope_theta] llama.rope_parameters.rope_theta = 20000 but rope_theta = "
       "10000: "
       "the transformers 5 and 4 layouts of the config disagree"},
      {R"({"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_parameters": {"rope_type": "linear", "factor": 4.0}})",
       "[hpctrain.spec.llama.rope_parameters] llama.rope_parameters = {\"factor\":4.0,\"rope_type\":\"linear\"} but "
       "rope_scaling = "
       "{\"factor\":2.0,\"rope_type\":\"linear\"}: the transformers 5 and 4 layouts of the config disagree"},
      {R"({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}})",
       "[hpctrain.spec.llama.rope_parameters.rope_type] llama.rope_parameters.rope_type = yarn: is not implemented by "
       "hpctrain "
       "(it implements default, linear and llama3)"},
      {R"({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}})",
       "[hpctrain.spec.llama.rope_parameters.rope_type] llama.rope_parameters.rope_type = dynamic: is not implemented "
       "by hpctrain "
       "(it implements default, linear and llama3)"},
      {R"({"rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}})",
       "[hpctrain.spec.llama.rope_scaling.rope_type] llama.rope_scaling.rope_type = longrope: is not implemented by "
       "hpctrain "
       "(it implements default, linear and llama3)"},
      {R"({"rope_parameters": {"full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "default"}}})",
       "[hpctrain.spec.llama.rope_parameters] llama.rope_parameters = {\"full_attention\":{\"rope_type\":\"default\"},"
       "\"sliding_attention\":{\"rope_type\":\"default\"}}: rotary parameters per layer type are not implemented by "
       "hpctrain"},
      {R"({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}})",
       "[hpctrain.spec.llama.rope_parameters.partial_rotary_factor] llama.rope_parameters.partial_rotary_factor = 0.5: "
       "partial rotary embeddings are not implemented by hpctrain"},
      {R"({"partial_rotary_factor": 0.25})",
       "[hpctrain.spec.llama.partial_rotary_factor] llama.partial_rotary_factor = 0.25: partial rotary embeddings are "
       "not "
       "implemented by hpctrain"},
      {R"({"num_hidden_layers": 2, "layer_types": ["full_attention", "sliding_attention"]})",
       "[hpctrain.spec.llama.layer_types] llama.layer_types = \"sliding_attention\": sliding attention without a "
       "sliding_window is "
       "not implemented by hpctrain"},
      {R"({"num_hidden_layers": 2, "layer_types": ["full_attention", "chunked_attention"]})",
       "[hpctrain.spec.llama.layer_types] llama.layer_types = \"chunked_attention\": is not implemented by hpctrain "
       "(it implements "
       "full_attention and sliding_attention)"},
      {R"({"final_logit_softcapping": 30.0})",
       "[hpctrain.spec.llama.final_logit_softcapping] llama.final_logit_softcapping = 30.0: final logit soft-capping "
       "is not "
       "implemented by hpctrain"},
      {R"({"attn_logit_softcapping": 50.0})",
       "[hpctrain.spec.llama.attn_logit_softcapping] llama.attn_logit_softcapping = 50.0: attention logit soft-capping "
       "is not "
       "implemented by hpctrain"},
      {R"({"hidden_act": "relu2"})",
       "[hpctrain.spec.llama.hidden_act] llama.hidden_act = relu2: must be \"silu\" (SwiGLU), \"gelu_pytorch_tanh\" or "
       "\"gelu\" (GeGLU)"},
      {R"({"quantization_config": {"quant_method": "bitsandbytes"}})",
       "[hpctrain.spec.llama.quantization_config] llama.quantization_config = {\"quant_method\":\"bitsandbytes\"}: "
       "loading quantized "
       "weights is not implemented by hpctrain"},
      {R"({"dtype": "bfloat16", "torch_dtype": "float32"})",
       "[hpctrain.spec.llama.dtype] llama.dtype = \"bfloat16\" but torch_dtype = \"float32\": the transformers 5 and 4 "
       "spellings of "
       "the dtype disagree"},
      {R"({"dtype": "int8"})",
       "[hpctrain.spec.llama.dtype] llama.dtype = int8: must be float32, float16, bfloat16, float64 or auto"},
  }));
  CAPTURE(json);
  CHECK(error_of(json) == message);
}

TEST_CASE("Settings that are off, and Qwen2's layer types with its sliding window, are accepted", "[models][config]") {
  CHECK(error_of(R"({"final_logit_softcapping": null, "attn_logit_softcapping": null, "quantization_config": null,
                     "use_qk_norm": false, "partial_rotary_factor": 1.0})") == "(accepted)");
  CHECK(error_of(R"({"model_type": "qwen2", "num_hidden_layers": 2, "use_sliding_window": true, "sliding_window": 64,
                     "layer_types": ["full_attention", "sliding_attention"]})") == "(accepted)");
  CHECK(
      error_of(
          R"({"model_type": "qwen2", "num_hidden_layers": 2, "layer_types": ["full_attention", "full_attention"]})") ==
      "(accepted)");
}

TEST_CASE("Qwen3's config: query and key norms, a sliding window only with use_sliding_window, and its own export",
          "[models][config]") {
  const auto qwen3 = hm::LlamaConfig::from_json(nlohmann::json::parse(
      R"({"model_type": "qwen3", "hidden_size": 40, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "num_hidden_layers": 2, "intermediate_size": 72, "vocab_size": 100, "attention_bias": false,
          "use_sliding_window": false, "sliding_window": 4096, "max_window_layers": 28,
          "layer_types": ["full_attention", "full_attention"]})"));
  CHECK(qwen3.qk_norm);
  CHECK_FALSE(qwen3.qkv_bias);
  CHECK_FALSE(qwen3.sliding_window);  // stated, but not used: use_sliding_window is false
  CHECK(qwen3.unread_keys.empty());
  // 2 layers of: q 40x64, k and v 40x32, o 64x40, the MLP 3 x 40x72, two norms of 40, q_norm and k_norm of 16.
  CHECK(qwen3.parameter_count() == 2 * 100 * 40 + 40 + 2 * (40 * 64 + 2 * 40 * 32 + 64 * 40 + 3 * 40 * 72 + 80 + 32));
  const auto json = qwen3.to_json();
  CHECK(json["architectures"][0] == "Qwen3ForCausalLM");
  CHECK(json["model_type"] == "qwen3");
  CHECK(hm::LlamaConfig::from_json(nlohmann::json::parse(json.dump())).to_json() == json);
  const auto windowed = hm::LlamaConfig::from_json(
      nlohmann::json::parse(R"({"model_type": "qwen3", "use_sliding_window": true, "sliding_window": 64})"));
  CHECK(windowed.sliding_window == 64);
  // Qwen3Config's defaults: 32 layers, max_window_layers 28: the last 4 slide, as transformers lists them.
  CHECK(windowed.sliding_layers() == 4);
  CHECK_FALSE(windowed.window_of(27));
  CHECK(windowed.window_of(28) == 64);
  const auto windowed_json = windowed.to_json();
  CHECK(windowed_json["max_window_layers"] == 28);
  CHECK(windowed_json["layer_types"][28] == "sliding_attention");
  CHECK(hm::LlamaConfig::from_json(nlohmann::json::parse(windowed_json.dump())).to_json() == windowed_json);
  // layer_types, where given, says which layers slide; Mistral's and Phi-3's classes slide on every layer.
  const auto listed = hm::LlamaConfig::from_json(nlohmann::json::parse(
      R"({"model_type": "qwen2", "num_hidden_layers": 3, "use_sliding_window": true, "sliding_window": 16,
          "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]})"));
  CHECK(listed.window_of(0) == 16);
  CHECK_FALSE(listed.window_of(1));
  CHECK(listed.window_of(2) == 16);
  const auto mistral = hm::LlamaConfig::from_json(
      nlohmann::json::parse(R"({"model_type": "mistral", "num_hidden_layers": 2, "sliding_window": 16})"));
  CHECK(mistral.sliding_layers() == 2);
  CHECK_FALSE(hm::LlamaConfig::from_json(nlohmann::json::parse(R"({"model_type": "llama"})")).qk_norm);
}

TEST_CASE("Phi-3's config: q/k/v and gate/up stacked, its window, residual dropout and longrope refused by name",
          "[models][config]") {
  // Phi-3-mini-4k-instruct's config.json, its fields as published (widths and the padding id shrunk).
  const auto phi3 = hm::LlamaConfig::from_json(nlohmann::json::parse(
      R"({"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "attention_dropout": 0.0, "bos_token_id": 1,
          "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 48, "initializer_range": 0.02,
          "intermediate_size": 80, "max_position_embeddings": 4096, "num_attention_heads": 6, "num_hidden_layers": 2,
          "num_key_value_heads": 6, "original_max_position_embeddings": 4096, "pad_token_id": 99,
          "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
          "sliding_window": 2047, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
          "vocab_size": 100})"));
  CHECK(phi3.stacked_projections);
  CHECK(phi3.sliding_window == 2047);
  CHECK(phi3.linear_layers() == std::vector<std::string>{"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"});
  // The same products as Llama's: q, k, v 48x48 each, o 48x48, gate and up 48x80, down 80x48, two norms of 48.
  CHECK(phi3.parameter_count() == 2 * 100 * 48 + 48 + 2 * (4 * 48 * 48 + 3 * 48 * 80 + 2 * 48));
  const auto json = phi3.to_json();
  CHECK(json["architectures"][0] == "Phi3ForCausalLM");
  CHECK(json["resid_pdrop"] == 0.0);
  CHECK(hm::LlamaConfig::from_json(nlohmann::json::parse(json.dump())).to_json() == json);
  CHECK_FALSE(hm::LlamaConfig::from_json(nlohmann::json::parse(R"({"model_type": "mistral"})")).stacked_projections);
  CHECK(error_of(R"({"model_type": "phi3", "resid_pdrop": 0.1})") ==
        "[hpctrain.spec.llama.resid_pdrop] llama.resid_pdrop = 0.1: dropout on the residual branches is not "
        "implemented by hpctrain "
        "(fine-tune with 0)");
  // Phi-3.5-mini's rotary scaling.
  CHECK_THAT(error_of(R"({"model_type": "phi3", "rope_scaling": {"type": "longrope", "short_factor": [1.0],
                          "long_factor": [1.0]}})"),
             Catch::Contains("longrope") && Catch::Contains("is not implemented by hpctrain"));
}

TEST_CASE(
    "Gemma's configs: each family's own defaults, null meaning none, Gemma 3's rope per layer type in both layouts",
    "[models][config]") {
  const auto read = [](const std::string& json) { return hm::LlamaConfig::from_json(nlohmann::json::parse(json)); };
  // What a config.json may leave out is Gemma2Config's default, not Llama's.
  const auto gemma2 = read(R"({"model_type": "gemma2", "num_hidden_layers": 4})");
  CHECK(gemma2.attn_logit_softcapping == 50.0);
  CHECK(gemma2.final_logit_softcapping == 30.0);
  CHECK(gemma2.query_pre_attn_scalar == 256.0);
  CHECK(gemma2.sliding_window == 4096);
  CHECK(gemma2.layer_types ==
        std::vector<std::string>{"sliding_attention", "full_attention", "sliding_attention", "full_attention"});
  CHECK(gemma2.head_dimension() == 256);
  CHECK(gemma2.tie_word_embeddings);
  CHECK(gemma2.hidden_act == "gelu_pytorch_tanh");
  CHECK(gemma2.sandwich_norms);
  CHECK_FALSE(gemma2.local_rope_theta);
  // Four norms a block, each of the width (2304 wide, 26 layers, 8/4 heads of 256 at Gemma2Config's defaults).
  CHECK(gemma2.parameter_count() - read(R"({"model_type": "gemma", "hidden_size": 2304, "intermediate_size": 9216,
                                             "num_hidden_layers": 4, "num_attention_heads": 8,
                                             "num_key_value_heads": 4})")
                                       .parameter_count() ==
        4 * 2 * 2304);
  const auto uncapped =
      read(R"({"model_type": "gemma2", "attn_logit_softcapping": null, "final_logit_softcapping": null,
                                 "query_pre_attn_scalar": 144})");
  CHECK_FALSE(uncapped.attn_logit_softcapping);
  CHECK_FALSE(uncapped.final_logit_softcapping);
  CHECK(*uncapped.attention_scale() == Approx(1.0 / 12.0));
  const auto gemma3 = read(R"({"model_type": "gemma3_text", "num_hidden_layers": 7})");
  CHECK(gemma3.sliding_layers() == 6);
  CHECK_FALSE(gemma3.local_rotary(5));
  CHECK(gemma3.local_rotary(6));
  CHECK(gemma3.rope_theta == 1000000.0);
  CHECK(gemma3.local_rope_theta == 10000.0);
  CHECK(gemma3.qk_norm);
  CHECK_FALSE(gemma3.attn_logit_softcapping);
  // transformers 5's layout: rotary parameters per layer type; scaling on the global layers only.
  const auto per_type = read(R"({"model_type": "gemma3_text", "rope_parameters": {
      "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
      "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}}})");
  CHECK(per_type.rope_scaling->rope_type == "linear");
  CHECK(per_type.local_rope_theta == 20000.0);
  const auto exported = per_type.to_json();
  CHECK(exported["rope_local_base_freq"] == 20000.0);
  CHECK(exported["rope_parameters"]["sliding_attention"]["rope_theta"] == 20000.0);
  CHECK(exported["query_pre_attn_scalar"].is_number_integer());
  CHECK(hm::LlamaConfig::from_json(nlohmann::json::parse(exported.dump())).to_json() == exported);
  CHECK_THAT(error_of(R"({"model_type": "gemma3_text", "rope_local_base_freq": 10000.0, "rope_parameters": {
                          "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}}})"),
             Catch::Contains("the transformers 5 and 4 layouts of the config disagree"));
  CHECK_THAT(error_of(R"({"model_type": "gemma3_text", "rope_parameters": {
                          "sliding_attention": {"rope_type": "linear", "factor": 2.0}}})"),
             Catch::Contains("rope scaling on the sliding layers is not implemented by hpctrain"));
  CHECK(error_of(R"({"model_type": "gemma3_text", "use_bidirectional_attention": true})") ==
        "[hpctrain.spec.llama.use_bidirectional_attention] llama.use_bidirectional_attention = true: bidirectional "
        "attention is not implemented by hpctrain");
  CHECK_THAT(error_of(R"({"model_type": "gemma2", "attn_logit_softcapping": -1.0})"),
             Catch::Contains("llama.attn_logit_softcapping"));
  CHECK_THAT(error_of(R"({"model_type": "gemma3", "text_config": {}})"), Catch::Contains("gemma3_text"));
}

TEST_CASE("A config's export holds both layouts, reads back the same, and names what it does not know",
          "[models][config]") {
  hm::LlamaConfig config;
  config.rope_theta = 500000.0;
  config.rope_scaling = hm::RopeScaling{};
  const auto json = config.to_json();
  CHECK(json["rope_theta"] == 500000.0);
  CHECK(json["rope_scaling"]["rope_type"] == "llama3");
  CHECK(json["rope_parameters"]["rope_theta"] == 500000.0);
  CHECK(json["rope_parameters"]["rope_type"] == "llama3");
  CHECK(json["rope_parameters"]["factor"] == json["rope_scaling"]["factor"]);
  CHECK(json["dtype"] == json["torch_dtype"]);
  const auto back = hm::LlamaConfig::from_json(nlohmann::json::parse(json.dump()));
  CHECK(back.to_json() == json);
  CHECK(back.unread_keys.empty());

  const auto with_unknown =
      hm::LlamaConfig::from_json(nlohmann::json::parse(R"({"use_cache": true, "frobnicate": 3, "moe_experts": 8})"));
  CHECK(with_unknown.unread_keys == std::vector<std::string>{"frobnicate", "moe_experts"});
  CHECK(hm::GPT2Config::from_json(nlohmann::json::parse(hm::GPT2Config().to_json().dump())).unread_keys.empty());
  CHECK(hm::RobertaConfig::from_json(nlohmann::json::parse(hm::RobertaConfig().to_json().dump())).unread_keys.empty());
}

TEST_CASE("A directory's config is read by its model_type, understood in one line, and its errors name the file",
          "[models][config]") {
  const auto dir = models_test::scratch("config-layouts");
  const auto write = [&](const std::string& text) {
    hpctrain::detail::write_file_atomically(dir / "config.json", text);
  };
  write(
      R"({"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 100, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
            "tie_word_embeddings": true, "dtype": "bfloat16", "new_thing": 1})");
  const auto reading = hm::read_config_reading(dir);
  CHECK(reading.summary ==
        "qwen2: 2 layers, hidden 64, MLP 128, 4 heads / 2 KV heads of dim 16, rope theta 1000000, rms_norm_eps 1e-06, "
        "tied head, "
        "vocabulary 100, 2048 positions, attention biases, dtype bfloat16");
  CHECK(reading.warning(dir / "config.json") ==
        fmt::format("hpctrain: warning: {} has keys hpctrain does not read (ignored): new_thing",
                    (dir / "config.json").string()));

  write(R"({"model_type": "llama", "rope_parameters": {"rope_type": "yarn", "factor": 4.0}})");
  std::string message;
  try {
    hm::read_config_reading(dir);
  } catch (const hpctrain::SpecError& error) {
    message = error.what();
  }
  CHECK(
      message ==
      fmt::format("[hpctrain.spec.llama.rope_parameters.rope_type] {}: llama.rope_parameters.rope_type = yarn: is not "
                  "implemented by hpctrain (it implements default, linear and llama3)",
                  (dir / "config.json").string()));

  write(R"({"model_type": "t5"})");
  CHECK_THROWS_WITH(hm::read_config_reading(dir),
                    Catch::Contains("model_type = \"t5\"") && Catch::Contains((dir / "config.json").string()));
}
