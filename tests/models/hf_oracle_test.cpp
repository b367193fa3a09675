// GPT-2 and Llama against transformers: a small random model made and saved by transformers loads into
// our module with equal logits (1e-4, fp32, CPU) over a 12-token prompt and at 300 positions, and identical
// greedy generation; the model trained by hpctrain and exported loads back into transformers with equal
// logits. These cases run under the pinned transformers 4.57 and again under 5.x (tests/CMakeLists.txt): the
// two releases write different config.json layouts.
//
// The 1e-4 bound: logits here are O(1-10) (weights of std 0.1, tests/models/hf_oracle.py), summed in fp32 over
// a few hundred terms per product in both implementations, with different kernels and orders: each step
// rounds at ~6e-8 relative, so the difference stays within ~1e-5 of the logits' size; 1e-4 leaves an
// order of magnitude for other CPUs' vector widths. A rotary base read wrongly moves logits by 1e-2 and more
// at 300 positions (measured 2.2e-4 on a 12-token prompt, where the lowest frequencies barely turn).
#include <sys/wait.h>  // WEXITSTATUS

#include <catch2/catch.hpp>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <hpctrain/models/models.hpp>

#include "models_test_support.hpp"

namespace ht = hpctrain::models;
using models_test::run_oracle;
using models_test::scratch;

namespace {

const std::vector<std::int64_t> prompt{5, 17, 300, 42, 9, 250, 1, 77, 128, 3, 64, 400};

/// 300 positions of ids below 512, for the logits at long positions.
const std::vector<std::int64_t> long_sequence = [] {
  std::vector<std::int64_t> ids;
  for (std::int64_t i = 0; i < 300; ++i) ids.push_back((i * 7919 + 13) % 509);
  return ids;
}();

std::string ids_text(const std::vector<std::int64_t>& ids) { return fmt::format("{}", fmt::join(ids, ",")); }

ht::GenerationOptions greedy_32() {
  ht::GenerationOptions options;
  options.max_new_tokens = 32;
  return options;
}

torch::Tensor prompt_tensor() { return torch::tensor(prompt, torch::kLong).unsqueeze(0); }

/// The largest absolute difference between our logits and the oracle's in `dir`.
double logit_difference(ht::CausalLM& model, const std::filesystem::path& dir) {
  torch::NoGradGuard no_grad;
  model.eval();
  const auto ours = model.forward(prompt_tensor());
  const auto theirs = ht::safetensors::File(dir / "logits.safetensors").tensor("logits");
  REQUIRE(ours.sizes() == theirs.sizes());
  return (ours - theirs).abs().max().item<double>();
}

/// The same over `long_sequence`, against `dir/long_logits.safetensors`; prints the measured difference.
double long_logit_difference(ht::CausalLM& model, const std::filesystem::path& dir) {
  torch::NoGradGuard no_grad;
  model.eval();
  const auto ours = model.forward(torch::tensor(long_sequence, torch::kLong).unsqueeze(0));
  const auto theirs = ht::safetensors::File(dir / "long_logits.safetensors").tensor("logits");
  REQUIRE(ours.sizes() == theirs.sizes());
  const auto difference = (ours - theirs).abs().max().item<double>();
  WARN(fmt::format("logits at 300 positions differ from transformers' by {:.3g} (bound 1e-4) in {}", difference,
                   dir.string()));
  return difference;
}

/// The oracle options that also write the logits at 300 positions.
std::string long_option() { return fmt::format("--long {}", ids_text(long_sequence)); }

std::vector<std::int64_t> oracle_generation(const std::filesystem::path& dir) {
  return nlohmann::json::parse(models_test::read_text(dir / "generated.json")).get<std::vector<std::int64_t>>();
}

/// One training step's gradients here against transformers' (hf_oracle.py gradients) on the first 64 of
/// long_sequence (beyond the windows of the families' tests): the largest difference over every parameter transformers
/// has (its `model.` prefix dropped: our names), relative to the largest gradient. In fp32 both sum the same products
/// in other orders: ~1e-6 relative; a missing cap, norm or scale moves gradients by far more.
double gradient_difference(ht::CausalLM& model, const std::filesystem::path& model_dir,
                           const std::filesystem::path& dir) {
  const std::vector<std::int64_t> ids(long_sequence.begin(), long_sequence.begin() + 64);
  run_oracle(fmt::format("gradients '{}' {} '{}'", model_dir.string(), ids_text(ids), dir.string()),
             dir.string() + ".log");
  model.eval();
  model.zero_grad();
  const auto tokens = torch::tensor(ids, torch::kLong);
  const auto logits = model.forward(tokens.unsqueeze(0))[0];
  torch::nn::functional::cross_entropy(logits.narrow(0, 0, 63), tokens.narrow(0, 1, 63)).backward();
  const auto ours = model.named_parameters();
  const ht::safetensors::File theirs(dir / "gradients.safetensors");
  double largest = 0, difference = 0;
  for (const auto& info : theirs.tensors()) {
    const auto name = info.name.starts_with("model.") ? info.name.substr(6) : info.name;
    CAPTURE(name);
    REQUIRE(ours.contains(name));
    REQUIRE(ours[name].grad().defined());
    const auto expected = theirs.tensor(info.name);
    largest = std::max(largest, expected.abs().max().item<double>());
    difference = std::max(difference, (ours[name].grad() - expected).abs().max().item<double>());
  }
  model.zero_grad();
  WARN(fmt::format("one step's gradients differ from transformers' by {:.3g} of the largest ({:.3g}) in {}",
                   difference / largest, largest, dir.string()));
  return difference / largest;
}

/// A few AdamW steps of next-token prediction on random tokens; returns the first and last loss.
std::pair<double, double> train_briefly(ht::CausalLM& model, std::int64_t vocab) {
  torch::manual_seed(7);
  model.train();
  torch::optim::AdamW optimizer(model.parameters(), torch::optim::AdamWOptions(1e-3));
  const auto tokens = torch::randint(vocab, {4, 17}, torch::kLong);
  const auto inputs = tokens.narrow(1, 0, 16), targets = tokens.narrow(1, 1, 16);
  double first = 0, last = 0;
  for (int step = 0; step < 8; ++step) {
    optimizer.zero_grad();
    auto logits = model.forward(inputs);
    auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}), targets.reshape({-1}));
    loss.backward();
    optimizer.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  return {first, last};
}

}  // namespace

