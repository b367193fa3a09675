// The models layer without the oracle: safetensors files (round trip, and every malformed case refused
// with its exact message), checkpoints that do not fit the config, configs (validation, config.json
// round trip, parameter counts, FLOPs), the KV cache and activation checkpointing.
#include <catch2/catch.hpp>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <hpctrain/models/models.hpp>

#include "models_test_support.hpp"

namespace ht = hpctrain::models;
namespace st = hpctrain::models::safetensors;
using models_test::scratch;

namespace {

/// A safetensors file: 8-byte length, `header` as given, `data_size` zero bytes.
std::string file_bytes(const std::string& header, std::size_t data_size) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  return out + header + std::string(data_size, '\0');
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

ht::GPT2Config tiny_gpt2() {
  ht::GPT2Config c;
  c.vocab_size = 97;
  c.n_positions = 32;
  c.n_embd = 32;
  c.n_layer = 2;
  c.n_head = 4;
  c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = 0.0;
  return c;
}

ht::LlamaConfig tiny_llama() {
  ht::LlamaConfig c;
  c.vocab_size = 97;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.rope_scaling = ht::RopeScaling{};
  return c;
}

void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

}  // namespace

TEST_CASE("A malformed safetensors header is refused naming the file, the tensor and the reason",
          "[models][safetensors]") {
  const std::string ok_a = R"("a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  auto [header, data_size, message] = GENERATE_REF(table<std::string, std::size_t, std::string>({
      {"", 0, "f.safetensors: header length 0 runs past"},  // placeholder, replaced below
      {"{" + ok_a + R"(, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12,
       "f.safetensors: tensor b: data_offsets [4, 12] overlap tensor a (which ends at 8)"},
      {"{" + ok_a + R"(, "b": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}})", 16,
       "f.safetensors: tensor b: data_offsets [12, 16] leave a gap of 4 bytes after tensor a"},
      {R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8,
       "f.safetensors: tensor a: data_offsets [0, 8] hold 8 bytes but shape [3] of F32 needs 12"},
      {R"({"a": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}})", 8,
       "f.safetensors: tensor a: unknown dtype \"F33\""},
      {"{" + ok_a + "}", 16, "f.safetensors: tensor a: the data holds 8 bytes after the last tensor ends at 8"},
      {R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8,
       "f.safetensors: tensor a: data_offsets [0, 16] run past the end of the data (8 bytes)"},
      {R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8,
       "f.safetensors: tensor a: shape [-2] has a dimension that is not a non-negative integer"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8,
       "f.safetensors: tensor a: data_offsets [8, 0] end before they begin"},
      {R"({"a": [1, 2]})", 0, "f.safetensors: tensor a: the header entry is not an object"},
      {R"({"a": )", 0, "f.safetensors: the header is not valid JSON"},
  }));
  CAPTURE(header);
  std::string bytes = file_bytes(header, data_size);
  if (header.empty()) {
    bytes = file_bytes("{}", 0);
    bytes[0] = 100;  // the header claims 100 bytes, the file has 2 after the length
    message = "f.safetensors: header length 100 runs past the end of the file (10 bytes)";
  }
  CHECK(error_of([&] { st::parse_header(bytes, "f.safetensors"); }) == "[hpctrain.runtime.safetensors] " + message);
}

TEST_CASE("A file shorter than the header length is refused", "[models][safetensors]") {
  CHECK(error_of([] { st::parse_header("abc", "f"); }) ==
        "[hpctrain.runtime.safetensors] f: the file is 3 bytes, shorter than the 8-byte header length");
}

