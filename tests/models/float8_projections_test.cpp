// The projections in float8 with rowwise scales (models/kernels/float8_projections.hpp, `--float8`), checked on the
// CPU in the emulated mode, which quantises exactly as the CUDA path does (float8_rowwise is shared; only the
// product differs: at::_scaled_mm there, the dequantised operands' fp32 product here): the scales' arithmetic, one
// projection's output and gradients against the exact products of its bf16 operands, and a tiny Llama's training
// against bf16 from the same weights.
//
// The bounds come from e4m3 itself (1 sign, 4 exponent, 3 mantissa bits; normal from 2^-6 to 448, subnormals spaced
// 2^-9): rounding to nearest moves a scaled value in the normal range by at most half a unit in its last place,
// 2^-4 of the value (u below); a subnormal one by at most 2^-10. The power-of-two scale s of a row with largest
// magnitude amax lies in (224 / amax, 448 / amax], so 2^-10 / s < 2^-9 · amax / 448 unscaled (d below).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <hpctrain/models/models.hpp>
#include <hpctrain/train/precision.hpp>

#include "block_step_support.hpp"

namespace hm = hpctrain::models;

namespace float8_projections_test {

/// e4m3's relative rounding bound (3 mantissa bits: half a unit in the last place is 2^-4 of the value).
const double u = std::ldexp(1.0, -4);
/// A subnormal's rounding bound in the scaled domain, as a fraction of amax / 448 unscaled (see the header).
const double subnormal = std::ldexp(1.0, -9);

/// Each slice of `t` along `dim`'s largest magnitude, in fp64, kept as a dimension.
torch::Tensor amax(const torch::Tensor& t, std::int64_t dim) {
  return t.to(torch::kFloat64).abs().amax(dim, /*keepdim=*/true);
}

/// The float8 mode switched while alive.
struct Float8Mode : hm::ScopedSwitch<hm::Float8Projections> {
  explicit Float8Mode(hm::Float8Projections mode)
      : ScopedSwitch(hm::set_float8_projections, hm::float8_projections, mode) {}
};

TEST_CASE(
    "float8 rowwise scales are 448 over each row's amax rounded down to a power of two, finite for an all-zero row, "
    "what e4m3 holds round-trips exactly and the saturating cast clamps to 448",
    "[models][float8]") {
  // Rows: amax 3 (448/3 = 149.3 -> 128), amax 448 (1), amax 1000 (0.448 -> 0.25), all zero (448/1e-12 -> 2^48).
  const auto t = torch::tensor(
      {{3.0, -1.5, 0.25, 3.0 / 128}, {448.0, -1.0, 2.0, 0.0}, {1000.0, -500.0, 3.0, 0.0}, {0.0, 0.0, 0.0, 0.0}},
      torch::kFloat32);
  const auto scales = hm::float8_scales(t, 1);
  REQUIRE(scales.sizes() == torch::IntArrayRef({4, 1}));
  CHECK(scales.scalar_type() == torch::kFloat32);
  const std::vector<double> expected = {128.0, 1.0, 0.25, std::ldexp(1.0, 48)};
  for (std::int64_t row = 0; row < 4; ++row) {
    CAPTURE(row);
    CHECK(scales[row][0].item<double>() == expected[static_cast<std::size_t>(row)]);
  }
  // Along the columns: one scale per column, (1, N).
  const auto column_scales = hm::float8_scales(t, 0);
  CHECK(column_scales.sizes() == torch::IntArrayRef({1, 4}));
  CHECK(column_scales[0][0].item<double>() == 0.25);  // column amax 1000

  const auto quantised = hm::float8_rowwise(t, 1);
  CHECK(quantised.data.scalar_type() == torch::kFloat8_e4m3fn);
  const auto back = hm::dequantised(quantised);
  // Row 0 scaled is 384, -192, 32, 3: all e4m3 values, so it comes back exactly; so does row 1 (scale 1: 448, -1, 2).
  CHECK(torch::equal(back[0], t[0]));
  CHECK(torch::equal(back[1], t[1]));
  CHECK(torch::equal(back[3], t[3]));  // the all-zero row: zeros, nothing NaN
  CHECK(std::isfinite(scales[3][0].item<double>()));
  CHECK(torch::isfinite(back).all().item<bool>());
  // Row 2 at scale 1/4: 250 rounds to 256 (e4m3 values are 16 apart in [128, 256)), -125 to -128 (8 apart in [64,
  // 128)).
  CHECK(back[2][0].item<double>() == 1024.0);
  CHECK(back[2][1].item<double>() == -512.0);

  // Beyond ±448 a plain cast to e4m3fn gives NaN; the quantisation clamps first (torchao's to_fp8_saturated).
  const auto beyond = torch::tensor({500.0, -600.0, 448.0, 460.0}, torch::kFloat32);
  const auto saturated = hm::to_float8_saturated(beyond).to(torch::kFloat32);
  CHECK(torch::equal(saturated, torch::tensor({448.0, -448.0, 448.0, 448.0}, torch::kFloat32)));
  CHECK(torch::isnan(beyond.to(torch::kFloat8_e4m3fn).to(torch::kFloat32)[0]).item<bool>());
}

TEST_CASE(
    "float8 rowwise quantisation moves each value by at most e4m3's rounding: 2^-4 of it, or a subnormal's "
    "2^-9 amax / 448",
    "[models][float8]") {
  torch::manual_seed(5);
  // Rows of very different magnitudes, each spanning many binades, so that some values land among the subnormals.
  const auto magnitudes = torch::pow(10.0, torch::linspace(-6, 6, 32)).reshape({32, 1});
  const auto t = (torch::randn({32, 256}) * torch::exp(torch::randn({32, 256}) * 3) * magnitudes).to(torch::kFloat32);
  for (const std::int64_t dim : {0, 1}) {
    CAPTURE(dim);
    const auto back = hm::dequantised(hm::float8_rowwise(t, dim)).to(torch::kFloat64);
    const auto exact = t.to(torch::kFloat64);
    const auto bound = u * exact.abs() + subnormal * amax(t, dim) / hm::float8_e4m3_max;
    const auto ratio = ((back - exact).abs() / bound).max().item<double>();
    WARN(fmt::format("along dim {}: worst error {:.3f} of its bound", dim, ratio));
    CHECK(ratio <= 1.0);
    // Normal values alone: the relative bound 2^-4 itself.
    const auto scaled = exact.abs() * hm::float8_scales(t, dim).to(torch::kFloat64);
    const auto normal = scaled >= std::ldexp(1.0, -6);
    const auto relative = ((back - exact).abs() / exact.abs()).masked_select(normal).max().item<double>();
    CHECK(relative <= u);
  }
}

/// A bound on |â·b̂ - a·b| for a: M×K quantised by rows, b: K×N by columns (all fp64): with eₐ = u|a| + d·amax(a's
/// row), e_b likewise by b's column, |â - a| ≤ eₐ and |b̂ - b| ≤ e_b, so |âb̂ - ab| ≤ eₐ|b| + |a|e_b + eₐe_b summed
/// over K; then the fp32 accumulation of K terms (K · 2^-24 of Σ|â||b̂|) and the rounding of the result to `out`
/// (2^-8 for bf16, 2^-24 for fp32, of |exact| + the rest). Every product of the node writes bf16 (_scaled_mm's rowwise
/// output), the gradients widened after.
torch::Tensor product_bound(const torch::Tensor& a, const torch::Tensor& b, torch::ScalarType out) {
  const auto e_a = u * a.abs() + subnormal * amax(a, 1) / hm::float8_e4m3_max;
  const auto e_b = u * b.abs() + subnormal * amax(b, 0) / hm::float8_e4m3_max;
  const auto quantisation = e_a.mm(b.abs()) + a.abs().mm(e_b) + e_a.mm(e_b);
  const auto k = static_cast<double>(a.size(1));
  const auto accumulation = k * std::ldexp(1.0, -24) * (a.abs() + e_a).mm(b.abs() + e_b);
  const double rounding = out == torch::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -24);
  return quantisation + accumulation + rounding * (a.mm(b).abs() + quantisation + accumulation);
}