TEST_CASE(
    "A GPT-2 made by transformers gives the same logits and greedy tokens here, and its trained export loads back in "
    "transformers",
    "[models][oracle]") {
  const auto dir = scratch("gpt2-oracle");
  const std::string config = R"({"vocab_size": 512, "n_positions": 512, "n_embd": 64, "n_layer": 2, "n_head": 4})";
  run_oracle(fmt::format("make gpt2 '{}' '{}' {} {}", config, dir.string(), ids_text(prompt), long_option()),
             dir / "make.log");

  auto model = ht::load_gpt2(dir / "model");
  CHECK(model->config().n_head == 4);
  CHECK(logit_difference(*model, dir) < 1e-4);
  CHECK(long_logit_difference(*model, dir) < 1e-4);
  CHECK(ht::generate(*model, prompt, greedy_32()) == oracle_generation(dir));

  const auto [first, last] = train_briefly(*model, 512);
  CHECK(last < first);
  ht::save_pretrained(*model, dir / "export");
  run_oracle(fmt::format("expect '{}' {} '{}' {}", (dir / "export").string(), ids_text(prompt),
                         (dir / "export-oracle").string(), long_option()),
             dir / "expect.log");
  CHECK(logit_difference(*model, dir / "export-oracle") < 1e-4);
  CHECK(long_logit_difference(*model, dir / "export-oracle") < 1e-4);
  CHECK(ht::generate(*model, prompt, greedy_32()) == oracle_generation(dir / "export-oracle"));
}

