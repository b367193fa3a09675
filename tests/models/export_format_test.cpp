// The export's format without a strategy: shard sizes and dtypes as the knobs spell them, the shard plan
// (transformers' split), the writer that streams tensors into planned shards (and refuses one out of the plan),
// and a Llama written unit by unit equal to the whole model converted.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <hpctrain/models/models.hpp>

#include "models_test_support.hpp"

namespace hm = hpctrain::models;
namespace st = hpctrain::models::safetensors;
using models_test::read_text;
using models_test::scratch;

TEST_CASE("Shard sizes read as transformers' max_shard_size reads them", "[models][export]") {
  const auto [text, bytes] = GENERATE(table<std::string, std::uint64_t>({{"5GB", 5'000'000'000ull},
                                                                         {"500MB", 500'000'000ull},
                                                                         {"2GiB", 2ull << 30},
                                                                         {"100KB", 100'000ull},
                                                                         {"64KiB", 65536ull},
                                                                         {"12345", 12345ull},
                                                                         {"7B", 7ull}}));
  CAPTURE(text);
  CHECK(hm::parse_shard_size(text) == bytes);
}

TEST_CASE("A shard size that is not a positive size is refused", "[models][export]") {
  const auto text =
      GENERATE(as<std::string>{}, "", "0", "0GB", "5 GB", "5gb", "1.5GB", "GB", "-5GB", "99999999999999999999GB");
  CAPTURE(text);
  CHECK_FALSE(hm::parse_shard_size(text).has_value());
}

TEST_CASE("Export dtypes by their names and config.json's", "[models][export]") {
  CHECK(hm::export_dtype_from_name("bf16") == torch::kBFloat16);
  CHECK(hm::export_dtype_from_name("bfloat16") == torch::kBFloat16);
  CHECK(hm::export_dtype_from_name("fp16") == torch::kFloat16);
  CHECK(hm::export_dtype_from_name("float32") == torch::kFloat32);
  CHECK_FALSE(hm::export_dtype_from_name("int8").has_value());
  CHECK_FALSE(hm::export_dtype_from_name("").has_value());
  CHECK(hm::config_dtype_name(torch::kBFloat16) == "bfloat16");
}

TEST_CASE(
    "Shards are planned as transformers splits a state dict: a tensor opens a new shard when the current one would "
    "pass the limit",
    "[models][export]") {
  // 4-byte elements: 10, 10, 30 (larger than the limit: a shard of its own), 5, 5 and 5 elements against 80 bytes.
  std::vector<st::TensorSpec> specs;
  for (const auto& [name, numel] :
       std::vector<std::pair<std::string, std::int64_t>>{{"a", 10}, {"b", 10}, {"c", 30}, {"d", 5}, {"e", 5}, {"f", 5}})
    specs.push_back({name, st::Dtype::F32, {numel}});
  const auto plan = st::plan_shards(specs, 80);
  REQUIRE(plan.shards.size() == 3);
  CHECK(plan.shards[0].file == "model-00001-of-00003.safetensors");
  CHECK(plan.shards[0].tensors.size() == 2);  // a, b: 80 bytes
  CHECK(plan.shards[1].tensors.size() == 1);  // c: 120 bytes alone
  CHECK(plan.shards[2].tensors.size() == 3);  // d, e, f: 60 bytes
  CHECK(plan.total_bytes == 4 * 65);
  CHECK(st::plan_shards(specs, 1000).shards.front().file == "model.safetensors");
}

TEST_CASE("The shard writer converts each tensor to its planned dtype, and refuses a tensor out of the plan",
          "[models][export]") {
  const auto dir = scratch("shard-writer");
  const std::vector<st::TensorSpec> specs{{"x", st::Dtype::BF16, {3}}, {"y", st::Dtype::BF16, {2, 2}}};
  {
    st::ShardWriter writer(dir / "ok", st::plan_shards(specs, 6));  // 6 bytes: x alone, then y
    writer.append("x", torch::tensor({1.0f, 1.00390625f, -2.5f}));  // 1 + 2^-8 rounds to even: 1
    writer.append("y", torch::ones({2, 2}));
    writer.finish();
  }
  const st::Checkpoint checkpoint(dir / "ok");
  CHECK(checkpoint.tensor("x").scalar_type() == torch::kBFloat16);
  CHECK(torch::equal(checkpoint.tensor("x"), torch::tensor({1.0f, 1.0f, -2.5f}).to(torch::kBFloat16)));
  const auto index = nlohmann::json::parse(read_text(dir / "ok" / st::index_file_name));
  CHECK(index["metadata"]["total_size"] == 14);
  CHECK(index["weight_map"]["y"] == "model-00002-of-00002.safetensors");

  st::ShardWriter wrong(dir / "wrong", st::plan_shards(specs, 6));
  CHECK_THROWS_WITH(
      wrong.append("y", torch::ones({2, 2})),
      "[hpctrain.runtime.safetensors] " + (dir / "wrong").string() + ": tensor y: the plan's next tensor is x");
  CHECK_THROWS_WITH(wrong.append("x", torch::ones({4})), "[hpctrain.runtime.safetensors] " + (dir / "wrong").string() +
                                                             ": tensor x: shape 4 but the plan says 3");
  wrong.append("x", torch::ones({3}));
  CHECK_THROWS_WITH(wrong.finish(), "[hpctrain.runtime.safetensors] " + (dir / "wrong").string() +
                                        ": tensor y: not written: the export ended before it");
  CHECK_FALSE(std::filesystem::exists(dir / "wrong" / st::index_file_name));
}

TEST_CASE("A Llama written unit by unit, in bf16 shards, is the whole model rounded to bf16", "[models][export]") {
  hm::LlamaConfig config;
  config.vocab_size = 64;
  config.hidden_size = 32;
  config.intermediate_size = 64;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.max_position_embeddings = 16;
  config.tie_word_embeddings = false;
  torch::manual_seed(3);
  hm::Llama model(config);
  const auto dir = scratch("llama-by-units");
  // One unit a block, as a strategy would hand them out; then the rest.
  const auto whole = hm::whole_unit(*model);
  std::vector<hm::NamedUnit> units(2);
  for (const auto& item : whole) units[item.first.rfind("layers.", 0) == 0 ? 0 : 1].push_back(item);
  std::vector<hm::ParameterShape> order;
  for (const auto& unit : units)
    for (auto& shape : hm::shapes_of(unit)) order.push_back(std::move(shape));
  const auto files = hm::save_pretrained_by_units(*model, order,
                                                  [&](const hm::UnitVisitor& visit) {
                                                    for (const auto& unit : units) visit(unit);
                                                  },
                                                  dir, {torch::kBFloat16, 8192});
  CHECK(files.back() == std::string(st::index_file_name));
  const auto json = nlohmann::json::parse(read_text(dir / "config.json"));
  CHECK(json["torch_dtype"] == "bfloat16");
  CHECK(json["dtype"] == "bfloat16");
  auto loaded = hm::load_llama(dir, torch::kBFloat16);
  auto written = loaded->named_parameters();
  for (const auto& [name, tensor] : whole) {
    CAPTURE(name);
    CHECK(torch::equal(written[name], tensor.to(torch::kBFloat16)));
  }
}
