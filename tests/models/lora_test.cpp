// Issue 18: LoRA adapters in PEFT's format, both ways, against PyPI's peft: our adapter loaded by
// PeftModel.from_pretrained gives our logits, merge_and_unload equals our merged export, and an adapter PEFT
// made loads here with its logits. Plus what LoRA freezes and how it starts (B = 0: the base model's output).
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/models/lora/lora.hpp>
#include <hpctrain/models/models.hpp>
#include <hpctrain/train/precision.hpp>
#include <hpctrain/train/strategies/replicated.hpp>  // hold_frozen_in_compute_dtype

#include "models_test_support.hpp"

namespace hm = hpctrain::models;

namespace {
const std::vector<std::int64_t> ids{5, 17, 300, 42, 9, 250, 1, 77, 128, 3};
std::string ids_text() { return fmt::format("{}", fmt::join(ids, ",")); }
torch::Tensor logits_of(hm::CausalLM& model) {
  torch::NoGradGuard no_grad;
  model.eval();
  return model.forward(torch::tensor(ids, torch::kLong).unsqueeze(0));
}
double max_difference(const torch::Tensor& a, const torch::Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  return (a - b).abs().max().item<double>();
}
const char* const llama_config =
    R"({"vocab_size": 384, "hidden_size": 40, "intermediate_size": 72, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 40000.0, "tie_word_embeddings": false})";
}  // namespace

TEST_CASE("LoRA freezes the base, starts from the base model's output, and trains only the adapters",
          "[models][lora]") {
  torch::manual_seed(3);
  hm::LlamaConfig config;
  config.vocab_size = 384, config.hidden_size = 32, config.intermediate_size = 48, config.num_hidden_layers = 2;
  config.num_attention_heads = 4;
  hm::Llama model(config);
  const auto before = logits_of(*model);
  hm::LoraConfig lora;
  lora.r = 4;
  lora.targets = {"q_proj", "v_proj"};
  const auto adapters = hm::apply_lora(*model, lora);
  CHECK(adapters == 2 * 2 * (4 * 32 + 32 * 4));  // 2 layers × (q, v) × (A + B)
  std::int64_t trainable = 0;
  for (const auto& item : model->named_parameters()) {
    CAPTURE(item.key());
    CHECK(item.value().requires_grad() == hm::is_lora_parameter(item.key()));
    if (item.value().requires_grad()) trainable += item.value().numel();
  }
  CHECK(trainable == adapters);
  CHECK(max_difference(logits_of(*model), before) == 0.0);  // B = 0
  hm::LoraConfig nothing;
  nothing.targets = {"no_such_layer"};
  hm::Llama other(config);
  CHECK_THROWS_WITH(hm::apply_lora(*other, nothing), Catch::Contains("[hpctrain.spec.lora.targets]"));
  hm::LoraConfig bad;
  bad.r = 0;
  CHECK_THROWS_WITH(bad.validate(), "[hpctrain.spec.lora.r] lora.r = 0: must be at least 1");
}