TEST_CASE(
    "A Llama with grouped-query attention and Llama 3 rope scaling, sharded by transformers, gives the same logits and "
    "greedy tokens here, and its trained sharded export loads back in transformers",
    "[models][oracle]") {
  const auto dir = scratch("llama-oracle");
  const std::string config = R"({"vocab_size": 512, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 32}, "bos_token_id": 1, "eos_token_id": 2})";
  run_oracle(
      fmt::format("make llama '{}' '{}' {} --shard 200000 {}", config, dir.string(), ids_text(prompt), long_option()),
      dir / "make.log");
  REQUIRE(std::filesystem::exists(dir / "model" / "model.safetensors.index.json"));

  auto model = ht::load_llama(dir / "model");
  CHECK(model->config().kv_heads() == 2);
  CHECK(model->config().rope_theta == 500000.0);
  REQUIRE(model->config().rope_scaling.has_value());
  CHECK(model->config().rope_scaling->original_max_position_embeddings == 32);
  CHECK(logit_difference(*model, dir) < 1e-4);
  CHECK(long_logit_difference(*model, dir) < 1e-4);
  CHECK(ht::generate(*model, prompt, greedy_32()) == oracle_generation(dir));

  model->set_activation_checkpointing(true);
  const auto [first, last] = train_briefly(*model, 512);
  CHECK(last < first);
  ht::save_pretrained(*model, dir / "export", /*max_shard_bytes=*/150000);
  REQUIRE(std::filesystem::exists(dir / "export" / "model.safetensors.index.json"));
  run_oracle(fmt::format("expect '{}' {} '{}' {}", (dir / "export").string(), ids_text(prompt),
                         (dir / "export-oracle").string(), long_option()),
             dir / "expect.log");
  CHECK(logit_difference(*model, dir / "export-oracle") < 1e-4);
  CHECK(long_logit_difference(*model, dir / "export-oracle") < 1e-4);
  CHECK(ht::generate(*model, prompt, greedy_32()) == oracle_generation(dir / "export-oracle"));
}

namespace {

/// Runs build/examples/generate with `arguments`; returns its exit code, stdout and stderr in `out`/`err`.
int run_generate(const std::string& arguments, const std::filesystem::path& dir, std::string& out, std::string& err) {
  const char* build = std::getenv("HPCTRAIN_BUILD_DIR");
  REQUIRE(build != nullptr);
  const auto binary = std::filesystem::path(build) / "examples" / "generate";
  REQUIRE(std::filesystem::exists(binary));
  const auto command =
      fmt::format("'{}' {} > '{}' 2> '{}'", binary.string(), arguments, (dir / "out").string(), (dir / "err").string());
  const int status = std::system(command.c_str());
  out = models_test::read_text(dir / "out");
  err = models_test::read_text(dir / "err");
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE(
    "build/examples/generate reproduces transformers' greedy ids and refuses a corrupt file naming it and the tensor",
    "[models][oracle][example]") {
  const auto dir = scratch("generate-example");
  // A config the other tests do not use: three layers, two heads, exact GELU, an untied head.
  const std::string config = R"({"vocab_size": 300, "n_positions": 64, "n_embd": 48, "n_layer": 3, "n_head": 2,
    "activation_function": "gelu", "tie_word_embeddings": false, "eos_token_id": 7})";
  const std::vector<std::int64_t> ids{11, 250, 3, 99, 42};
  run_oracle(fmt::format("make gpt2 '{}' '{}' {}", config, dir.string(), ids_text(ids)), dir / "make.log");
  const auto expected = oracle_generation(dir);

  std::string out, err;
  REQUIRE(run_generate(
              fmt::format("--model '{}' --prompt-ids '11 250 3 99 42' --max-new-tokens 32", (dir / "model").string()),
              dir, out, err) == 0);
  INFO(err);
  CHECK(out == fmt::format("{}\n", fmt::join(expected, " ")));

