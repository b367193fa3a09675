// What a custom step reads from the library: data::tensors' named fields, row for row with the inputs, and
// masked_cross_entropy (train/losses.hpp) against PyTorch's own reduction: cross_entropy with ignore_index on the
// positions the mask drops is the same mean over the kept positions.
#include <catch2/catch.hpp>

#include "train_test_support.hpp"

#include <cmath>
#include <limits>
#include <string>

#include <hpctrain/train/data/source.hpp>
#include <hpctrain/train/losses.hpp>

TEST_CASE("data::tensors carries named fields row for row, and refuses a field of another length", "[batch]") {
  const auto inputs = torch::arange(12).reshape({6, 2}), targets = torch::arange(6) * 10;
  const auto mask = torch::tensor({0, 1, 0, 1, 1, 0}).to(torch::kFloat32);
  const auto dataset = hpctrain::data::tensors(inputs, targets, {{"loss_mask", mask}}).load();
  const auto batch = dataset->batch({4, 1, 5});
  CHECK(torch::equal(batch.inputs, torch::tensor({8, 9, 2, 3, 10, 11}).reshape({3, 2})));
  CHECK(torch::equal(batch.targets, torch::tensor({40, 10, 50})));
  CHECK(torch::equal(batch.field("loss_mask"), torch::tensor({1.0f, 1.0f, 0.0f})));

  CHECK_THROWS_WITH(hpctrain::data::tensors(inputs, targets, {{"loss_mask", mask.narrow(0, 0, 5)}}),
                    "[hpctrain.spec.data.tensors] data.tensors = field loss_mask [5]: must have one row per example, "
                    "as the inputs: 6");
  CHECK_THROWS_WITH(hpctrain::data::tensors(inputs, targets.narrow(0, 0, 4)),
                    "[hpctrain.spec.data.tensors] data.tensors = targets [4]: must have one row per example, as the "
                    "inputs: 6");
}

TEST_CASE("masked_cross_entropy is PyTorch's mean over the kept positions, in fp32, and 0 when none is kept",
          "[step]") {
  torch::manual_seed(3);
  const auto logits = torch::randn({4, 5, 11}), targets = torch::randint(11, {4, 5});
  const auto mask = torch::rand({4, 5}).gt(0.4).to(torch::kFloat32);
  const auto ignored = targets.masked_fill(mask.eq(0), -100);
  namespace F = torch::nn::functional;
  const auto reference = F::cross_entropy(logits.reshape({-1, 11}), ignored.reshape({-1}),
                                          F::CrossEntropyFuncOptions().ignore_index(-100));
  const auto loss = hpctrain::masked_cross_entropy(logits, targets, mask);
  // Both sum the same fp32 terms in their own order and divide once: at most one rounding per kept term, each
  // below float's epsilon relative to the loss.
  const double difference = std::abs(loss.item<double>() - reference.item<double>());
  const double bound = mask.sum().item<double>() * std::numeric_limits<float>::epsilon() * reference.item<double>();
  CAPTURE(loss.item<double>(), reference.item<double>(), difference, bound);
  CHECK(difference <= bound);

  const auto bf16 = hpctrain::masked_cross_entropy(logits.to(torch::kBFloat16), targets, mask);
  CHECK(bf16.scalar_type() == torch::kFloat32);  // the loss in fp32 whatever the forward's precision

  const auto none = hpctrain::masked_cross_entropy(logits, targets, torch::zeros({4, 5}));
  CHECK(none.item<double>() == 0.0);
}
