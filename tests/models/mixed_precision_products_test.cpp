// The projections' gradients written in fp32 by the products under autocast
// (models/kernels/mixed_precision_products.hpp), checked on the CPU: against the exact gradients of the same bf16
// operands (fp64), against autograd's casts (the switch off), in a Llama step (the cast nodes it removes, fused and
// separate projections, Qwen2's biases, selective recomputation, LoRA).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <hpctrain/models/models.hpp>
#include <hpctrain/train/precision.hpp>

#include "block_step_support.hpp"

namespace hm = hpctrain::models;

namespace mixed_precision_products_test {

using namespace block_step;

/// The fp32 product gradients switched while alive: on the CPU too (`everywhere`, the arithmetic of the CUDA path,
/// checked here), or autograd's casts (`nowhere`).
struct ProductGradients : hm::ScopedSwitch<hm::WideProducts> {
  explicit ProductGradients(hm::WideProducts where)
      : ScopedSwitch(hm::set_fp32_product_gradients, hm::fp32_product_gradients, where) {}
};

/// Autograd's cast nodes (ToCopyBackward0) run by backward while alive.
struct CastNodeCount : OpCount {
  CastNodeCount() : OpCount({"ToCopyBackward0"}, at::RecordScope::BACKWARD_FUNCTION) {}
};

/// One projection's gradients under CPU bf16 autocast, for the upstream gradient `g`.
struct Gradients {
  torch::Tensor y, x, weight0, weight1, bias0, bias1;
};

Gradients projection_gradients(const torch::Tensor& x, const torch::Tensor& w0, const torch::Tensor& w1,
                               const torch::Tensor& b0, const torch::Tensor& b1, const torch::Tensor& g) {
  for (auto t : {x, w0, w1, b0, b1}) t.mutable_grad() = torch::Tensor();
  torch::Tensor y;
  {
    hpctrain::AutocastScope autocast(hpctrain::Precision::bf16, torch::Device(torch::kCPU));
    y = hm::projection(x, {w0, w1}, {b0, b1});
  }
  y.backward(g);
  return {y.detach(), x.grad(), w0.grad(), w1.grad(), b0.grad(), b1.grad()};
}

/// Whether every element of `t` is within `bound` of `exact`, with the worst |t - exact| / bound printed.
bool within(const torch::Tensor& t, const torch::Tensor& exact, const torch::Tensor& bound, const std::string& what) {
  const auto ratio = ((t.to(torch::kFloat64) - exact).abs() / bound).max().item<double>();
  WARN(fmt::format("{}: worst error {:.2f} of its bound", what, ratio));
  return ratio <= 1.0;
}

TEST_CASE(
    "A projection under bf16 autocast computes autocast's output and its gradients as fp32 sums of the bf16 "
    "operands' exact products, which autograd's casts round to bf16",
    "[models][bf16][products]") {
  const ProductGradients cuda_path(hm::WideProducts::everywhere);  // checked on the CPU
  torch::manual_seed(3);
  const std::int64_t in = 48, tokens = 2 * 7;
  const auto options = torch::TensorOptions().dtype(torch::kFloat32).requires_grad(true);
  const auto x = torch::randn({2, 7, in}, options), w0 = torch::randn({16, in}, options),
             w1 = torch::randn({8, in}, options), b0 = torch::randn({16}, options), b1 = torch::randn({8}, options);
  const auto g = torch::randn({2, 7, 24}).to(torch::kBFloat16);

  Gradients rounded;
  {
    ProductGradients off(hm::WideProducts::nowhere);
    rounded = projection_gradients(x, w0, w1, b0, b1, g);
  }
  const auto ours = projection_gradients(x, w0, w1, b0, b1, g);
  CHECK(torch::equal(ours.y, rounded.y));  // the forward is autocast's, bit for bit
  for (const auto& t : {ours.x, ours.weight0, ours.weight1, ours.bias0, ours.bias1})
    CHECK(t.scalar_type() == torch::kFloat32);

  // The exact gradients of the bf16 operands the product saw: fp64 sums of products of bf16 values.
  const auto narrow = [](const torch::Tensor& t) { return t.detach().to(torch::kBFloat16).to(torch::kFloat64); };
  const auto g2 = g.reshape({tokens, 24}).to(torch::kFloat64);
  const auto w = torch::cat({narrow(w0), narrow(w1)}), x2 = narrow(x).reshape({tokens, in});
  const auto exact_x = g2.mm(w).reshape({2, 7, in}), exact_w = g2.t().mm(x2), exact_b = g2.sum(0);
  // A sum of n terms in fp32 is within n · 2^-24 of the sum of their magnitudes (the classic γ_n bound; each product
  // of two bf16 values is exact in fp32).
  const auto bound = [](std::int64_t n, const torch::Tensor& magnitudes) {
    return magnitudes * (static_cast<double>(n) * std::ldexp(1.0, -24)) + 1e-30;
  };
  const auto x_bound = bound(24, g2.abs().mm(w.abs()).reshape({2, 7, in}));
  const auto w_bound = bound(tokens, g2.abs().t().mm(x2.abs()));
  const auto b_bound = bound(tokens, g2.abs().sum(0));
  CHECK(within(ours.x, exact_x, x_bound, "input gradient"));
  CHECK(within(torch::cat({ours.weight0, ours.weight1}), exact_w, w_bound, "weight gradients"));
  CHECK(within(torch::cat({ours.bias0, ours.bias1}), exact_b, b_bound, "bias gradients"));
  // Autograd's casts: the bf16 products' results rounded (2^-9 relative), far outside the fp32 sums' bound.
  const auto relative = [](const torch::Tensor& t, const torch::Tensor& exact) {
    return (t.to(torch::kFloat64) - exact).norm().item<double>() / exact.norm().item<double>();
  };
  const double ours_w = relative(torch::cat({ours.weight0, ours.weight1}), exact_w);
  const double rounded_w = relative(torch::cat({rounded.weight0, rounded.weight1}), exact_w);
  CHECK(rounded_w > 10 * ours_w);
  WARN(
      fmt::format("weight gradients, relative to exact: {:.1e} (fp32 from the products) against {:.1e} (cast from "
                  "bf16); input gradient {:.1e} against {:.1e}",
                  ours_w, rounded_w, relative(ours.x, exact_x), relative(rounded.x, exact_x)));
}

TEST_CASE(
    "By default a projection on the CPU under bf16 autocast is autocast's own bf16 product (the CPU's bf16 kernels), "
    "its logits bf16 as transformers' eager model computes them",
    "[models][bf16][products]") {
  torch::manual_seed(5);
  const auto x = torch::randn({5, 12}, torch::requires_grad()), w = torch::randn({6, 12}, torch::requires_grad());
  REQUIRE(hm::fp32_product_gradients() == hm::WideProducts::where_fused);
  hpctrain::AutocastScope autocast(hpctrain::Precision::bf16, torch::Device(torch::kCPU));
  CHECK_FALSE(hm::detail::mixed_precision_product(x, w, {}));
  CHECK(hm::head_projection(x, w).scalar_type() == torch::kBFloat16);
  CHECK(torch::equal(hm::projection(x, w, {}), torch::linear(x, w)));
}

TEST_CASE(
    "Without autocast, with the switch off, and for parameters already in autocast's dtype, a projection is "
    "at::linear as before",
    "[models][bf16][products]") {
  const ProductGradients cuda_path(hm::WideProducts::everywhere);  // checked on the CPU
  torch::manual_seed(4);
  const auto x = torch::randn({5, 12}, torch::requires_grad()), w = torch::randn({6, 12}, torch::requires_grad());
  {
    hpctrain::AutocastScope autocast(hpctrain::Precision::bf16, torch::Device(torch::kCPU));
    CHECK(hm::detail::mixed_precision_product(x, w, {}));
    {
      ProductGradients off(hm::WideProducts::nowhere);
      CHECK_FALSE(hm::detail::mixed_precision_product(x, w, {}));
    }
    const auto narrow_w = w.detach().to(torch::kBFloat16).requires_grad_();
    CHECK_FALSE(hm::detail::mixed_precision_product(x, narrow_w, {}));  // nothing to cast (ZeRO-3's bf16 blocks)
    torch::NoGradGuard no_grad;
    CHECK_FALSE(hm::detail::mixed_precision_product(x, w, {}));  // no gradient wanted (a selective forward)
  }
  CHECK_FALSE(hm::detail::mixed_precision_product(x, w, {}));  // fp32 training
  CHECK(torch::equal(hm::projection(x, w, {}), torch::linear(x, w)));
}

TEST_CASE(
    "In a Llama step under bf16 autocast the projections' gradients come without autograd's cast nodes, within "
    "bf16's rounding of the casts' gradients, with Qwen2's biases, fused or separate, and under selective "
    "recomputation",
    "[models][bf16][products]") {
  const ProductGradients cuda_path(hm::WideProducts::everywhere);  // checked on the CPU
  for (const bool bias : {false, true}) {
    for (const auto fusion : {hm::FusedProjections::under_autocast, hm::FusedProjections::never}) {
      const std::string what = fmt::format("{}, {}", bias ? "Qwen2 layout" : "Llama",
                                           fusion == hm::FusedProjections::never ? "separate" : "fused");
      CAPTURE(what);
      const hm::ScopedSwitch fused(hm::set_fused_projections, hm::fused_projections, fusion);
      torch::manual_seed(21);
      hm::Llama model(tiny_llama(0.0, bias));
      torch::manual_seed(22);
      const auto ids = torch::randint(vocabulary, {batch, sequence + 1}, torch::kLong);
      Step rounded, ours, selective;
      long rounded_casts = 0, our_casts = 0;
      {
        ProductGradients off(hm::WideProducts::nowhere);
        CastNodeCount casts;
        rounded = step(*model, ids, hpctrain::Precision::bf16);
        rounded_casts = casts.value();
      }
      {
        CastNodeCount casts;
        ours = step(*model, ids, hpctrain::Precision::bf16);
        our_casts = casts.value();
      }
      selective = step(*model, ids, hpctrain::Precision::bf16, hm::Recompute::selective);
      const auto exact = step(*model, ids, hpctrain::Precision::fp32);
      // Per block, the 7 weights' casts, the normalised inputs' (once per fused group, or once per projection of
      // q, k, v, gate, up: autocast caches only leaves' casts), and Qwen2's 3 biases'; then the head's weight, its
      // input and its logits' widening for the loss (models::head_projection writes them in fp32).
      const long inputs = fusion == hm::FusedProjections::never ? 5 : 2;
      const long per_block = 7 + inputs + (bias ? 3 : 0);
      CHECK(rounded_casts - our_casts == per_block * 2 + 3);
      // The blocks' forward is autocast's; the logits are not rounded to bf16 before the loss.
      const double loss = std::abs(ours.loss - rounded.loss) / rounded.loss;
      CHECK(loss <= bf16_bound);
      CHECK(ours.products == rounded.products);
      double worst = 0, ours_from_fp32 = 0, rounded_from_fp32 = 0;  // the last two: the mean over the tensors
      for (std::size_t i = 0; i < ours.gradients.size(); ++i) {
        CAPTURE(ours.gradients[i].first);
        const double difference =
            block_step::relative_difference(ours.gradients[i].second, rounded.gradients[i].second);
        CHECK(difference <= bf16_bound);
        worst = std::max(worst, difference);
        CHECK(ours.gradients[i].second.scalar_type() == torch::kFloat32);
        const auto n = static_cast<double>(ours.gradients.size());
        ours_from_fp32 += block_step::relative_difference(ours.gradients[i].second, exact.gradients[i].second) / n;
        rounded_from_fp32 +=
            block_step::relative_difference(rounded.gradients[i].second, exact.gradients[i].second) / n;
      }
      // The recomputation replays the same products through the same node: the same gradients, bit for bit.
      CHECK(selective.loss == ours.loss);
      CHECK(selective.products == ours.products);
      bool equal = true;
      for (std::size_t i = 0; i < ours.gradients.size(); ++i)
        equal = equal && torch::equal(selective.gradients[i].second, ours.gradients[i].second);
      CHECK(equal);
      WARN(fmt::format(
          "{}: {} -> {} cast nodes in backward; loss {:.2e} and gradients {:.2e} from the rounded ones "
          "(bound {:.2e}); from the fp32 step {:.2e}, the rounded ones {:.2e} (mean over tensors); "
          "selective recomputation equal: {}",
          what, rounded_casts, our_casts, loss, worst, bf16_bound, ours_from_fp32, rounded_from_fp32, equal));
    }
  }
}

TEST_CASE("Under LoRA the frozen base products give the input's gradient in fp32 and the adapters train as before",
          "[models][bf16][products][lora]") {
  const ProductGradients cuda_path(hm::WideProducts::everywhere);  // checked on the CPU
  auto model = tiny_llama_with_lora(31);
  torch::manual_seed(32);
  const auto ids = torch::randint(vocabulary, {batch, sequence + 1}, torch::kLong);
  Step rounded;
  {
    ProductGradients off(hm::WideProducts::nowhere);
    rounded = step(*model, ids, hpctrain::Precision::bf16);
  }
  const auto ours = step(*model, ids, hpctrain::Precision::bf16);
  const auto selective = step(*model, ids, hpctrain::Precision::bf16, hm::Recompute::selective);
  CHECK(std::abs(ours.loss - rounded.loss) / rounded.loss <= bf16_bound);  // the logits are not rounded to bf16
  REQUIRE(ours.gradients.size() == rounded.gradients.size());
  REQUIRE(ours.gradients.size() == 2 * 2 * 2);  // lora_A and lora_B of q_proj and v_proj in 2 blocks
  double worst = 0, replayed = 0;
  for (std::size_t i = 0; i < ours.gradients.size(); ++i) {
    CAPTURE(ours.gradients[i].first);
    const double difference = block_step::relative_difference(ours.gradients[i].second, rounded.gradients[i].second);
    CHECK(difference <= bf16_bound);
    worst = std::max(worst, difference);
    replayed =
        std::max(replayed, block_step::relative_difference(selective.gradients[i].second, ours.gradients[i].second));
  }
  CHECK(replayed <= bf16_bound);  // an adapted layer's replay (ReplayedLinear) keeps autograd's casts
  WARN(fmt::format("LoRA, bf16: adapters' gradients {:.2e} from the rounded ones, selective {:.2e}; bound {:.2e}",
                   worst, replayed, bf16_bound));
}

TEST_CASE(
    "A projection under bf16 autocast keeps the input's cast only for a weight that trains, and the weights' cast "
    "only for an input that wants its gradient",
    "[models][bf16][products][lora]") {
  const ProductGradients cuda_path(hm::WideProducts::everywhere);  // checked on the CPU
  // 4096 tokens of width 256 (x's cast: 2 MiB) through a 128 x 256 weight (its cast: 64 KiB): far apart, and each
  // far above the allocator's bookkeeping.
  const std::int64_t tokens = 4096, in = 256, out = 128;
  const auto x_cast = tokens * in * 2, weight_cast = out * in * 2;
  struct Case {
    bool x_trains, weight_trains;
    std::int64_t expected;
  };
  for (const auto& c :
       {Case{true, false, weight_cast}, Case{false, true, x_cast}, Case{true, true, x_cast + weight_cast}}) {
    CAPTURE(c.x_trains, c.weight_trains);
    torch::manual_seed(5);
    const auto x = torch::randn({8, tokens / 8, in}).requires_grad_(c.x_trains);
    const auto weight = torch::randn({out, in}).requires_grad_(c.weight_trains);
    torch::Tensor y;
    std::int64_t kept = 0;
    {
      hpctrain::AutocastScope autocast(hpctrain::Precision::bf16, torch::Device(torch::kCPU));
      hm::projection(x, weight, {}).sum().backward();  // first-call allocations (dispatch, threads) before measuring
      x.mutable_grad() = torch::Tensor();
      weight.mutable_grad() = torch::Tensor();
      const auto before = block_step::heap_in_use();
      y = hm::projection(x, weight, {});
      kept = block_step::heap_in_use() - before - y.numel() * y.element_size();
    }
    WARN(fmt::format("x {}, weight {}: kept {} bytes beyond the output (expected {})", c.x_trains ? "trains" : "frozen",
                     c.weight_trains ? "trains" : "frozen", kept, c.expected));
    if (block_step::heap_in_use() >= 0) CHECK(std::abs(kept - c.expected) < weight_cast / 2);
    y.sum().backward();  // the gradients that are asked for, of the right shapes
    CHECK(x.grad().defined() == c.x_trains);
    CHECK(weight.grad().defined() == c.weight_trains);
    if (c.x_trains) CHECK(x.grad().sizes() == x.sizes());
    if (c.weight_trains) CHECK(weight.grad().sizes() == weight.sizes());
  }
}

}  // namespace mixed_precision_products_test