  // Make the first tensor of the header claim F16: its bytes no longer match its shape.
  const auto file = dir / "model" / "model.safetensors";
  auto bytes = models_test::read_text(file);
  const auto at = bytes.find("{\"dtype\":\"F32\"");
  REQUIRE(at != std::string::npos);
  const auto name_end = at - 2, name_begin = bytes.rfind('"', name_end - 1) + 1;
  const auto tensor = bytes.substr(name_begin, name_end - name_begin);
  bytes.replace(at + 10, 3, "F16");
  {
    std::ofstream rewrite(file, std::ios::binary);
    rewrite << bytes;
  }
  CHECK(run_generate(fmt::format("--model '{}' --prompt-ids 1", (dir / "model").string()), dir, out, err) == 1);
  CHECK_THAT(err, Catch::StartsWith(fmt::format("[hpctrain.runtime.safetensors] {}: tensor {}: data_offsets",
                                                file.string(), tensor)));
  CHECK(out.empty());
}

TEST_CASE("build/examples/generate continues a text prompt through the model's tokenizer.json as transformers does",
          "[models][oracle][example]") {
  const auto dir = scratch("generate-text");
  // A Llama without rope scaling, tied head, one kv head; a byte-level BPE trained by HF tokenizers.
  const std::string config = R"({"vocab_size": 300, "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 1, "tie_word_embeddings": true, "rope_theta": 10000.0,
    "bos_token_id": 0, "eos_token_id": 299})";
  const std::string text = "The oracle of tests";
  run_oracle(fmt::format("make llama '{}' '{}' 'text:{}'", config, dir.string(), text), dir / "make.log");
  const auto expected = oracle_generation(dir);

  std::string out, err;
  const auto model = (dir / "model").string();
  REQUIRE(run_generate(fmt::format("--model '{}' --prompt '{}' --ids", model, text), dir, out, err) == 0);
  INFO(err);
  CHECK(out == fmt::format("{}\n", fmt::join(expected, " ")));
  REQUIRE(run_generate(fmt::format("--model '{}' --prompt '{}'", model, text), dir, out, err) == 0);
  CHECK(out == models_test::read_text(dir / "generated.txt") + "\n");
}

TEST_CASE(
    "A packed row's logits equal transformers' with position_ids and a block-diagonal 4-D mask, for GPT-2 and Llama",
    "[models][oracle][lm]") {
  const auto dir = scratch("packed-oracle");
  // Three examples of 4, 5 and 3 tokens in one row: positions restart, attention stays within each.
  const std::vector<std::int64_t> positions{0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 1, 2};
  const std::vector<std::int64_t> documents{0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2};
  const auto layout = ht::TokenLayout{torch::tensor(positions, torch::kLong).unsqueeze(0),
                                      torch::tensor(documents, torch::kLong).to(torch::kInt32).unsqueeze(0)};
  const std::vector<std::pair<std::string, std::string>> families{
      {"gpt2", R"({"vocab_size": 512, "n_embd": 48, "n_layer": 2, "n_head": 3, "n_positions": 64})"},
      {"llama", R"({"vocab_size": 512, "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 6, "num_key_value_heads": 2, "rope_theta": 30000.0})"}};
  for (const auto& [family, config] : families) {
    CAPTURE(family);
    const auto family_dir = dir / family;
    std::filesystem::create_directories(family_dir);
    run_oracle(fmt::format("make {} '{}' '{}' {}", family, config, family_dir.string(), ids_text(prompt)),
               family_dir / "make.log");
    run_oracle(fmt::format("expect-packed '{}' {} {} {} '{}'", (family_dir / "model").string(), ids_text(prompt),
                           ids_text(positions), ids_text(documents), (family_dir / "packed").string()),
               family_dir / "packed.log");
    auto model = ht::load_pretrained(family_dir / "model");
    torch::NoGradGuard no_grad;
    model->eval();
    const auto ours = model->forward(prompt_tensor(), layout);
    const auto theirs = ht::safetensors::File(family_dir / "packed" / "logits.safetensors").tensor("logits");
    REQUIRE(ours.sizes() == theirs.sizes());
    CHECK((ours - theirs).abs().max().item<double>() < 1e-4);
  }
}

