// Issue 19: the RoBERTa encoder against transformers' RobertaForMaskedLM — logits of a right-padded batch with
// its attention mask (fp32, 1e-4), the masked-LM loss, a trained export that transformers loads with our
// logits, config errors naming the field, and a truncated checkpoint naming the file.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/lm/loss.hpp>
#include <hpctrain/models/roberta.hpp>

#include "models_test_support.hpp"

namespace hm = hpctrain::models;

TEST_CASE(
    "A RobertaForMaskedLM made by transformers gives the same logits on a padded batch and the same MLM loss, "
    "and its trained export loads back in transformers",
    "[models][oracle][roberta]") {
  const auto dir = models_test::scratch("roberta-oracle");
  const std::string config = R"({"vocab_size": 400, "hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
    "intermediate_size": 96, "max_position_embeddings": 40, "type_vocab_size": 1, "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2})";
  models_test::run_python("roberta_oracle.py", fmt::format("make '{}' '{}'", config, dir.string()), dir / "make.log");
  auto model = hm::load_roberta(dir / "model");
  model->eval();
  const hm::safetensors::File batch(dir / "batch.safetensors");
  const auto ids = batch.tensor("input_ids").to(torch::kLong), mask = batch.tensor("attention_mask").to(torch::kLong);
  const auto labels = batch.tensor("labels").to(torch::kLong);
  torch::NoGradGuard no_grad;
  const auto logits = model->forward(ids, mask);
  const auto theirs = hm::safetensors::File(dir / "logits.safetensors").tensor("logits");
  REQUIRE(logits.sizes() == theirs.sizes());
  CHECK((logits - theirs).abs().max().item<double>() < 1e-4);
  const double loss = hpctrain::lm::token_loss(logits, labels).item<double>();
  const double expected = nlohmann::json::parse(models_test::read_text(dir / "loss.json"))["loss"].get<double>();
  CHECK(loss == Approx(expected).epsilon(1e-5));

  {  // a few AdamW steps of MLM, then the export
    torch::GradMode::set_enabled(true);
    model->train();
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
    for (int step = 0; step < 5; ++step) {
      optimizer.zero_grad();
      hpctrain::lm::token_loss(model->forward(ids, mask), labels).backward();
      optimizer.step();
    }
    torch::GradMode::set_enabled(false);
  }
  model->eval();
  hm::save_pretrained(*model, dir / "export");
  models_test::run_python(
      "roberta_oracle.py",
      fmt::format("expect '{}' '{}' '{}'", (dir / "export").string(), dir.string(), (dir / "export-oracle").string()),
      dir / "expect.log");
  const auto after = hm::safetensors::File(dir / "export-oracle" / "logits.safetensors").tensor("logits");
  CHECK((model->forward(ids, mask) - after).abs().max().item<double>() < 1e-4);
  CHECK((model->forward(ids, mask) - logits).abs().max().item<double>() > 1e-3);  // training moved it

  // A truncated model.safetensors: an error naming the file.
  const auto truncated = dir / "truncated";
  std::filesystem::create_directories(truncated);
  std::filesystem::copy_file(dir / "export" / "config.json", truncated / "config.json");
  const auto size = std::filesystem::file_size(dir / "export" / "model.safetensors");
  std::filesystem::copy_file(dir / "export" / "model.safetensors", truncated / "model.safetensors");
  std::filesystem::resize_file(truncated / "model.safetensors", size / 2);
  CHECK_THROWS_WITH(hm::load_roberta(truncated), Catch::Contains((truncated / "model.safetensors").string()));
}

TEST_CASE("RoBERTa's config names the field of a bad value, and positions count from padding_idx + 1",
          "[models][roberta]") {
  CHECK_THROWS_WITH(
      hm::RobertaConfig::from_json(nlohmann::json::parse(R"({"model_type": "roberta", "num_attention_heads": 5})")),
      "[hpctrain.spec.roberta.num_attention_heads] roberta.num_attention_heads = 5: must divide hidden_size = 768");
  CHECK_THROWS_WITH(hm::RobertaConfig::from_json(nlohmann::json::parse(
                        R"({"model_type": "roberta", "position_embedding_type": "relative_key"})")),
                    "[hpctrain.spec.roberta.position_embedding_type] roberta.position_embedding_type = relative_key: "
                    "only \"absolute\" is supported");
  hm::RobertaConfig config;
  const auto positions = hm::roberta_position_ids(torch::tensor({{0, 5, 6, 2, 1, 1}}, torch::kLong), config);
  CHECK(positions.equal(torch::tensor({{2, 3, 4, 5, 1, 1}}, torch::kLong)));
  CHECK(hm::RobertaConfig::from_json(nlohmann::json::parse(R"({"model_type": "bert"})")).type_vocab_size == 2);
}