TEST_CASE("Tensors of every dtype survive a safetensors round trip, memory-mapped, converted when asked",
          "[models][safetensors]") {
  const auto dir = scratch("safetensors-round-trip");
  torch::manual_seed(3);
  st::NamedTensors tensors{
      {"f32", torch::randn({3, 4})},
      {"f16", torch::randn({5}).to(torch::kFloat16)},
      {"bf16", torch::randn({2, 3}).to(torch::kBFloat16)},
      {"i64", torch::arange(7, torch::kInt64)},
      {"i32", torch::arange(3, torch::kInt32)},
      {"i8", torch::arange(-3, 3, torch::kInt8)},
      {"u8", torch::arange(5, torch::kUInt8)},
      {"bool", torch::tensor({true, false, true})},
      {"empty", torch::zeros({0, 4})},
  };
  st::save_file(dir / "t.safetensors", tensors, {{"format", "pt"}});
  const st::File file(dir / "t.safetensors");
  CHECK(file.header().metadata.at("format") == "pt");
  for (const auto& [name, tensor] : tensors) {
    CAPTURE(name);
    const auto read = file.tensor(name);
    CHECK(read.scalar_type() == tensor.scalar_type());
    CHECK(read.sizes() == tensor.sizes());
    CHECK(torch::equal(read, tensor));
  }
  CHECK(torch::equal(file.tensor("bf16", torch::kFloat32), tensors[2].second.to(torch::kFloat32)));
  CHECK(
      error_of([&] { file.tensor("nope"); }) ==
      fmt::format("[hpctrain.runtime.safetensors] {}: tensor nope: not in the file", (dir / "t.safetensors").string()));
}

TEST_CASE("A checkpoint that does not fit the config is refused before any weight is copied", "[models][safetensors]") {
  const auto dir = scratch("checkpoint-mismatch");
  torch::manual_seed(5);
  ht::GPT2 saved(tiny_gpt2());
  ht::save_pretrained(*saved, dir);
  const auto file = (dir / "model.safetensors").string();
  const st::File original(file);
  st::NamedTensors tensors;
  for (const auto& info : original.tensors()) tensors.emplace_back(info.name, original.tensor(info.name).clone());

  auto rewrite = [&](st::NamedTensors changed) { st::save_file(file, changed); };
  SECTION("a missing tensor") {
    auto changed = tensors;
    changed.erase(std::find_if(changed.begin(), changed.end(),
                               [](auto& t) { return t.first == "transformer.h.1.mlp.c_fc.bias"; }));
    rewrite(changed);
    CHECK(error_of([&] { ht::load_gpt2(dir); }) ==
          fmt::format(
              "[hpctrain.runtime.safetensors] {}: tensor transformer.h.1.mlp.c_fc.bias: missing: the config needs it",
              file));
  }
  SECTION("an unexpected tensor") {
    auto changed = tensors;
    changed.emplace_back("transformer.h.2.ln_1.weight", torch::ones({32}));
    rewrite(changed);
    CHECK(error_of([&] { ht::load_gpt2(dir); }) ==
          fmt::format("[hpctrain.runtime.safetensors] {}: tensor transformer.h.2.ln_1.weight: unexpected: the config "
                      "has no such weight",
                      file));
  }
  SECTION("a tensor of the wrong shape") {
    auto changed = tensors;
    for (auto& [name, tensor] : changed)
      if (name == "transformer.h.0.attn.c_attn.weight") tensor = torch::zeros({96, 32});
    rewrite(changed);
    CHECK(error_of([&] { ht::load_gpt2(dir); }) ==
          fmt::format("[hpctrain.runtime.safetensors] {}: tensor transformer.h.0.attn.c_attn.weight: shape [96, 32] "
                      "but the config needs [32, 96]",
                      file));
  }
  SECTION("a corrupt file") {
    auto bytes = models_test::read_text(file);
    bytes[5] = 1;  // + 2^40: the header length runs far past the end
    write_bytes(file, bytes);
    CHECK_THAT(error_of([&] { ht::load_gpt2(dir); }),
               Catch::StartsWith(fmt::format("[hpctrain.runtime.safetensors] {}: header length", file)));
  }
  SECTION("an intact file loads with the same weights") {
    auto loaded = ht::load_gpt2(dir);
    CHECK(torch::equal(loaded->h[1]->as<ht::GPT2Block>()->attn->c_attn->weight,
                       saved->h[1]->as<ht::GPT2Block>()->attn->c_attn->weight));
  }
}

