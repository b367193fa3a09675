// The runtime-compiled kernels' inputs and arithmetic, checked on the CPU where the kernels themselves cannot run
// (they are CUDA's; the GPU suite's switches.fused_rotary and switches.fused_swiglu run them against the composite
// paths): the rotary angles' bf16 pairs, and the kernels' formulas over those inputs, broadcast as the jiterator
// broadcasts them, evaluated here with tensor operations against the composite rotary embeddings.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <hpctrain/models/nvrtc_kernels.hpp>
#include <hpctrain/models/rotary.hpp>
#include <hpctrain/models/scoped_switch.hpp>
#include <hpctrain/models/swiglu.hpp>

namespace hm = hpctrain::models;

namespace runtime_kernels_test {

/// The rotary kernels' formula over their inputs as models::detail::rotary_kernel passes them (x's halves
/// [.., 1, D/2], the pairs [.., 2, D/2], the selector [2, 1]), in fp32: what each CUDA thread computes.
torch::Tensor rotary_formula(const torch::Tensor& x, const torch::Tensor& pairs, bool backward) {
  const auto half = x.size(-1) / 2;
  const auto a = x.narrow(-1, 0, half).unsqueeze(-2).to(torch::kFloat32);
  const auto b = x.narrow(-1, half, half).unsqueeze(-2).to(torch::kFloat32);
  const int sine = backward ? 4 : 2;
  const auto c = pairs[0].to(torch::kFloat32) + pairs[1].to(torch::kFloat32);
  const auto s = pairs[sine].to(torch::kFloat32) + pairs[sine + 1].to(torch::kFloat32);
  const auto first = hm::detail::first_half_selector(torch::TensorOptions().dtype(torch::kBFloat16)).ne(0);
  const auto y =
      backward ? torch::where(first, a * c + b * s, b * c - a * s) : torch::where(first, a * c - b * s, b * c + a * s);
  return y.flatten(-2);
}

}  // namespace runtime_kernels_test

TEST_CASE(
    "The rotary kernels' angle pairs hold cos and sin to 2^-16, and their formula is rotary's forward and "
    "backward",
    "[models][rotary]") {
  using runtime_kernels_test::rotary_formula;
  const std::int64_t batch = 2, heads = 3, tokens = 40, dim = 16;
  const auto frequencies = torch::pow(10000.0, -torch::arange(0, dim, 2) / double(dim));
  const auto half_angles = torch::arange(tokens).unsqueeze(-1) * frequencies;
  const auto angles = torch::cat({half_angles, half_angles}, -1);
  const auto cos = angles.cos(), sin = angles.sin();
  const auto pairs = hm::detail::rotary_kernel_angles(cos, sin, torch::kBFloat16);
  REQUIRE(pairs.sizes() == torch::IntArrayRef({6, tokens, 2, dim / 2}));
  CHECK(pairs.scalar_type() == torch::kBFloat16);
  // Each pair's sum is the fp32 value within bf16's rounding of bf16's rounding error: 2^-16 relative (2^-9 · 2^-9
  // with room), absolute near zero.
  const auto sum = [&](int i) { return (pairs[i].to(torch::kFloat32) + pairs[i + 1].to(torch::kFloat32)).flatten(-2); };
  const auto pair_error = [](const torch::Tensor& value, const torch::Tensor& exact) {
    return ((value - exact).abs() / (exact.abs() + 1e-30)).masked_fill(exact.abs() < 1e-30, 0).max().item<double>();
  };
  const double bound = std::ldexp(1.0, -16);
  const auto swapped = torch::cat({sin.narrow(-1, dim / 2, dim / 2), sin.narrow(-1, 0, dim / 2)}, -1);
  WARN(fmt::format("pairs' relative error: cos {:.1e}, sin {:.1e}, swapped sin {:.1e} (bound {:.1e})",
                   pair_error(sum(0), cos), pair_error(sum(2), sin), pair_error(sum(4), swapped), bound));
  CHECK(pair_error(sum(0), cos) <= bound);
  CHECK(pair_error(sum(2), sin) <= bound);
  CHECK(pair_error(sum(4), swapped) <= bound);

  // The formula against the composite path in fp32: x in q's layout ([B, T, H, D] transposed), a gradient g.
  torch::manual_seed(3);
  const auto x = torch::randn({batch, tokens, heads, dim}).transpose(1, 2);
  const auto g = torch::randn({batch, heads, tokens, dim});
  const auto forward = hm::apply_rotary(x, cos, sin);
  const auto backward_exact = hm::detail::rotate_half_transposed(g * sin) + g * cos;
  const auto forward_error = (rotary_formula(x, pairs, false) - forward).abs().max().item<double>();
  const auto backward_error = (rotary_formula(g, pairs, true) - backward_exact).abs().max().item<double>();
  // |x| < 6 and |cos|, |sin| <= 1: the angles' 2^-16 relative error moves a sum of two products by 12 · 2^-16.
  const double formula_bound = 12 * bound;
  WARN(fmt::format("formula against the composite path: forward {:.1e}, backward {:.1e} (bound {:.1e})", forward_error,
                   backward_error, formula_bound));
  CHECK(forward_error <= formula_bound);
  CHECK(backward_error <= formula_bound);
}

