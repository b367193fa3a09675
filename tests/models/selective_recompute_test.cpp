// --activation-checkpointing none|selective|full on the models themselves (CPU, fp32 and bf16 autocast): selective
// recomputation gives the loss and every parameter's gradient of keeping every activation and of recomputing whole
// blocks, for Llama (grouped-query attention) and GPT-2, with dropout (its random state replayed), with LoRA, and
// under autocast; and its recomputation runs no matrix product a second time (counted at ATen's kernels).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <hpctrain/models/lora/lora.hpp>
#include <hpctrain/models/models.hpp>
#include <hpctrain/train/precision.hpp>

#include "block_step_support.hpp"

namespace hm = hpctrain::models;

namespace selective_recompute_test {

using namespace block_step;

hm::GPT2Config gpt2(double dropout) {
  hm::GPT2Config config;
  config.vocab_size = vocabulary;
  config.n_positions = 32;
  config.n_embd = 32;
  config.n_layer = 2;
  config.n_head = 4;
  config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = dropout;
  return config;
}

/// selective's loss equals none's (its forward computes the same), and each gradient is within `bound` of none's and
/// of full's; the worst measured difference is printed.
void check_against_none_and_full(hm::CausalLM& model, const std::string& what, hpctrain::Precision precision,
                                 double bound) {
  torch::manual_seed(7);
  const auto ids = torch::randint(vocabulary, {batch, sequence + 1}, torch::kLong);
  const auto none = step(model, ids, precision, hm::Recompute::none);
  const auto full = step(model, ids, precision, hm::Recompute::full);
  const auto selective = step(model, ids, precision, hm::Recompute::selective);
  CHECK(selective.loss == none.loss);
  CHECK(full.loss == none.loss);
  REQUIRE(selective.gradients.size() == none.gradients.size());
  double worst_none = 0, worst_full = 0;
  std::string worst_name;
  for (std::size_t i = 0; i < none.gradients.size(); ++i) {
    const auto& [name, expected] = none.gradients[i];
    CAPTURE(what, name);
    REQUIRE(selective.gradients[i].first == name);
    REQUIRE(expected.abs().max().item<double>() > 0);  // a gradient that is zero would compare nothing
    const double against_none = relative_difference(selective.gradients[i].second, expected);
    const double against_full = relative_difference(selective.gradients[i].second, full.gradients[i].second);
    CHECK(against_none <= bound);
    CHECK(against_full <= bound);
    if (against_none > worst_none) worst_none = against_none, worst_name = name;
    worst_full = std::max(worst_full, against_full);
  }
  WARN(fmt::format(
      "{}: selective's gradients against none's {:.2e} (worst: {}), against full's {:.2e}; bound {:.2e}; loss {} equal",
      what, worst_none, worst_name, worst_full, bound, selective.loss));
}

/// Every adapter on every projection, dropout on its input, and B made non-zero (B = 0 at the start gives A no
/// gradient, which would compare nothing).
void add_adapters(torch::nn::Module& model) {
  hm::LoraConfig lora;
  lora.r = 4;
  lora.dropout = 0.2;
  lora.targets = {"all-linear"};
  hm::apply_lora(model, lora);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters())
    if (item.key().find(".lora_B.") != std::string::npos) item.value().normal_(0.0, 0.1);
}

/// The matrix-product kernels one training step of `model` runs under `recompute` (fp32, no dropout: the attention
/// then runs CPU's flash kernel, which calls no ATen product).
long matrix_kernels_of_a_step(hm::CausalLM& model, hm::Recompute recompute) {
  torch::manual_seed(7);
  const auto ids = torch::randint(vocabulary, {batch, sequence + 1}, torch::kLong);
  return step(model, ids, hpctrain::Precision::fp32, recompute).products;
}

}  // namespace selective_recompute_test

using namespace selective_recompute_test;