TEST_CASE("An invalid config is refused naming the field", "[models][config]") {
  auto [json, message] = GENERATE(table<std::string, std::string>({
      {R"({"model_type": "gpt2", "n_embd": 64, "n_head": 5})",
       "[hpctrain.spec.gpt2.n_head] gpt2.n_head = 5: must divide n_embd = 64"},
      {R"({"model_type": "gpt2", "n_layer": "2"})",
       "[hpctrain.spec.gpt2.n_layer] gpt2.n_layer = \"2\": has the wrong type"},
      {R"({"model_type": "gpt2", "activation_function": "relu"})",
       "[hpctrain.spec.gpt2.activation_function] gpt2.activation_function = relu: must be \"gelu_new\", "
       "\"gelu_pytorch_tanh\" or \"gelu\""},
      {R"({"model_type": "llama", "num_attention_heads": 32, "num_key_value_heads": 5})",
       "[hpctrain.spec.llama.num_key_value_heads] llama.num_key_value_heads = 5: must divide num_attention_heads = 32"},
      {R"({"model_type": "llama", "hidden_size": 100, "num_attention_heads": 8})",
       "[hpctrain.spec.llama.num_attention_heads] llama.num_attention_heads = 8: must divide hidden_size = 100 (or "
       "give head_dim)"},
      {R"({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})",
       "[hpctrain.spec.llama.rope_scaling.rope_type] llama.rope_scaling.rope_type = yarn: is not implemented by "
       "hpctrain (it implements "
       "default, linear and llama3)"},
      {R"({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "low_freq_factor": 4.0, "high_freq_factor": 1.0}})",
       "[hpctrain.spec.llama.rope_scaling.high_freq_factor] llama.rope_scaling.high_freq_factor = 1: must exceed "
       "low_freq_factor = 4"},
      {R"({"model_type": "bert"})",
       "[hpctrain.spec.llama.model_type] llama.model_type = \"bert\": this is not a config of the Llama family "
       "(\"llama\", \"qwen2\", \"qwen3\", \"mistral\", \"phi3\", \"gemma\", \"gemma2\", "
       "\"gemma3_text\")"},
  }));
  CAPTURE(json);
  const auto parsed = nlohmann::json::parse(json);
  const bool gpt2 = parsed["model_type"] == "gpt2";
  CHECK(error_of([&] { gpt2 ? (void)ht::GPT2Config::from_json(parsed) : (void)ht::LlamaConfig::from_json(parsed); }) ==
        message);
}

TEST_CASE("Configs survive config.json, and count the parameters and FLOPs of their modules", "[models][config]") {
  const auto gpt2 = tiny_gpt2();
  const auto gpt2_back = ht::GPT2Config::from_json(nlohmann::json::parse(gpt2.to_json().dump()));
  CHECK(gpt2_back.to_json() == gpt2.to_json());
  const auto llama = tiny_llama();
  const auto llama_back = ht::LlamaConfig::from_json(nlohmann::json::parse(llama.to_json().dump()));
  CHECK(llama_back.to_json() == llama.to_json());

  auto count = [](torch::nn::Module& m) {
    std::int64_t n = 0;
    for (const auto& p : m.parameters()) n += p.numel();
    return n;
  };
  ht::GPT2 gpt2_model(gpt2);
  ht::Llama llama_model(llama);
  CHECK(count(*gpt2_model) == gpt2.parameter_count());
  CHECK(count(*llama_model) == llama.parameter_count());
  CHECK(gpt2_model->blocks().size() == 2);
  CHECK(llama_model->blocks().size() == 2);

  // GPT-2 124M at 1024 tokens, as nanoGPT's estimate_mfu counts it: N = 124,439,808 − 786,432 positions.
  const ht::GPT2Config gpt2_124m;
  CHECK(gpt2_124m.parameter_count() == 124'439'808);
  CHECK(ht::flops_per_token(gpt2_124m, 1024) == 6.0 * 123'653'376 + 12.0 * 12 * 768 * 1024);
}

