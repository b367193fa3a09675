// Issue 56, item 4 (torch-free part): a --data value naming several sources mixed by weight.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <hpctrain/text/data_mix.hpp>

#include "text_test_support.hpp"

namespace tx = hpctrain::text;
using Catch::Matchers::Contains;

TEST_CASE("A --data value names one source, or several with their weights", "[data_mix]") {
  using Sources = std::vector<tx::WeightedData>;
  CHECK(tx::parse_data_mix("train.jsonl") == Sources{{"train.jsonl", {}}});
  CHECK(tx::parse_data_mix("a.parquet:0.7,b.jsonl:0.3") == Sources{{"a.parquet", 0.7}, {"b.jsonl", 0.3}});
  CHECK(tx::parse_data_mix("data/hub:3,more.jsonl:1e0") == Sources{{"data/hub", 3.0}, {"more.jsonl", 1.0}});
  // Without weights: concatenated (each weighs its rows); a colon not followed by a number belongs to the path.
  CHECK(tx::parse_data_mix("a.jsonl,b.jsonl") == Sources{{"a.jsonl", {}}, {"b.jsonl", {}}});
  CHECK(tx::parse_data_mix("run:v2/a.jsonl") == Sources{{"run:v2/a.jsonl", {}}});
  CHECK(tx::parse_data_mix("run:v2/a.jsonl:2,b.jsonl:1") == Sources{{"run:v2/a.jsonl", 2.0}, {"b.jsonl", 1.0}});
  CHECK(tx::data_mix_string({{"a.parquet", 0.7}, {"b.jsonl", 0.3}}) == "a.parquet:0.7,b.jsonl:0.3");
}

TEST_CASE("A file whose name holds commas and colons is one source when it exists", "[data_mix]") {
  const auto dir = text_test::cache_dir() / "data-mix";
  std::filesystem::create_directories(dir);
  const auto odd = dir / "a,b.jsonl:2";
  std::ofstream(odd) << "{\"text\": \"x\"}\n";
  CHECK(tx::parse_data_mix(odd.string()) == std::vector<tx::WeightedData>{{odd, {}}});
}

TEST_CASE("A bad mix is refused naming the entry", "[data_mix]") {
  CHECK_THROWS_WITH(tx::parse_data_mix("a.jsonl:0.7,b.jsonl"),
                    Contains("[hpctrain.spec.data.mix] --data entry 'b.jsonl'") && Contains("has no weight"));
  CHECK_THROWS_WITH(tx::parse_data_mix("a.jsonl:0,b.jsonl:1"),
                    Contains("--data entry 'a.jsonl:0'") && Contains("positive finite number"));
  CHECK_THROWS_WITH(tx::parse_data_mix("a.jsonl:-1,b.jsonl:1"), Contains("--data entry 'a.jsonl:-1'"));
  CHECK_THROWS_WITH(tx::parse_data_mix("a.jsonl:1e999,b.jsonl:1"), Contains("positive finite number"));
  CHECK_THROWS_WITH(tx::parse_data_mix("a.jsonl:1,,b.jsonl:1"),
                    Contains("--data entry ''") && Contains("names no file"));
  CHECK_THROWS_WITH(tx::parse_data_mix(":0.5,b.jsonl:1"), Contains("--data entry ':0.5'"));
}