TEST_CASE("Our LoRA adapter loads in PEFT with our logits, and our merged export equals merge_and_unload (Llama)",
          "[models][lora][oracle]") {
  const auto dir = models_test::scratch("lora-oracle");
  models_test::run_oracle(fmt::format("make llama '{}' '{}' {}", llama_config, dir.string(), ids_text()),
                          dir / "make.log");
  // [snippet peft_round_trip]
  auto model = hm::load_llama(dir / "model");  // a Hugging Face directory (config.json, model.safetensors)
  hm::LoraConfig lora;
  lora.r = 4, lora.alpha = 8, lora.targets = {"q_proj", "v_proj", "down_proj"};
  hm::apply_lora(*model, lora);  // the base frozen; A Kaiming-uniform, B zero, as PEFT initialises them
  // Stands in for training here: B random, so that the adapter changes the logits.
  {
    torch::NoGradGuard no_grad;
    torch::manual_seed(9);
    for (auto& item : model->named_parameters())
      if (item.key().find(".lora_B.") != std::string::npos) item.value().normal_(0, 0.05);
  }
  hm::save_peft_adapter(*model, dir / "adapter", lora, (dir / "model").string(), hm::hf_names(*model), false);

  auto reloaded = hm::load_llama(dir / "model");  // later, elsewhere: the base again, the adapter over it
  hm::load_peft_adapter(*reloaded, dir / "adapter", hm::hf_names(*reloaded));
  hm::merge_lora(*reloaded);  // folded into the weights: a plain model, as merge_and_unload() gives
  hm::save_pretrained(*reloaded, dir / "merged");
  // [end snippet]
  const auto ours = logits_of(*model);
  REQUIRE(std::filesystem::exists(dir / "adapter" / "adapter_model.safetensors"));
  CHECK(max_difference(logits_of(*reloaded), ours) < 1e-5);  // the adapter read back and merged computes the same
  models_test::run_python("lora_oracle.py",
                          fmt::format("expect '{}' '{}' {} '{}'", (dir / "model").string(), (dir / "adapter").string(),
                                      ids_text(), (dir / "peft").string()),
                          dir / "expect.log");
  const auto theirs = hm::safetensors::File(dir / "peft" / "logits.safetensors").tensor("logits");
  CHECK(max_difference(ours, theirs) < 1e-4);

  const hm::safetensors::File merged(dir / "merged" / "model.safetensors"),
      peft_merged(dir / "peft" / "merged.safetensors");
  for (const auto* name : {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.v_proj.weight",
                           "model.layers.1.mlp.down_proj.weight"}) {
    CAPTURE(name);
    CHECK(max_difference(merged.tensor(name), peft_merged.tensor(name)) < 1e-6);
  }
}

TEST_CASE("An adapter made by PEFT loads here with PEFT's logits", "[models][lora][oracle]") {
  const auto dir = models_test::scratch("lora-from-peft");
  models_test::run_oracle(fmt::format("make llama '{}' '{}' {}", llama_config, dir.string(), ids_text()),
                          dir / "make.log");
  models_test::run_python(
      "lora_oracle.py", fmt::format("make '{}' {} '{}'", (dir / "model").string(), ids_text(), (dir / "peft").string()),
      dir / "peft.log");
  auto model = hm::load_llama(dir / "model");
  const auto config = hm::load_peft_adapter(*model, dir / "peft" / "adapter", hm::hf_names(*model));
  CHECK(config.r == 4);
  CHECK(config.alpha == 12);
  const auto theirs = hm::safetensors::File(dir / "peft" / "logits.safetensors").tensor("logits");
  CHECK(max_difference(logits_of(*model), theirs) < 1e-4);
}

TEST_CASE("A merge at the end of a bf16 run folds B A in fp32: under autocast as without it", "[models][lora]") {
  // The export runs inside the bf16 run's autocast; the merged weight must still be W + s B A of the fp32 adapter (what
  // PEFT's merge_and_unload computes), not a bf16 product (2^-8 of the update apart).
  torch::manual_seed(5);
  const auto w = torch::randn({24, 16}), a = torch::randn({4, 16}), b = torch::randn({24, 4});
  const hm::NamedUnit unit{{"q_proj.weight", w}, {"q_proj.lora_A.weight", a}, {"q_proj.lora_B.weight", b}};
  const std::map<std::string, double> scalings{{"q_proj", 2.0}};
  const auto expected = w + 2.0 * torch::matmul(b.to(torch::kFloat64), a.to(torch::kFloat64)).to(torch::kFloat32);
  hm::NamedUnit merged;
  {
    hpctrain::AutocastScope autocast(hpctrain::Precision::bf16, torch::kCPU);
    merged = hm::merged_unit(unit, scalings);
  }
  REQUIRE(merged.size() == 1);
  CHECK(merged[0].second.scalar_type() == torch::kFloat32);
  CHECK(max_difference(merged[0].second, expected) < 1e-5);  // fp32 sums of 4 products of N(0, 1) values
}