namespace {

/// Makes `family` with `config` in transformers (hf_oracle.py make) in `family_dir`, loads it here and checks what
/// every Llama-family model must give as transformers does: its parameter count, logits at 12 and 300 positions, 32
/// greedy tokens, an export of its own model_type whose logits transformers reads back, one step's gradients.
/// Returns the model for the family's own checks.
ht::Llama llama_family_against_transformers(const std::string& family, const std::string& config,
                                            const std::filesystem::path& family_dir) {
  std::filesystem::create_directories(family_dir);
  run_oracle(
      fmt::format("make {} '{}' '{}' {} {}", family, config, family_dir.string(), ids_text(prompt), long_option()),
      family_dir / "make.log");
  auto model = ht::load_llama(family_dir / "model");
  CHECK(model->config().model_type == family);
  CHECK(hpctrain::parameter_count(*model) == model->config().parameter_count());
  CHECK(logit_difference(*model, family_dir) < 1e-4);
  CHECK(long_logit_difference(*model, family_dir) < 1e-4);
  CHECK(ht::generate(*model, prompt, greedy_32()) == oracle_generation(family_dir));
  ht::save_pretrained(*model, family_dir / "export");
  CHECK(ht::read_llama_config(family_dir / "export").model_type == family);
  run_oracle(fmt::format("expect '{}' {} '{}' {}", (family_dir / "export").string(), ids_text(prompt),
                         (family_dir / "export-oracle").string(), long_option()),
             family_dir / "expect.log");
  CHECK(logit_difference(*model, family_dir / "export-oracle") < 1e-4);
  CHECK(long_logit_difference(*model, family_dir / "export-oracle") < 1e-4);
  CHECK(gradient_difference(*model, family_dir / "model", family_dir / "gradients") < 1e-4);
  return model;
}

}  // namespace

