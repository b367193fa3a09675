// The GPU step's rewrites of a Llama block, checked against the block as transformers computes it (CPU): rotary
// embeddings with their closed-form backward (models/kernels/rotary.hpp) and the projections of one input as one matrix
// product (models/kernels/fused_projections.hpp), with grouped-query attention, with Qwen2's q/k/v biases, under
// selective recomputation and under bf16 autocast.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <hpctrain/models/models.hpp>
#include <hpctrain/train/precision.hpp>

#include "block_step_support.hpp"

namespace hm = hpctrain::models;

namespace fused_projections_test {

using namespace block_step;

/// The fusion mode set while alive; what it was comes back after.
struct FusionMode : hm::ScopedSwitch<hm::FusedProjections> {
  explicit FusionMode(hm::FusedProjections mode)
      : ScopedSwitch(hm::set_fused_projections, hm::fused_projections, mode) {}
};

/// Every gradient of `b` within `bound` of `a`'s (relative L2 per tensor); returns the worst.
double worst_gradient_difference(const Step& a, const Step& b, double bound, const std::string& what) {
  REQUIRE(a.gradients.size() == b.gradients.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.gradients.size(); ++i) {
    CAPTURE(what, a.gradients[i].first);
    REQUIRE(a.gradients[i].first == b.gradients[i].first);
    REQUIRE(a.gradients[i].second.abs().max().item<double>() > 0);
    const double difference = relative_difference(b.gradients[i].second, a.gradients[i].second);
    CHECK(difference <= bound);
    worst = std::max(worst, difference);
  }
  return worst;
}

/// transformers' rotary embedding as autograd differentiates it.
torch::Tensor rotary_as_transformers(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const auto half = x.size(-1) / 2;
  return x * cos + torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1) * sin;
}

/// Whether `ours` is within one rounding of `reference` for a sum of two products whose magnitudes add to `scale`:
/// the closed form may fuse a multiply and an add (one rounding where autograd's kernels round twice), which moves
/// an element by at most an ulp of the larger term, 2^-23 of `scale` at most in fp32, twice that for room.
bool within_one_rounding(const torch::Tensor& ours, const torch::Tensor& reference, const torch::Tensor& scale) {
  return ((ours - reference).abs() <= scale * std::ldexp(1.0, -22)).all().item<bool>();
}