TEST_CASE("Tokens fed through the KV cache in pieces give the logits of the whole sequence", "[models][generation]") {
  torch::manual_seed(11);
  ht::Llama llama(tiny_llama());
  ht::GPT2 gpt2(tiny_gpt2());
  for (ht::CausalLM* model : {static_cast<ht::CausalLM*>(llama.get()), static_cast<ht::CausalLM*>(gpt2.get())}) {
    torch::NoGradGuard no_grad;
    model->eval();
    const auto ids = torch::randint(97, {2, 9}, torch::kLong);
    const auto whole = model->forward(ids);
    auto cache = model->make_cache(2, 9);
    std::vector<torch::Tensor> pieces;
    for (auto [begin, length] : {std::pair{0, 3}, std::pair{3, 1}, std::pair{4, 5}})
      pieces.push_back(model->forward(ids.narrow(1, begin, length), &cache));
    CHECK(cache.length() == 9);
    CHECK(torch::allclose(torch::cat(pieces, 1), whole, 1e-5, 1e-5));
    CHECK_THAT(
        error_of([&] { model->forward(ids.narrow(1, 0, 1), &cache); }),
        Catch::Contains("[hpctrain.runtime.generation] the KV cache holds 9 positions; 9 cached + 1 new do not fit"));
  }
}

TEST_CASE(
    "Llama's pad_token_id is its embedding's padding_idx, as transformers builds it: that row gets no gradient "
    "from the lookup",
    "[models][config]") {
  torch::manual_seed(12);
  auto config = tiny_llama();
  config.pad_token_id = 5;
  ht::Llama llama(config);
  const auto ids = torch::tensor({{1, 5, 7, 5, 2}}, torch::kLong);
  llama->forward(ids).sum().backward();
  const auto& grad = llama->embed_tokens->weight.grad();
  CHECK(grad[5].abs().max().item<double>() == 0.0);
  CHECK(grad[7].abs().max().item<double>() > 0.0);
  CHECK(ht::LlamaConfig::from_json(nlohmann::json::parse(config.to_json().dump())).pad_token_id == 5);
  config.pad_token_id = 97;
  CHECK_THAT(error_of([&] { config.validate(); }),
             Catch::Contains("[hpctrain.spec.llama.pad_token_id] llama.pad_token_id = 97: must be a token id below "
                             "vocab_size = 97 (or a negative one from its end)"));
}

TEST_CASE("Activation checkpointing gives the gradients of the plain backward", "[models][checkpointing]") {
  torch::manual_seed(13);
  ht::Llama llama(tiny_llama());
  ht::GPT2 gpt2(tiny_gpt2());
  for (ht::CausalLM* model : {static_cast<ht::CausalLM*>(llama.get()), static_cast<ht::CausalLM*>(gpt2.get())}) {
    model->train();
    const auto ids = torch::randint(97, {2, 12}, torch::kLong);
    auto gradients = [&](bool checkpointing) {
      model->set_activation_checkpointing(checkpointing);
      model->zero_grad();
      model->forward(ids).logsumexp(-1).mean().backward();
      std::vector<torch::Tensor> out;
      for (const auto& p : model->parameters()) out.push_back(p.grad().clone());
      return out;
    };
    const auto plain = gradients(false), recomputed = gradients(true);
    REQUIRE(plain.size() == recomputed.size());
    for (std::size_t i = 0; i < plain.size(); ++i) CHECK(torch::allclose(plain[i], recomputed[i], 1e-6, 1e-7));
  }
}