TEST_CASE(
    "Qwen2 (q/k/v biases, tied head, a window on its second layer), Qwen3 (query and key norms, a head dimension of "
    "its "
    "own), Mistral and Phi-3 (q/k/v and gate/up stacked, both windowed) made by transformers give the same logits at "
    "300 positions and 32 greedy tokens here, export back to their own model_type, and a window holds through the KV "
    "cache and in packed rows",
    "[models][oracle][families]") {
  const auto dir = scratch("families-oracle");
  const std::vector<std::pair<std::string, std::string>> families{
      // Windows several times shorter than the 300 positions (and than the 12 + 32 of generation, for Qwen2 and
      // Phi-3): Qwen2's on layer 1 only (max_window_layers 1), Mistral's and Phi-3's on both layers.
      {"qwen2",
       R"({"vocab_size": 512, "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 2, "num_attention_heads": 6,
        "num_key_value_heads": 2, "rope_theta": 1000000.0, "tie_word_embeddings": true, "use_sliding_window": true,
        "sliding_window": 24, "max_window_layers": 1, "max_position_embeddings": 512, "bos_token_id": 1,
        "eos_token_id": 2})"},
      // 4 heads of 16 (64 wide) on a 40-wide stream: q_norm and k_norm weigh 16 each, o_proj maps 64 back to 40.
      {"qwen3",
       R"({"vocab_size": 512, "hidden_size": 40, "intermediate_size": 72, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "rope_theta": 1000000.0, "tie_word_embeddings": false,
        "use_sliding_window": false, "max_position_embeddings": 512, "bos_token_id": 1, "eos_token_id": 2})"},
      {"mistral",
       R"({"vocab_size": 512, "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 2, "num_attention_heads": 6,
        "num_key_value_heads": 3, "sliding_window": 64, "max_position_embeddings": 512, "rope_theta": 250000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "bos_token_id": 1, "eos_token_id": 2})"},
      // Grouped-query attention in one qkv_proj (6 heads, 2 KV heads: outputs 48 + 2 x 16), gate_up_proj [gate | up].
      {"phi3",
       R"({"vocab_size": 512, "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 2, "num_attention_heads": 6,
        "num_key_value_heads": 2, "sliding_window": 40, "max_position_embeddings": 512,
        "original_max_position_embeddings": 512, "rope_theta": 1000000.0, "bos_token_id": 1, "eos_token_id": 2,
        "pad_token_id": 0})"}};
  for (const auto& [family, config] : families) {
    CAPTURE(family);
    auto model = llama_family_against_transformers(family, config, dir / family);
    CHECK(model->config().rope_theta == (family == "mistral" ? 250000.0 : 1000000.0));
    CHECK(model->config().qk_norm == (family == "qwen3"));
    CHECK(model->config().stacked_projections == (family == "phi3"));
    CHECK(model->config().sliding_layers() == (family == "qwen3" ? 0 : family == "qwen2" ? 1 : 2));
  }
  // Mistral's window of 64 (its logits at 300 positions are transformers'): the same logits when the 300 tokens go
  // through the KV cache in pieces, and a packed row of two examples longer than the window gives each its own.
  auto mistral = ht::load_llama(dir / "mistral" / "model");
  torch::NoGradGuard no_grad;
  mistral->eval();
  const auto ids = torch::tensor(long_sequence, torch::kLong).unsqueeze(0);
  const auto whole = mistral->forward(ids);
  auto cache = mistral->make_cache(1, 300);
  std::vector<torch::Tensor> pieces;
  for (auto [begin, length] : {std::pair{0, 100}, std::pair{100, 1}, std::pair{101, 70}, std::pair{171, 129}})
    pieces.push_back(mistral->forward(ids.narrow(1, begin, length), &cache));
  CHECK((torch::cat(pieces, 1) - whole).abs().max().item<double>() < 1e-4);
  const auto first = ids.narrow(1, 0, 130), second = ids.narrow(1, 130, 170);
  const auto positions = torch::cat({torch::arange(130), torch::arange(170)}).unsqueeze(0);
  const auto documents = torch::cat({torch::zeros({130}), torch::ones({170})}).to(torch::kInt32).unsqueeze(0);
  const auto packed = mistral->forward(ids, ht::TokenLayout{positions, documents});
  CHECK((packed.narrow(1, 0, 130) - mistral->forward(first)).abs().max().item<double>() < 1e-4);
  CHECK((packed.narrow(1, 130, 170) - mistral->forward(second)).abs().max().item<double>() < 1e-4);
  // The same weights without the window give other logits beyond it: the checks above could fail.
  auto config = ht::read_llama_config(dir / "mistral" / "model");
  config.sliding_window.reset();
  ht::Llama unwindowed(config);
  const auto weights = mistral->named_parameters();
  for (auto& parameter : unwindowed->named_parameters()) parameter.value().copy_(weights[parameter.key()]);
  unwindowed->eval();
  CHECK((unwindowed->forward(first) - mistral->forward(first)).abs().max().item<double>() > 1e-3);
}

