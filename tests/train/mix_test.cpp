// Issue 56, item 4: several sources mixed by weight (train/data/mix.hpp) — exact shares an epoch, each source read
// a pass at a time in a new order, a pure function of (seed, epoch, slot) — and the positions a checkpoint keeps.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include <hpctrain/train/checkpoint/checkpoint_format.hpp>
#include <hpctrain/train/data/mix.hpp>

namespace data = hpctrain::data;
using Catch::Matchers::Contains;

TEST_CASE("A keyed permutation is a bijection for any size", "[mix]") {
  for (const std::int64_t n : {1, 2, 3, 5, 17, 64, 1000, 4097}) {
    std::set<std::int64_t> seen;
    for (std::int64_t i = 0; i < n; ++i) seen.insert(data::detail::permuted(i, n, 0xABCDEFull + n));
    INFO("n = " << n);
    CHECK(static_cast<std::int64_t>(seen.size()) == n);
    CHECK(*seen.rbegin() == n - 1);
  }
  // Keyed: another key, another order.
  std::vector<std::int64_t> a, b;
  for (std::int64_t i = 0; i < 100; ++i)
    a.push_back(data::detail::permuted(i, 100, 1)), b.push_back(data::detail::permuted(i, 100, 2));
  CHECK(a != b);
}

TEST_CASE("A mix gives each source its weight's share of an epoch, exactly", "[mix]") {
  const data::MixPlan plan({{"a", 100, 0.7}, {"b", 50, 0.3}, {"c", 7, 0.0001}}, 1);
  CHECK(plan.slots() == 157);
  // 157 × 0.7/1.0001 = 109.89 → 110; 157 × 0.3/1.0001 = 47.095 → 47; c: 0.0157 → 0.
  CHECK(plan.per_epoch() == std::vector<std::int64_t>{110, 47, 0});
  const data::MixPlan even({{"a", 3, 1}, {"b", 3, 1}, {"c", 3, 1}}, 1);
  CHECK(even.per_epoch() == std::vector<std::int64_t>{3, 3, 3});
  CHECK_THROWS_WITH(data::MixPlan({{"a.jsonl", 0, 1}, {"b", 3, 1}}, 1),
                    Contains("[hpctrain.spec.data.mix] a.jsonl") && Contains("keeps no example"));
  CHECK_THROWS_WITH(data::MixPlan({{"a.jsonl", 3, 0}}, 1), Contains("weight 0 must be positive"));
}

TEST_CASE("Each source is read a whole pass at a time, each pass in a new order, the same for the same seed", "[mix]") {
  // b: 50 rows, 45 slots an epoch: epochs 0..9 draw it 450 times, nine whole passes.
  const data::MixPlan plan({{"a", 100, 0.7}, {"b", 50, 0.3}}, 7);
  REQUIRE(plan.per_epoch() == std::vector<std::int64_t>{105, 45});
  std::vector<std::int64_t> draws;  // b's rows in draw order
  for (std::int64_t epoch = 0; epoch < 10; ++epoch)
    for (std::int64_t slot = 105; slot < 150; ++slot) {
      REQUIRE(plan.part_of(slot) == 1);
      draws.push_back(plan.row(epoch, slot));
    }
  std::vector<std::vector<std::int64_t>> passes;
  for (std::size_t pass = 0; pass < 9; ++pass) {
    std::vector<std::int64_t> rows(draws.begin() + 50 * pass, draws.begin() + 50 * (pass + 1));
    passes.push_back(rows);
    std::sort(rows.begin(), rows.end());
    std::vector<std::int64_t> every(50);
    for (std::int64_t i = 0; i < 50; ++i) every[i] = 100 + i;  // b's rows follow a's
    CHECK(rows == every);
  }
  CHECK(passes[0] != passes[1]);
  // a: 105 slots of 100 rows: epoch 0 reads all of a and 5 of its second pass.
  std::set<std::int64_t> a_rows;
  for (std::int64_t slot = 0; slot < 100; ++slot) a_rows.insert(plan.row(0, slot));
  CHECK(a_rows.size() == 100);
  CHECK(*a_rows.rbegin() == 99);
  // A pure function of the seed: another plan, the same rows; another seed, others.
  const data::MixPlan again({{"a", 100, 0.7}, {"b", 50, 0.3}}, 7), other({{"a", 100, 0.7}, {"b", 50, 0.3}}, 8);
  std::int64_t same = 0, differ = 0;
  for (std::int64_t slot = 0; slot < 150; ++slot) {
    same += plan.row(3, slot) == again.row(3, slot);
    differ += plan.row(3, slot) != other.row(3, slot);
  }
  CHECK(same == 150);
  CHECK(differ > 100);
}

TEST_CASE("A mixed dataset batches the rows its slots hold, and counts each source's position", "[mix]") {
  auto base = std::make_shared<data::TensorDataset>();
  base->inputs = torch::arange(8, torch::kInt64);
  base->targets = torch::arange(8, torch::kInt64);
  const data::MixedDataset mixed(base, {{"a", 5, 1}, {"b", 3, 3}}, 11);
  REQUIRE(mixed.size() == 8);
  REQUIRE(mixed.plan().per_epoch() == std::vector<std::int64_t>{2, 6});
  REQUIRE(mixed.mixture() == &mixed);
  const std::vector<std::int64_t> slots{0, 1, 2, 7};
  const auto batch = mixed.batch_in_epoch(slots, 4);
  for (std::size_t i = 0; i < slots.size(); ++i)
    CHECK(batch.inputs[i].item<std::int64_t>() == mixed.plan().row(4, slots[i]));
  CHECK(batch.inputs[0].item<std::int64_t>() < 5);   // a's rows
  CHECK(batch.inputs[2].item<std::int64_t>() >= 5);  // b's rows
  // Two epochs done, then slots 0, 2 and 3 of the third: a at 2 × 2 + 1, b at 2 × 6 + 2.
  CHECK(mixed.plan().positions(2, {0, 2, 3}) == std::vector<std::int64_t>{5, 14});
}

TEST_CASE("A checkpoint keeps a mix's positions in meta.json, checked on reading", "[mix][checkpoint]") {
  hpctrain::CheckpointMeta meta;
  meta.state = {12, 1, 5, 3, {{"a.parquet", 100, 0.7, 130}, {"b.jsonl", 50, 0.3, 61}}};
  meta.strategy = "replicated";
  const auto read = hpctrain::detail::parse_checkpoint_meta(meta.to_json().dump(), "meta.json");
  CHECK((read.state.data_sources == meta.state.data_sources));
  // One source: no field at all, as before.
  meta.state.data_sources.clear();
  CHECK_FALSE(meta.to_json().contains("data_sources"));
  CHECK(hpctrain::detail::parse_checkpoint_meta(meta.to_json().dump(), "meta.json").state.data_sources.empty());
  auto bad = meta.to_json();
  bad["data_sources"] = {{{"name", "a"}, {"rows", 3}, {"weight", 1}, {"position", -1}}};
  CHECK_THROWS_WITH(hpctrain::detail::parse_checkpoint_meta(bad.dump(), "meta.json"),
                    Contains("field 'position' is -1, outside"));
  bad["data_sources"] = {{{"name", 5}, {"rows", 3}, {"weight", 1}, {"position", 1}}};
  CHECK_THROWS_WITH(hpctrain::detail::parse_checkpoint_meta(bad.dump(), "meta.json"), Contains("not a string"));
  bad["data_sources"] = "a";
  CHECK_THROWS_WITH(hpctrain::detail::parse_checkpoint_meta(bad.dump(), "meta.json"), Contains("not an array"));
}