/// Whether every element of `t` is within `bound` of `exact`, the worst fraction of its bound printed.
bool within(const torch::Tensor& t, const torch::Tensor& exact, const torch::Tensor& bound, const std::string& what) {
  const auto ratio = ((t.to(torch::kFloat64) - exact).abs() / bound).max().item<double>();
  WARN(fmt::format("{}: worst error {:.3f} of its bound", what, ratio));
  return ratio <= 1.0;
}

TEST_CASE(
    "A float8 projection's output and gradients (emulated) are the exact products of its bf16 operands within "
    "e4m3's rounding of each operand, summed over the reduction, and the head stays bf16",
    "[models][float8]") {
  const Float8Mode float8(hm::Float8Projections::emulated);
  torch::manual_seed(11);
  const std::int64_t in = 64, tokens = 2 * 9;
  const auto options = torch::TensorOptions().dtype(torch::kFloat32).requires_grad(true);
  // Two weights fused into one product (q and k, or gate and up), as models::linears gives them.
  const auto x = torch::randn({2, 9, in}, options), w0 = torch::randn({32, in}, options),
             w1 = torch::randn({16, in}, options);
  const auto g = torch::randn({2, 9, 48}).to(torch::kBFloat16);
  torch::Tensor y;
  {
    hpctrain::AutocastScope autocast(hpctrain::Precision::bf16, torch::Device(torch::kCPU));
    y = hm::projection(x, {w0, w1}, {});
  }
  y.backward(g);
  CHECK(y.scalar_type() == torch::kBFloat16);
  CHECK(x.grad().scalar_type() == torch::kFloat32);  // widened in the node, as the bf16 node's
  CHECK(w0.grad().scalar_type() == torch::kFloat32);

  // The exact products of the operands the node quantises: autocast's bf16 casts, in fp64.
  const auto x64 = x.detach().reshape({tokens, in}).to(torch::kBFloat16).to(torch::kFloat64);
  const auto w64 = torch::cat({w0.detach(), w1.detach()}).to(torch::kBFloat16).to(torch::kFloat64);
  const auto g64 = g.reshape({tokens, 48}).to(torch::kFloat64);
  CHECK(within(y.reshape({tokens, 48}), x64.mm(w64.t()), product_bound(x64, w64.t(), torch::kBFloat16), "y = x·Wᵀ"));
  CHECK(within(x.grad().reshape({tokens, in}), g64.mm(w64), product_bound(g64, w64, torch::kBFloat16), "dx = g·W"));
  const auto dw = torch::cat({w0.grad(), w1.grad()});
  CHECK(within(dw, g64.t().mm(x64), product_bound(g64.t(), x64, torch::kBFloat16), "dW = gᵀ·x"));
  // Not bf16's result: float8 rounded the operands (bf16's would be within 2^-8 of exact, far inside the bound).
  CHECK_FALSE(torch::allclose(y.reshape({tokens, 48}).to(torch::kFloat64), x64.mm(w64.t()), 1e-2, 1e-2));

  // The head (models::head_projection) is not a block's projection: the same with the switch on and off.
  const auto hidden = torch::randn({tokens, in}), head = torch::randn({97, in}, options);
  torch::Tensor with_float8, without;
  {
    hpctrain::AutocastScope autocast(hpctrain::Precision::bf16, torch::Device(torch::kCPU));
    with_float8 = hm::head_projection(hidden, head).detach();
    const Float8Mode off(hm::Float8Projections::off);
    without = hm::head_projection(hidden, head).detach();
  }
  CHECK(torch::equal(with_float8, without));
}