TEST_CASE(
    "Selective recomputation gives none's loss and full's gradients: Llama with grouped-query attention and GPT-2, "
    "with dropout, fp32",
    "[models][checkpointing][selective]") {
  torch::manual_seed(3);
  hm::Llama llama_model(tiny_llama(0.1));
  check_against_none_and_full(*llama_model, "Llama (GQA, attention dropout 0.1)", hpctrain::Precision::fp32,
                              fp32_bound);
  hm::GPT2 gpt2_model(gpt2(0.1));
  check_against_none_and_full(*gpt2_model, "GPT-2 (dropout 0.1)", hpctrain::Precision::fp32, fp32_bound);
}

TEST_CASE(
    "Selective recomputation with LoRA on every projection, adapter dropout replayed, gives the adapters' gradients",
    "[models][checkpointing][selective][lora]") {
  torch::manual_seed(5);
  hm::Llama llama_model(tiny_llama(0.1));
  add_adapters(*llama_model);
  check_against_none_and_full(*llama_model, "Llama + LoRA (all-linear, dropout 0.2)", hpctrain::Precision::fp32,
                              fp32_bound);
  hm::GPT2 gpt2_model(gpt2(0.1));
  add_adapters(*gpt2_model);
  check_against_none_and_full(*gpt2_model, "GPT-2 + LoRA (all-linear, dropout 0.2)", hpctrain::Precision::fp32,
                              fp32_bound);
}

TEST_CASE("Selective recomputation under bf16 autocast gives none's loss and gradients within bf16's rounding",
          "[models][checkpointing][selective][bf16]") {
  torch::manual_seed(9);
  hm::Llama llama_model(tiny_llama(0.1));
  check_against_none_and_full(*llama_model, "Llama, bf16 autocast", hpctrain::Precision::bf16, bf16_bound);
  hm::GPT2 gpt2_model(gpt2(0.1));
  add_adapters(*gpt2_model);
  check_against_none_and_full(*gpt2_model, "GPT-2 + LoRA, bf16 autocast", hpctrain::Precision::bf16, bf16_bound);
}

TEST_CASE(
    "Selective recomputation runs no matrix product twice: a step runs as many product kernels as one keeping "
    "every activation, and full recomputation runs every block's projections once more",
    "[models][checkpointing][selective]") {
  torch::manual_seed(11);
  hm::Llama llama_model(tiny_llama(0.0));
  hm::GPT2 gpt2_model(gpt2(0.0));
  // Llama's 7 projections a block (no bias: matmul, one mm each), GPT-2's 4 (with bias: one addmm each).
  const std::vector<std::pair<hm::CausalLM*, long>> models{{llama_model.get(), 2 * 7}, {gpt2_model.get(), 2 * 4}};
  for (const auto& [model, projections] : models) {
    const long none = matrix_kernels_of_a_step(*model, hm::Recompute::none);
    const long selective = matrix_kernels_of_a_step(*model, hm::Recompute::selective);
    const long full = matrix_kernels_of_a_step(*model, hm::Recompute::full);
    WARN(fmt::format("matrix-product kernels in a step: none {}, selective {}, full {} ({} projections in the blocks)",
                     none, selective, full, projections));
    CHECK(none > 0);
    CHECK(selective == none);
    CHECK(full - none == projections);
  }
}

TEST_CASE("A selective block whose recomputation computes other products than its forward is refused by name",
          "[models][checkpointing][selective]") {
  torch::manual_seed(13);
  torch::nn::Linear layer(8, 8), other(8, 4);
  const auto x = torch::randn({3, 8}, torch::requires_grad());
  bool forward_done = false;
  auto block = [&](const torch::Tensor& input) {
    auto y = hm::linear(layer, input);
    if (forward_done) y = hm::linear(other, y).sum(-1, true).expand({3, 8});  // a product the forward did not make
    forward_done = true;
    return y;
  };
  auto output = hm::checkpointed(block, x, {}, hm::Recompute::selective);
  CHECK_THROWS_WITH(output.sum().backward(),
                    Catch::Contains("[hpctrain.runtime.recompute]") && Catch::Contains("more matrix products"));
}