TEST_CASE("Without CUDA no runtime-compiled kernel runs, and the switch is process-wide", "[models][rotary][swiglu]") {
  const torch::Device cpu(torch::kCPU);
  CHECK_FALSE(hm::detail::runtime_kernels_possible(cpu));
  CHECK_FALSE(hm::detail::swiglu_kernels(cpu));
  CHECK_FALSE(hm::detail::rotary_kernels(cpu, torch::kBFloat16));
  CHECK(hm::runtime_kernels());
  {
    const hm::ScopedSwitch off(hm::set_runtime_kernels, hm::runtime_kernels, false);
    CHECK_FALSE(hm::runtime_kernels());
  }
  CHECK(hm::runtime_kernels());
  // Without kernels the angles carry no pairs: nothing is made that no kernel reads.
  const auto angles = hm::rotary_angles(torch::ones({2, 4}), torch::zeros({2, 4}), cpu);
  CHECK_FALSE(angles.kernel.pairs.defined());
}

TEST_CASE(
    "The row kernels' sources compile with NVRTC for sm_80 and sm_90, bf16 and fp16; one that does not names "
    "NVRTC's log",
    "[models][rotary][swiglu]") {
#if HPCTRAIN_NVRTC_KERNELS
  // No driver here: LibTorch's libcaffe2_nvrtc.so (which needs libcuda) cannot load, so the test loads NVRTC itself,
  // from the CUDA wheel beside torch/lib (scripts/setup's) or the CUDA toolkit.
  const auto torch_cpu = hm::detail::loaded_library_path("libtorch_cpu.so");
  REQUIRE_FALSE(torch_cpu.empty());
  const auto major = std::to_string(CUDA_VERSION / 1000);
  const std::vector<std::string> candidates{
      torch_cpu.substr(0, torch_cpu.rfind('/')) + "/../../nvidia/cu" + major + "/lib/libnvrtc.so." + major,
      "/usr/local/cuda/lib64/libnvrtc.so"};
  void* library = nullptr;
  for (const auto& candidate : candidates) {
    if (library == nullptr && std::filesystem::exists(candidate)) library = dlopen(candidate.c_str(), RTLD_NOW);
  }
  INFO("NVRTC looked for at " << candidates[0] << " and " << candidates[1]);
  REQUIRE(library != nullptr);
  const auto api = hm::detail::find_nvrtc_api();
  REQUIRE(api.compiler());
  const std::vector<std::pair<std::string, std::string>> sources{{"swiglu", hm::detail::swiglu_row_code},
                                                                 {"rotary", hm::detail::rotary_row_code}};
  for (const auto& [name, source] : sources) {
    for (const int fp16 : {0, 1}) {
      for (const int architecture : {80, 90}) {
        INFO(name << ", HPCTRAIN_FP16=" << fp16 << ", sm_" << architecture);
        const auto cubin =
            hm::detail::nvrtc_compile(api, hm::detail::row_kernel_preamble + source, name, architecture / 10,
                                      architecture % 10, {"HPCTRAIN_FP16=" + std::to_string(fp16)});
        CHECK(cubin.size() > 1000);
        CHECK(cubin.compare(0, 4,
                            "\x7f"
                            "ELF") == 0);  // a CUBIN is an ELF image
      }
    }
  }
  CHECK_THROWS_WITH(
      hm::detail::nvrtc_compile(api, "broken(", "broken_source", 9, 0, {}),
      Catch::Contains("NVRTC could not compile broken_source for sm_90") && Catch::Contains("broken_source(1): error"));
#else
  WARN("built without CUDA's and NVRTC's headers: the row kernels are not compiled in");
#endif
}

TEST_CASE(
    "Operands reach the row kernels as rows with a stride: a fused product's halves do, a transposed view does "
    "not, and the CPU never runs them",
    "[models][rotary][swiglu]") {
  const auto joined = torch::zeros({2, 5, 16});
  CHECK(hm::detail::row_stride(joined) == 16);
  CHECK(hm::detail::row_stride(joined.narrow(-1, 8, 8)) == 16);     // up's half of [B, T, 2 · width]
  CHECK(hm::detail::row_stride(joined[0].narrow(0, 1, 3)) == 16);   // a slice of one batch row's tokens
  CHECK(hm::detail::row_stride(joined.narrow(1, 1, 3)) == -1);      // slices of two: rows of two strides
  CHECK(hm::detail::row_stride(joined.transpose(1, 2)) == -1);      // a last dimension that is not contiguous
  CHECK(hm::detail::row_stride(joined[0][0]) == 16);                // one row
  CHECK(hm::detail::row_stride(torch::zeros({4, 3, 1, 8})) == -1);  // a middle size of 1: not asked to collapse
  CHECK_FALSE(hm::detail::row_kernels_possible(torch::Device(torch::kCPU), torch::kBFloat16, true));
  CHECK_FALSE(hm::detail::swiglu_rows_usable({joined, joined}));
  CHECK_FALSE(hm::detail::rotary_rows_usable(torch::zeros({1, 2, 4, 8}), torch::ones({4, 8}), torch::ones({4, 8})));
}