TEST_CASE(
    "Rotary embeddings with their closed-form backward equal autograd's within one rounding in fp32, and come closer "
    "to the exact gradient under bf16",
    "[models][rotary]") {
  torch::manual_seed(1);
  const auto angles = torch::arange(16, torch::kFloat32).unsqueeze(1) * torch::rand({1, 4}) * 3.0;
  const auto full = torch::cat({angles, angles}, -1);  // [T, D]: each angle for both halves, as transformers builds it
  const auto cos = full.cos(), sin = full.sin();
  const auto upstream = torch::randn({2, 3, 16, 8});
  const auto magnitudes = [&](const torch::Tensor& x) {  // |x·cos| + |rotate_half(x)·sin|
    return (x * cos).abs() + (rotary_as_transformers(x, torch::zeros_like(cos), sin)).abs();
  };

  auto x = torch::randn({2, 3, 16, 8}, torch::requires_grad());
  auto reference_x = x.detach().clone().requires_grad_(true);
  const auto y = hm::apply_rotary(x, cos, sin);
  const auto reference = rotary_as_transformers(reference_x, cos, sin);
  CHECK(within_one_rounding(y, reference, magnitudes(x.detach())));
  y.backward(upstream);
  reference.backward(upstream);
  // dx = g·cos + rotate_halfᵀ(g·sin): the magnitudes of its two terms are those of g rotated the other way.
  CHECK(within_one_rounding(x.grad(), reference_x.grad(), magnitudes(upstream)));
  WARN(fmt::format("fp32: output {:.2e}, input gradient {:.2e} apart (relative L2)", relative_difference(y, reference),
                   relative_difference(x.grad(), reference_x.grad())));

  // bf16 input (the projections' output under autocast), fp32 angles: the output is fp32 as before; the input's
  // gradient is rounded to bf16 once instead of three times, so it is at least as close to the exact one.
  auto half_x = torch::randn({2, 3, 16, 8}).to(torch::kBFloat16).requires_grad_(true);
  auto half_reference_x = half_x.detach().clone().requires_grad_(true);
  const auto half_y = hm::apply_rotary(half_x, cos, sin);
  CHECK(half_y.scalar_type() == torch::kFloat32);
  CHECK(within_one_rounding(half_y, rotary_as_transformers(half_reference_x, cos, sin),
                            magnitudes(half_x.detach().to(torch::kFloat32))));
  half_y.backward(upstream);
  rotary_as_transformers(half_reference_x, cos, sin).backward(upstream);
  auto exact_x = half_x.detach().to(torch::kFloat64).requires_grad_(true);
  rotary_as_transformers(exact_x, cos.to(torch::kFloat64), sin.to(torch::kFloat64))
      .backward(upstream.to(torch::kFloat64));
  const double ours = relative_difference(half_x.grad(), exact_x.grad());
  const double autograds = relative_difference(half_reference_x.grad(), exact_x.grad());
  WARN(fmt::format("bf16 input: gradient {:.2e} from the exact one (autograd's formulation: {:.2e})", ours, autograds));
  CHECK(ours <= std::ldexp(1.0, -8));
  CHECK(ours <= autograds * 1.0001);

  // Under autocast the output is written in bf16 (what attention would cast it to), in x's layout; the gradient
  // arriving in bf16 gives what the fp32 output's path gives for the same upstream values.
  const auto strided_x = torch::randn({2, 16, 3, 8}).to(torch::kBFloat16).transpose(1, 2);  // [B, H, T, D] view
  auto cast_x = strided_x.detach().requires_grad_(true);
  auto plain_x = strided_x.detach().clone().requires_grad_(true);
  torch::Tensor cast_y;
  {
    hpctrain::AutocastScope autocast(hpctrain::Precision::bf16, torch::Device(torch::kCPU));
    cast_y = hm::apply_rotary(cast_x, cos, sin);
  }
  const auto plain_y = hm::apply_rotary(plain_x, cos, sin);
  CHECK(cast_y.scalar_type() == torch::kBFloat16);
  CHECK(cast_y.strides() == strided_x.strides());
  // Both round the same sum to bf16: equal here, but another CPU's kernel for a bf16 output may fuse the multiply-add
  // differently (one fp32 rounding, 2^-22 of the terms' magnitudes as above), and a value that near a bf16 tie
  // may round the other way: one bf16 step, 2^-8 of the magnitudes.
  const auto bf16_step = [&](const torch::Tensor& ours, const torch::Tensor& reference, const torch::Tensor& scale) {
    return ((ours.to(torch::kFloat32) - reference.to(torch::kFloat32)).abs() <= scale * std::ldexp(1.0, -8))
        .all()
        .item<bool>();
  };
  const auto reference_y = plain_y.detach().to(torch::kBFloat16);
  CHECK(bf16_step(cast_y, reference_y, magnitudes(strided_x.to(torch::kFloat32))));
  const auto bf16_upstream = upstream.to(torch::kBFloat16);
  cast_y.backward(bf16_upstream);
  plain_y.backward(bf16_upstream.to(torch::kFloat32));
  CHECK(bf16_step(cast_x.grad(), plain_x.grad(), magnitudes(bf16_upstream.to(torch::kFloat32))));
  WARN(fmt::format("under autocast: bf16 output {} elements of {} off the fp32 path's rounding, input gradient {}",
                   cast_y.ne(reference_y).sum().item<long>(), cast_y.numel(),
                   cast_x.grad().ne(plain_x.grad()).sum().item<long>()));
}