TEST_CASE(
    "Gemma (norms by 1 + weight, scaled embeddings, GeGLU), Gemma 2 (norms after attention and MLP, soft-capped "
    "attention and logits, a query scale of its own, alternating windows) and Gemma 3 text (query and key norms, "
    "the sliding layers on a rope base of their own, the global ones scaled) made by transformers give the same "
    "logits at 300 positions and 32 greedy tokens here, export back to their own model_type, and Gemma 2's caps and "
    "window hold in packed rows",
    "[models][oracle][families]") {
  const auto dir = scratch("gemma-oracle");
  const std::vector<std::pair<std::string, std::string>> families{
      {"gemma",
       R"({"vocab_size": 512, "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512, "rope_theta": 20000.0})"},
      // Caps low enough that the scores and logits of these random weights reach them (Gemma 2's own: 50 and 30);
      // layers 0 and 2 slide (every other from the first), within a window shorter than generation's 44 tokens.
      {"gemma2",
       R"({"vocab_size": 512, "hidden_size": 40, "intermediate_size": 72, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "query_pre_attn_scalar": 24, "sliding_window": 24,
        "attn_logit_softcapping": 4.0, "final_logit_softcapping": 6.0, "max_position_embeddings": 512})"},
      // Layers 0 and 1 slide on base 10000, layer 2 (every third) is global on 1e6 with linear scaling.
      {"gemma3_text",
       R"({"vocab_size": 512, "hidden_size": 40, "intermediate_size": 72, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 16, "query_pre_attn_scalar": 20, "sliding_window": 32,
        "sliding_window_pattern": 3, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "max_position_embeddings": 512})"}};
  for (const auto& [family, config] : families) {
    CAPTURE(family);
    auto model = llama_family_against_transformers(family, config, dir / family);
    const auto& read = model->config();
    CHECK(read.unit_offset_norms);
    CHECK(read.scaled_embeddings);
    CHECK(read.hidden_act == "gelu_pytorch_tanh");
    CHECK(read.sandwich_norms == (family != "gemma"));
    CHECK(read.qk_norm == (family == "gemma3_text"));
    CHECK(read.sliding_layers() == (family == "gemma" ? 0 : 2));
    CHECK(read.final_logit_softcapping == (family == "gemma2" ? std::optional<double>(6.0) : std::nullopt));
    CHECK(read.local_rope_theta == (family == "gemma3_text" ? std::optional<double>(10000.0) : std::nullopt));
  }
  // Gemma 2 in a packed row of two examples longer than its window (12 + 32 and 20 tokens) against transformers'
  // eager attention with a 4-D mask, and through the KV cache in pieces.
  auto gemma2 = ht::load_llama(dir / "gemma2" / "model");
  torch::NoGradGuard no_grad;
  gemma2->eval();
  std::vector<std::int64_t> ids, positions, documents;
  for (std::int64_t i = 0; i < 64; ++i) {
    ids.push_back(long_sequence[static_cast<std::size_t>(i)]);
    positions.push_back(i < 44 ? i : i - 44);
    documents.push_back(i < 44 ? 0 : 1);
  }
  run_oracle(fmt::format("expect-packed '{}' {} {} {} '{}'", (dir / "gemma2" / "model").string(), ids_text(ids),
                         ids_text(positions), ids_text(documents), (dir / "gemma2" / "packed").string()),
             dir / "gemma2" / "packed.log");
  const auto row = torch::tensor(ids, torch::kLong).unsqueeze(0);
  const auto packed = gemma2->forward(row, ht::TokenLayout{torch::tensor(positions, torch::kLong).unsqueeze(0),
                                                           torch::tensor(documents, torch::kInt32).unsqueeze(0)});
  const auto theirs = ht::safetensors::File(dir / "gemma2" / "packed" / "logits.safetensors").tensor("logits");
  CHECK((packed - theirs).abs().max().item<double>() < 1e-4);
  const auto whole = gemma2->forward(row);
  auto cache = gemma2->make_cache(1, 64);
  std::vector<torch::Tensor> pieces;
  for (auto [begin, length] : {std::pair{0, 30}, std::pair{30, 1}, std::pair{31, 33}})
    pieces.push_back(gemma2->forward(row.narrow(1, begin, length), &cache));
  CHECK((torch::cat(pieces, 1) - whole).abs().max().item<double>() < 1e-4);
  // Without its caps the same weights give other logits: the checks above could fail.
  auto config = ht::read_llama_config(dir / "gemma2" / "model");
  config.attn_logit_softcapping.reset();
  ht::Llama uncapped(config);
  const auto weights = gemma2->named_parameters();
  for (auto& parameter : uncapped->named_parameters()) parameter.value().copy_(weights[parameter.key()]);
  uncapped->eval();
  CHECK((uncapped->forward(row) - whole).abs().max().item<double>() > 1e-3);
}