TEST_CASE("Sampling is reproducible from its seed and greedy without a temperature", "[models][generation]") {
  torch::manual_seed(17);
  ht::GPT2 model(tiny_gpt2());
  ht::GenerationOptions sample;
  sample.max_new_tokens = 12;
  sample.temperature = 0.8;
  sample.top_k = 5;
  sample.seed = 42;
  CHECK(ht::generate(*model, {1, 2, 3}, sample) == ht::generate(*model, {1, 2, 3}, sample));
  ht::GenerationOptions too_long;
  too_long.max_new_tokens = 40;
  CHECK(error_of([&] {
          ht::generate(*model, {1, 2, 3}, too_long);
        }) ==
        "[hpctrain.spec.generation.max_new_tokens] generation.max_new_tokens = 40: prompt (3 tokens) + new tokens "
        "exceed the model's 32 positions");
}

TEST_CASE(
    "A model built from scratch with its blocks empty rebuilds, bit for bit, the weights built whole from the same "
    "seed",
    "[models][deferred]") {
  // What ZeRO-3 builds from scratch (models::DeferredInitialization): no block is ever whole on a rank, yet every
  // slice a rank reads, the whole materialized model and the generator's state after the constructor equal
  // those of the model built whole. Tied and untied heads: the head's draw comes after every block's.
  const auto check = [](auto make, const std::string& family) {
    const auto built_whole = [&] {
      torch::manual_seed(21);
      auto model = make();
      const auto after = torch::rand({8});
      return std::make_pair(model, after);
    };
    auto [whole, whole_after] = built_whole();
    torch::manual_seed(21);
    auto deferred_model = decltype(make())(nullptr);
    std::shared_ptr<hpctrain::DeferredBlocks> deferred;
    {
      ht::DeferredInitialization scope;
      deferred_model = make();
      deferred = scope.blocks();
    }
    const auto deferred_after = torch::rand({8});
    INFO(family);
    CHECK(torch::equal(whole_after, deferred_after));
    REQUIRE(deferred != nullptr);
    REQUIRE(deferred->shapes.size() == deferred_model->blocks().size());
    for (const auto& block : deferred_model->blocks())
      for (const auto& parameter : block->parameters()) CHECK(parameter.numel() == 0);
    // A slice from the middle, as a rank of a sharded strategy reads it.
    const auto first = whole->blocks()[1]->parameters()[0].view({-1});
    auto slice = torch::empty({first.numel() / 3});
    deferred->read(1, 0, first.numel() / 2, slice);
    CHECK(torch::equal(slice, first.narrow(0, first.numel() / 2, slice.numel())));
    deferred_model->set_deferred_blocks(deferred);
    hpctrain::materialize_blocks(*deferred_model);
    const auto expected = whole->named_parameters();
    for (const auto& item : deferred_model->named_parameters()) {
      INFO(item.key());
      CHECK(torch::equal(item.value(), expected[item.key()]));
    }
  };
  for (const bool tied : {true, false}) {
    auto llama = tiny_llama();
    llama.tie_word_embeddings = tied;
    check([&] { return ht::Llama(llama); }, tied ? "llama, tied" : "llama, untied");
    auto gpt2 = tiny_gpt2();
    gpt2.tie_word_embeddings = tied;
    check([&] { return ht::GPT2(gpt2); }, tied ? "gpt2, tied" : "gpt2, untied");
  }
}

TEST_CASE("A block built empty that its model never initialises is refused: it could not be rebuilt",
          "[models][deferred]") {
  ht::DeferredInitialization scope;
  torch::nn::Linear layer(4, 4);
  hpctrain::BlockConstruction::built(*layer);
  CHECK_THAT(error_of([&] { scope.blocks(); }), Catch::Contains("block 0's parameter 0 was never initialised"));
}

TEST_CASE("A model whose blocks are still empty is not exported: the error names the weight, nothing is written",
          "[models][deferred]") {
  const auto directory = scratch("empty-blocks-export") / "export";
  ht::DeferredInitialization scope;
  ht::Llama model(tiny_llama());
  CHECK_THAT(error_of([&] { ht::save_pretrained(*model, directory); }),
             Catch::Contains("cannot write layers.0.input_layernorm.weight: it is empty (under --sharding zero3"));
  CHECK_FALSE(std::filesystem::exists(directory));
}