TEST_CASE("Under bf16 LoRA's frozen embedding and head are held in bf16 with the loss and gradients of fp32 ones",
          "[models][lora]") {
  // A bf16 checkpoint's values (the weights rounded to bf16 first) are held exactly by an fp32 table and a bf16 one:
  // the embedding's rows widened to fp32 as they are looked up give the residual stream the fp32 table gave, and
  // autocast's product over the bf16 head is the one it computed over its bf16 cast of the fp32 head. So the loss
  // and the adapters' gradients are equal bit for bit, the edges (or the tied table) held in half the bytes.
  const bool tied = GENERATE(false, true);
  CAPTURE(tied);
  const auto make = [tied] {
    torch::manual_seed(11);
    hm::LlamaConfig config;
    config.vocab_size = 384, config.hidden_size = 32, config.intermediate_size = 48, config.num_hidden_layers = 2;
    config.num_attention_heads = 4, config.num_key_value_heads = 2, config.tie_word_embeddings = tied;
    hm::Llama model(config);
    hm::LoraConfig lora;
    lora.r = 4;
    lora.targets = {"q_proj", "v_proj", "down_proj"};
    hm::apply_lora(*model, lora);
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) {
      auto& parameter = item.value();
      // B = 0 would leave A's gradient zero: B drawn too, from the same generator in both models.
      if (item.key().find("lora_B") != std::string::npos) parameter.normal_(0.0, 0.02);
      parameter.copy_(parameter.to(torch::kBFloat16).to(torch::kFloat32));
    }
    return model;
  };
  const auto frozen = [](const torch::Tensor& parameter) { return !parameter.requires_grad(); };
  auto held = make(), fp32_edges = make();
  hpctrain::detail::hold_frozen_in_compute_dtype(*held, hpctrain::Precision::bf16);
  hpctrain::detail::modules_to_bf16(fp32_edges->blocks(), frozen);  // the blocks as held, the edges not
  CHECK(held->embedding_widened());
  CHECK_FALSE(fp32_edges->embedding_widened());
  for (const auto& item : held->named_parameters()) {
    CAPTURE(item.key());
    // The frozen blocks and edges in bf16; the adapters and the final norm (neither a block nor an edge) in fp32.
    const bool narrow = !item.value().requires_grad() && item.key() != "norm.weight";
    CHECK(item.value().scalar_type() == (narrow ? torch::kBFloat16 : torch::kFloat32));
  }
  CHECK(fp32_edges->head_weight().scalar_type() == torch::kFloat32);
  CHECK(held->head_weight().scalar_type() == torch::kBFloat16);

  const auto input = torch::randint(0, 384, {2, 12}, torch::kLong);
  const auto targets = torch::randint(0, 384, {2, 12}, torch::kLong);
  const auto loss_of = [&](hm::Llama& model) {
    hpctrain::AutocastScope autocast(hpctrain::Precision::bf16, torch::kCPU);
    const auto logits = model->forward(input);
    return torch::nn::functional::cross_entropy(logits.reshape({-1, 384}).to(torch::kFloat32), targets.reshape(-1));
  };
  const auto held_loss = loss_of(held), reference_loss = loss_of(fp32_edges);
  held_loss.backward();
  reference_loss.backward();
  CHECK(held_loss.item<float>() == reference_loss.item<float>());
  auto reference = fp32_edges->named_parameters();
  int adapters = 0;
  for (const auto& item : held->named_parameters()) {
    if (!item.value().requires_grad()) continue;
    CAPTURE(item.key());
    REQUIRE(item.value().grad().defined());
    CHECK(torch::equal(item.value().grad(), reference[item.key()].grad()));
    CHECK(item.value().grad().abs().sum().item<double>() > 0.0);
    ++adapters;
  }
  CHECK(adapters == 2 * 3 * 2);  // 2 layers × (q, v, down) × (A, B)
}