TEST_CASE(
    "A tiny Llama trained 8 steps with float8 projections (emulated) keeps its losses within 2^-4 of bf16's from the "
    "same weights and batches, and both learn",
    "[models][float8]") {
  // Bound, generous and stated: one e4m3 rounding's worst relative error (2^-4) on the loss itself. Per product the
  // worst case is 2u + u² of Σ|a||b| (product_bound above), but rounding errors of random sign shrink as they add
  // up; torchao reports float8 rowwise loss curves within about 1% of bf16's at Llama 3 8B (docs/gpu.md). The
  // measured differences are printed beside it.
  using namespace block_step;
  const auto train = [](hm::Float8Projections mode) {
    const Float8Mode float8(mode);
    torch::manual_seed(31);
    hm::Llama model(tiny_llama(0.0));
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-3));
    torch::manual_seed(32);
    const auto ids = torch::randint(vocabulary, {8, batch, sequence + 1}, torch::kLong);
    std::vector<double> losses;
    for (std::int64_t step = 0; step < 8; ++step) {
      optimizer.zero_grad();
      torch::Tensor loss;
      {
        hpctrain::AutocastScope autocast(hpctrain::Precision::bf16, torch::Device(torch::kCPU));
        const auto batch_ids = ids[step % 2];  // two batches in turn: the loss falls on batches seen before
        const auto logits = model->forward(batch_ids.narrow(1, 0, sequence));
        loss = torch::nn::functional::cross_entropy(logits.reshape({-1, vocabulary}).to(torch::kFloat32),
                                                    batch_ids.narrow(1, 1, sequence).reshape({-1}));
      }
      loss.backward();
      optimizer.step();
      losses.push_back(loss.item<double>());
    }
    return losses;
  };
  const auto bf16 = train(hm::Float8Projections::off);
  const auto float8 = train(hm::Float8Projections::emulated);
  double worst = 0;
  bool differ = false;
  for (std::size_t step = 0; step < bf16.size(); ++step) {
    CAPTURE(step, bf16[step], float8[step]);
    const double relative = std::abs(float8[step] - bf16[step]) / bf16[step];
    worst = std::max(worst, relative);
    differ = differ || float8[step] != bf16[step];
    CHECK(relative <= u);
  }
  WARN(fmt::format("losses bf16 {:.4f} -> {:.4f}, float8 {:.4f} -> {:.4f}; worst relative difference {:.2e}",
                   bf16.front(), bf16.back(), float8.front(), float8.back(), worst));
  CHECK(differ);  // the float8 products ran
  CHECK(bf16.back() < bf16.front());
  CHECK(float8.back() < float8.front());
}

}  // namespace float8_projections_test
