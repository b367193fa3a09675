// The runtime-compiled kernels, checked on the CPU where they cannot run (they are CUDA's; the GPU suite's
// switches.fused_rotary, switches.fused_swiglu, switches.fused_rmsnorm and switches.cross_entropy_rows run them against
// the composite paths): their sources compile with
// NVRTC, a source that does not names NVRTC's log, operands reach them as rows only where they lie as rows, and
// without CUDA nothing but the composite paths runs.
#include <catch2/catch.hpp>

#include <filesystem>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include <hpctrain/models/kernels/cross_entropy_rows.hpp>
#include <hpctrain/models/kernels/nvrtc_kernels.hpp>
#include <hpctrain/models/kernels/rms_norm.hpp>
#include <hpctrain/models/kernels/rotary.hpp>
#include <hpctrain/models/kernels/scoped_switch.hpp>
#include <hpctrain/models/kernels/swiglu.hpp>

namespace hm = hpctrain::models;

TEST_CASE("Without CUDA no runtime-compiled kernel runs, and the switch is process-wide", "[models][rotary][swiglu]") {
  const torch::Device cpu(torch::kCPU);
  CHECK_FALSE(hm::detail::row_kernels_possible(cpu, torch::kBFloat16));
  CHECK_FALSE(hm::detail::cross_entropy_rows_usable(cpu, torch::kBFloat16));
  // RMSNorm of a bf16 row with a bf16 weight: the composite operations, bit for bit, gradients included.
  const auto x = torch::randn({6, 64}).to(torch::kBFloat16).requires_grad_(true);
  const auto weight = (1 + 0.1 * torch::randn({64})).to(torch::kBFloat16).requires_grad_(true);
  CHECK_FALSE(hm::detail::rms_norm_rows_usable(x, weight));
  const auto fused = hm::rms_norm(x, weight, 1e-5), composite = hm::detail::rms_norm_composite(x, weight, 1e-5);
  CHECK(torch::equal(fused, composite));
  CHECK(fused.grad_fn()->name() == composite.grad_fn()->name());
  CHECK(hm::runtime_kernels());
  {
    const hm::ScopedSwitch off(hm::set_runtime_kernels, hm::runtime_kernels, false);
    CHECK_FALSE(hm::runtime_kernels());
  }
  CHECK(hm::runtime_kernels());
}

TEST_CASE(
    "The row kernels' sources compile with NVRTC for sm_80 and sm_90, bf16 and fp16, and one that does not names "
    "NVRTC's log",
    "[models][rotary][swiglu][cross_entropy][rms_norm]") {
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
                                                                 {"rotary", hm::detail::rotary_row_code},
                                                                 {"cross_entropy", hm::detail::cross_entropy_row_code},
                                                                 {"rms_norm", hm::detail::rms_norm_row_code}};
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
  CHECK_FALSE(hm::detail::swiglu_rows_usable({joined, joined}));
  CHECK_FALSE(hm::detail::rotary_rows_usable(torch::zeros({1, 2, 4, 8}), torch::ones({4, 8}), torch::ones({4, 8})));
}

TEST_CASE("The RMSNorm row kernels cover a row of up to 32,768 columns in 1, 2 or 4 chunks of 8 a thread",
          "[models][rms_norm]") {
  const std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>> expected{
      {8, 256, 1},     {2048, 256, 1},  {2056, 256, 2},   {4096, 256, 2},  {8192, 256, 4},
      {11008, 512, 4}, {16384, 512, 4}, {28672, 1024, 4}, {32768, 1024, 4}};
  for (const auto& [width, threads, chunks] : expected) {
    INFO("width " << width);
    const auto launch = hm::detail::rms_norm_launch(width);
    REQUIRE(launch);
    CHECK(launch->threads == threads);
    CHECK(launch->chunks == chunks);
    CHECK(launch->threads * 8 * launch->chunks >= width);  // every column has a thread
  }
  CHECK_FALSE(hm::detail::rms_norm_launch(32776));
}