TEST_CASE(
    "Projections of one input fused into one matrix product give the separate products' loss and gradients: "
    "Llama (GQA) and Qwen2's q/k/v biases, fp32",
    "[models][fused]") {
  for (const bool bias : {false, true}) {
    torch::manual_seed(3);
    hm::Llama model(tiny_llama(0.0, bias));
    torch::manual_seed(7);
    const auto ids = torch::randint(vocabulary, {batch, sequence + 1}, torch::kLong);
    Step separate, fused;
    {
      FusionMode never(hm::FusedProjections::never);
      separate = step(*model, ids, hpctrain::Precision::fp32);
    }
    {
      FusionMode always(hm::FusedProjections::always);
      fused = step(*model, ids, hpctrain::Precision::fp32);
    }
    const std::string what = bias ? "Qwen2 layout (q/k/v biases)" : "Llama";
    // A block: q, k, v one product instead of three, gate and up one instead of two; each product runs once
    // forward and twice backward (input and weight gradients).
    CHECK(separate.products - fused.products == 2 * 3 * 3);
    const double loss = std::abs(fused.loss - separate.loss) / separate.loss;
    CHECK(loss <= fp32_bound);
    const double worst = worst_gradient_difference(separate, fused, fp32_bound, what);
    WARN(fmt::format("{}, fp32: loss {:.2e}, gradients {:.2e} apart; bound {:.2e}", what, loss, worst, fp32_bound));
  }
}

TEST_CASE(
    "Under bf16 autocast the projections are fused by default, within bf16's rounding of the separate products, "
    "and selective recomputation replays the fused product",
    "[models][fused][bf16]") {
  torch::manual_seed(5);
  hm::Llama model(tiny_llama(0.0));
  torch::manual_seed(9);
  const auto ids = torch::randint(vocabulary, {batch, sequence + 1}, torch::kLong);
  Step separate;
  {
    FusionMode never(hm::FusedProjections::never);
    separate = step(*model, ids, hpctrain::Precision::bf16);
  }
  REQUIRE(hm::fused_projections() == hm::FusedProjections::under_autocast);
  const auto fused = step(*model, ids, hpctrain::Precision::bf16);
  const double loss = std::abs(fused.loss - separate.loss) / separate.loss;
  CHECK(loss <= bf16_bound);
  const double worst = worst_gradient_difference(separate, fused, bf16_bound, "bf16 autocast");
  CHECK(separate.products - fused.products == 2 * 3 * 3);
  const auto selective = step(*model, ids, hpctrain::Precision::bf16, hm::Recompute::selective);
  CHECK(selective.loss == fused.loss);
  CHECK(selective.products == fused.products);  // the fused product is replayed, not computed again
  const double replayed = worst_gradient_difference(fused, selective, bf16_bound, "selective, fused");
  WARN(
      fmt::format("bf16 autocast: fused against separate: loss {:.2e}, gradients {:.2e}; selective against fused "
                  "{:.2e}; bound {:.2e}",
                  loss, worst, replayed, bf16_bound));
}

TEST_CASE("Projections of one input where one carries a LoRA adapter stay separate, while gate and up are still fused",
          "[models][fused][lora]") {
  auto model = tiny_llama_with_lora(11);
  torch::manual_seed(13);
  const auto ids = torch::randint(vocabulary, {batch, sequence + 1}, torch::kLong);
  Step separate, fused;
  {
    FusionMode never(hm::FusedProjections::never);
    separate = step(*model, ids, hpctrain::Precision::fp32);
  }
  {
    FusionMode always(hm::FusedProjections::always);  // q, k, v separate (q and v adapted); gate and up fused
    fused = step(*model, ids, hpctrain::Precision::fp32);
  }
  CHECK(std::abs(fused.loss - separate.loss) / separate.loss <= fp32_bound);
  // gate and up only, in both blocks: one product fewer forward and one backward (the base weights are frozen
  // under LoRA: no weight gradient).
  CHECK(separate.products - fused.products == 2 * 2);
  const double worst = worst_gradient_difference(separate, fused, fp32_bound, "LoRA q_proj, v_proj");
  WARN(fmt::format("LoRA on q_proj and v_proj, fp32: adapters' and all gradients {:.2e} apart", worst));
}

}  // namespace fused_projections_test
