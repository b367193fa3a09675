#pragma once
// Elementwise CUDA kernels compiled at run time: a chain of elementwise operations (SwiGLU's silu and product,
// rotary's products and sum) as one kernel that reads its inputs once and rounds its result once, where LibTorch
// runs a kernel per operation with a rounded tensor between each. ATen's jiterator compiles them (NVRTC, the path
// behind torch.cuda.jiterator; cached per kernel and dtype after the first call) and launches them over a
// TensorIterator, with broadcasting and any strides.
//
// The jiterator is looked up in the running process (libtorch_cuda exports it), not linked: a program built
// against a LibTorch without CUDA, or not linked to libtorch_cuda, builds and runs the composite operations. Each
// kernel's user probes it once on a small input against its composite path (models/swiglu.hpp,
// models/rotary.hpp), so that a kernel that fails to compile or to agree is never used.
// set_runtime_kernels(false) keeps the composite paths on CUDA too (the GPU suite times both).
#include <cmath>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#if __has_include(<dlfcn.h>)
#include <dlfcn.h>
#endif

#include <c10/util/SmallVector.h>
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

/// ATen's jiterator entry point (ATen/cuda/jiterator.h: at::cuda::CompileAndLaunchKernel), or nullptr.
using JiteratorLaunch = c10::SmallVector<at::Tensor> (*)(const std::string& code, const std::string& kernel_name,
                                                         int outputs, const c10::SmallVector<at::Tensor>& inputs,
                                                         const c10::SmallVector<at::Scalar>& extra_arguments,
                                                         bool return_by_reference);
inline JiteratorLaunch jiterator() {
  static const JiteratorLaunch launch = [] {
#if __has_include(<dlfcn.h>)
    return reinterpret_cast<JiteratorLaunch>(
        dlsym(RTLD_DEFAULT,
              "_ZN2at4cuda22CompileAndLaunchKernelERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEES8_iRKN3c1011"
              "SmallVectorINS_6TensorELj6EEERKNSA_INS9_6ScalarELj1EEEb"));
#else
    return JiteratorLaunch{nullptr};
#endif
  }();
  return launch;
}

/// Whether a runtime-compiled kernel may run on `device`: CUDA, the switch on, the jiterator in the process.
inline bool runtime_kernels_possible(const torch::Device& device) {
  return device.is_cuda() && runtime_kernels() && jiterator() != nullptr;
}

/// The one output of `code`'s function template `name` (T name(T...): T the inputs' common dtype, whose arithmetic
/// the code does in fp32) over `inputs`, broadcast together.
inline torch::Tensor runtime_kernel(const std::string& code, const std::string& name,
                                    const c10::SmallVector<at::Tensor>& inputs) {
  return jiterator()(code, name, 1, inputs, {}, false)[0];
}

/// [1, 0] of shape [2, 1] in `options`' dtype on its device: an input that tells a kernel writing [.., 2, width]
/// (the two halves of a last dimension, its inputs broadcast over them) which half an element is in. Made once per
/// device and dtype, and kept for the process (a CUDA tensor freed at exit would outlive its context).
inline const torch::Tensor& first_half_selector(const torch::TensorOptions& options) {
  static std::mutex mutex;
  static auto* selectors = new std::map<std::pair<std::int64_t, std::int64_t>, torch::Tensor>();
  const std::pair<std::int64_t, std::int64_t> key{options.device().index(),
                                                  static_cast<std::int64_t>(options.dtype().toScalarType())};
  const std::lock_guard<std::mutex> lock(mutex);
  auto& selector = (*selectors)[key];
  if (!selector.defined()) selector = torch::arange(1, -1, -1, options).view({2, 1});
  return selector;
}

/// What a kernel family's probe answers: `probe` (the kernels against their composite path on a small input, under
/// NoGradGuard), false where it throws (a kernel that does not compile, a launch that fails). Callers keep the answer
/// in a function-local static: asked once per process.
template <typename Probe>
bool kernels_agree(Probe probe) {
  try {
    torch::NoGradGuard no_grad;
    return probe();
  } catch (const std::exception&) {
    return false;
  }
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
