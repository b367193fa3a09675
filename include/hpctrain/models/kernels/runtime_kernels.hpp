#pragma once
// What every kernel compiled at run time shares (models/kernels/nvrtc_kernels.hpp compiles them;
// models/kernels/swiglu.hpp and models/kernels/rotary.hpp hold SwiGLU's and rotary embeddings'): a process-wide switch,
// and the probe that each kernel's user runs once on a small input against its composite path, so that a kernel that
// fails to compile, to launch or to agree is never used. set_runtime_kernels(false) keeps the composite paths on CUDA
// too (the GPU suite times both).
#include <cmath>
#include <exception>

#include <torch/torch.h>

namespace hpctrain::models {

namespace detail {
inline bool& runtime_kernels_switch() {
  static bool on = true;
  return on;
}
}  // namespace detail

/// Whether elementwise chains run as runtime-compiled CUDA kernels where they are available (process-wide; default
/// on). Off: LibTorch's operations, one kernel each.
inline void set_runtime_kernels(bool on) { detail::runtime_kernels_switch() = on; }
inline bool runtime_kernels() { return detail::runtime_kernels_switch(); }

namespace detail {

/// What a kernel family's probe answers for elements of `dtype` (bf16 or fp16), asked once per process and dtype:
/// `probe` (the kernels against their composite path on a small input, under NoGradGuard), false where it throws (a
/// kernel that does not compile, a launch that fails). Each caller's lambda is a type of its own, so each family
/// keeps its own answers.
template <typename Probe>
bool kernels_agree(c10::ScalarType dtype, Probe probe) {
  const auto ask = [&] {
    try {
      torch::NoGradGuard no_grad;
      return probe();
    } catch (const std::exception&) {
      return false;
    }
  };
  if (dtype == torch::kHalf) {
    static const bool fp16 = ask();
    return fp16;
  }
  static const bool bf16 = ask();
  return bf16;
}

/// Whether `fused` is within a few of bf16's rounding steps of `composite` everywhere (a probe's comparison: the
/// kernel rounds once, the composite operations after each).
inline bool close_to_composite(const torch::Tensor& fused, const torch::Tensor& composite) {
  if (fused.sizes() != composite.sizes()) return false;
  const auto a = fused.to(torch::kFloat32), b = composite.to(torch::kFloat32);
  return (a - b).abs().le(b.abs().mul(std::ldexp(1.0, -6)).add(1e-3)).all().item<bool>();
}

}  // namespace detail

}  // namespace hpctrain::models
