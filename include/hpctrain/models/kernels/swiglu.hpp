#pragma once
// SwiGLU's elementwise part, silu(gate) · up (Shazeer 2020; Llama's, Qwen2's and Mistral's MLP), as one autograd
// node.
//
// Autograd's two operations keep three tensors of the MLP's width for backward: silu's input (gate), its output
// (mul's left operand) and up; their backward writes gate's and up's gradients as tensors of their own, which the
// fused gate/up product (models/kernels/fused_projections.hpp) then concatenates. SwiGLU keeps gate and up only and
// computes silu(gate) again in backward (one pass over memory it reads anyway): 2 bytes a token, layer and MLP
// column fewer under bf16 (1.89 GiB at TinyLlama's shape, 8 x 1024 tokens, 22 layers of 5632), 4 in fp32. Given
// the fused product's output whole, it writes both gradients into the halves of one tensor: no concatenation.
// On the CPU (and wherever no kernel is compiled at run time) its operations are autograd's, in the same order:
// the output and the gradients are bit for bit autograd's.
//
// On CUDA the forward and the backward are one hand-written kernel each, compiled at run time
// (models/kernels/nvrtc_kernels.hpp): silu(g)·u in fp32 registers, rounded once, where autograd's silu writes a rounded
// bf16 result that mul reads back; backward reads g, u and the output's gradient once and writes both gradients, where
// autograd runs four kernels (two products, silu's backward, the concatenation). They read the fused product's
// halves where they lie, 16 bytes per access: on an H200 the backward moves 4.2 TB/s (a copy's speed; ATen's
// jiterator, which they replaced, 0.95) and the pair runs 3.5x autograd's (docs/gpu.md, 2026-11-27). Probed once
// against the composite path; the GPU suite's switches.fused_swiglu times both.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <initializer_list>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include <hpctrain/models/kernels/nvrtc_kernels.hpp>
#include <hpctrain/models/kernels/runtime_kernels.hpp>

namespace hpctrain::models {

namespace detail {

// The row kernels (models/kernels/nvrtc_kernels.hpp): each thread V consecutive columns of a row (8: one 16-byte access
// per operand, where every row of every operand starts 16-byte aligned), each operand with its own row stride, so the
// fused product's halves are read where they lie.
inline const std::string swiglu_row_code = R"(
#define ROWS_LOOP                                                                                      \
  const long long per_row = width / V, total = rows * per_row;                                        \
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;                     \
       i += (long long)gridDim.x * blockDim.x)
#define AT(pointer, stride) (pointer + (i / per_row) * stride + (i % per_row) * V)
template <int V>
__device__ void swiglu_forward_rows(const elem* gate, long long gate_stride, const elem* up, long long up_stride,
                                    elem* out, long long out_stride, long long rows, long long width) {
  ROWS_LOOP {
    const Pack<V> g = *reinterpret_cast<const Pack<V>*>(AT(gate, gate_stride));
    const Pack<V> u = *reinterpret_cast<const Pack<V>*>(AT(up, up_stride));
    Pack<V> y;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float x = to_float(g.v[k]);
      y.v[k] = from_float(x / (1.0f + expf(-x)) * to_float(u.v[k]));
    }
    *reinterpret_cast<Pack<V>*>(AT(out, out_stride)) = y;
  }
}
template <int V>
__device__ void swiglu_backward_rows(const elem* gate, long long gate_stride, const elem* up, long long up_stride,
                                     const elem* grad, long long grad_stride, elem* gate_grad,
                                     long long gate_grad_stride, elem* up_grad, long long up_grad_stride,
                                     long long rows, long long width) {
  ROWS_LOOP {
    const Pack<V> g = *reinterpret_cast<const Pack<V>*>(AT(gate, gate_stride));
    const Pack<V> u = *reinterpret_cast<const Pack<V>*>(AT(up, up_stride));
    const Pack<V> d = *reinterpret_cast<const Pack<V>*>(AT(grad, grad_stride));
    Pack<V> dg, du;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float x = to_float(g.v[k]), s = 1.0f / (1.0f + expf(-x)), dy = to_float(d.v[k]);
      dg.v[k] = from_float(dy * to_float(u.v[k]) * s * (1.0f + x * (1.0f - s)));
      du.v[k] = from_float(dy * x * s);
    }
    *reinterpret_cast<Pack<V>*>(AT(gate_grad, gate_grad_stride)) = dg;
    *reinterpret_cast<Pack<V>*>(AT(up_grad, up_grad_stride)) = du;
  }
}
#define FORWARD(V)                                                                                          \
  extern "C" __global__ void hpctrain_swiglu_forward_##V(const elem* gate, long long gate_stride,            \
      const elem* up, long long up_stride, elem* out, long long out_stride, long long rows, long long width) { \
    swiglu_forward_rows<V>(gate, gate_stride, up, up_stride, out, out_stride, rows, width);                 \
  }
#define BACKWARD(V)                                                                                         \
  extern "C" __global__ void hpctrain_swiglu_backward_##V(const elem* gate, long long gate_stride,           \
      const elem* up, long long up_stride, const elem* grad, long long grad_stride, elem* gate_grad,         \
      long long gate_grad_stride, elem* up_grad, long long up_grad_stride, long long rows, long long width) { \
    swiglu_backward_rows<V>(gate, gate_stride, up, up_stride, grad, grad_stride, gate_grad, gate_grad_stride, \
                            up_grad, up_grad_stride, rows, width);                                           \
  }
FORWARD(8) FORWARD(1) BACKWARD(8) BACKWARD(1)
)";

#if HPCTRAIN_NVRTC_KERNELS
inline RowKernels& swiglu_row_kernels() {
  static auto* kernels = new RowKernels("hpctrain_swiglu", swiglu_row_code);  // kept for the process
  return *kernels;
}
#endif

/// Launches the SwiGLU row kernel `name` ("forward" or "backward") over `operands` ([.., width] each, the outputs
/// last), with 8 columns a thread where every operand allows it.
inline void launch_swiglu_rows(const std::string& name, const std::vector<torch::Tensor>& operands) {
#if HPCTRAIN_NVRTC_KERNELS
  const auto& first = operands.front();
  std::int64_t width = first.size(-1), rows = first.numel() / std::max<std::int64_t>(width, 1);
  if (rows == 0 || width == 0) return;
  std::vector<void*> pointers;
  std::vector<std::int64_t> strides;
  bool packs = width % 8 == 0;
  for (const auto& operand : operands) {
    pointers.push_back(operand.data_ptr());
    strides.push_back(row_stride(operand));
    packs = packs && strides.back() % 8 == 0 && reinterpret_cast<std::uintptr_t>(pointers.back()) % 16 == 0;
  }
  std::vector<void*> arguments;
  for (std::size_t i = 0; i < operands.size(); ++i) {
    arguments.push_back(&pointers[i]);
    arguments.push_back(&strides[i]);
  }
  arguments.push_back(&rows);
  arguments.push_back(&width);
  const std::int64_t vector = packs ? 8 : 1, threads = 256;
  const auto blocks = std::min<std::int64_t>((rows * (width / vector) + threads - 1) / threads, 1 << 20);
  swiglu_row_kernels().launch(
      first.device(), first.scalar_type(), "hpctrain_swiglu_" + name + "_" + std::to_string(vector),
      {static_cast<unsigned>(blocks), 1, 1}, {static_cast<unsigned>(threads), 1, 1}, std::move(arguments));
#else
  (void)name, (void)operands;
  throw std::runtime_error("built without NVRTC's and CUDA's headers: no row kernels");
#endif
}

/// silu(gate) · up by the row kernel: [.., width] of the inputs' shape, contiguous.
inline torch::Tensor swiglu_forward_rows(const torch::Tensor& gate, const torch::Tensor& up) {
  auto out = torch::empty(gate.sizes(), gate.options().memory_format(at::MemoryFormat::Contiguous));
  launch_swiglu_rows("forward", {gate, up, out});
  return out;
}

/// Both gradients by the row kernel, into `gate_grad` and `up_grad` ([.., width], views of one tensor or apart).
inline void swiglu_backward_rows(const torch::Tensor& gate, const torch::Tensor& up, const torch::Tensor& grad,
                                 const torch::Tensor& gate_grad, const torch::Tensor& up_grad) {
  launch_swiglu_rows("backward", {gate, up, grad, gate_grad, up_grad});
}

/// The composite operations, autograd's: silu(gate) · up.
inline torch::Tensor swiglu_forward_composite(const torch::Tensor& gate, const torch::Tensor& up) {
  return at::silu(gate).mul_(up);
}

/// The composite backward, autograd's operations in its order, into `gate_grad` and `up_grad` (views of one
/// tensor, or tensors of their own).
inline void swiglu_backward_composite(const torch::Tensor& gate, const torch::Tensor& up, const torch::Tensor& grad,
                                      torch::Tensor gate_grad, torch::Tensor up_grad) {
  at::silu_out(up_grad, gate).mul_(grad);  // d up = grad · silu(gate)
  at::mul_out(gate_grad, grad, up);
  at::silu_backward_out(gate_grad, gate_grad, gate);  // d gate = silu'(gate) · (grad · up)
}

/// Whether the row kernels agree with the composite path for `dtype` on `device` (a small probe over a joined
/// product's halves, 8 columns a thread and 1; asked once per process and dtype).
inline bool swiglu_row_kernels_agree(const torch::Device& device, c10::ScalarType dtype) {
  return kernels_agree(dtype, [&] {
    const auto options = torch::TensorOptions().dtype(dtype).device(device);
    for (const std::int64_t width : {256, 100}) {
      const auto joined = torch::randn({64, 2 * width}, options), grad = torch::randn({64, width}, options);
      const auto gate = joined.narrow(-1, 0, width), up = joined.narrow(-1, width, width);
      auto expected = torch::empty_like(joined), both = torch::empty_like(joined);
      swiglu_backward_composite(gate, up, grad, expected.narrow(-1, 0, width), expected.narrow(-1, width, width));
      swiglu_backward_rows(gate, up, grad, both.narrow(-1, 0, width), both.narrow(-1, width, width));
      if (!close_to_composite(swiglu_forward_rows(gate, up), swiglu_forward_composite(gate, up)) ||
          !close_to_composite(both, expected)) {
        return false;
      }
    }
    return true;
  });
}

/// Whether the row kernels run over `operands`: row_kernels_possible, one dtype and shape, each viewable as rows,
/// and the probe passed.
inline bool swiglu_rows_usable(std::initializer_list<torch::Tensor> operands) {
  const auto& first = *operands.begin();
  if (!row_kernels_possible(first.device(), first.scalar_type())) return false;
  for (const auto& operand : operands) {
    if (operand.scalar_type() != first.scalar_type() || operand.sizes() != first.sizes() || row_stride(operand) < 0)
      return false;
  }
  return swiglu_row_kernels_agree(first.device(), first.scalar_type());
}

/// silu(gate) · up by the row kernel where it runs, else by the composite operations.
inline torch::Tensor swiglu_forward_fastest(const torch::Tensor& gate, const torch::Tensor& up) {
  return swiglu_rows_usable({gate, up}) ? swiglu_forward_rows(gate, up) : swiglu_forward_composite(gate, up);
}

/// silu(gate) · up with `inputs` gate and up (two tensors of one shape) or one tensor [.., 2 · width] with gate's
/// half first (a fused gate/up product's output). Keeps its inputs only; backward writes each input's gradient.
struct SwiGLU : torch::autograd::Function<SwiGLU> {
  static std::pair<torch::Tensor, torch::Tensor> halves(const torch::Tensor& joined) {
    const auto width = joined.size(-1) / 2;
    return {joined.narrow(-1, 0, width), joined.narrow(-1, width, width)};
  }
  static std::pair<torch::Tensor, torch::Tensor> gate_and_up(at::TensorList inputs) {
    return inputs.size() == 1 ? halves(inputs[0]) : std::pair{inputs[0], inputs[1]};
  }

  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, at::TensorList inputs) {
    ctx->save_for_backward(inputs.vec());
    const auto [gate, up] = gate_and_up(inputs);
    return swiglu_forward_fastest(gate, up);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool joined = saved.size() == 1;
    const auto [gate, up] = gate_and_up(saved);
    torch::autograd::variable_list out(saved.size());
    const auto& grad = grads[0];
    if (!grad.defined()) return out;
    // Joined: both gradients into the halves of one tensor, no concatenation.
    out[0] = torch::empty_like(saved[0], at::MemoryFormat::Contiguous);
    if (!joined) out[1] = torch::empty_like(up, at::MemoryFormat::Contiguous);
    const auto [gate_grad, up_grad] = joined ? halves(out[0]) : std::pair{out[0], out[1]};
    if (swiglu_rows_usable({gate, up, grad})) {
      swiglu_backward_rows(gate, up, grad, gate_grad, up_grad);
    } else {
      swiglu_backward_composite(gate, up, grad, gate_grad, up_grad);
    }
    return out;
  }
};

}  // namespace detail

/// silu(gate) · up, gate and up of one shape.
inline torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes(), "swiglu: gate ", gate.sizes(), " and up ", up.sizes(), " differ in shape");
  if (!torch::GradMode::is_enabled() || !(gate.requires_grad() || up.requires_grad())) {
    return detail::swiglu_forward_fastest(gate, up);
  }
  return detail::SwiGLU::apply(at::TensorList({gate, up}));
}

/// silu(gate) · up of a fused gate/up product's output [.., 2 · width], gate's half first; the gradients come back
/// as one tensor of its shape.
inline torch::Tensor swiglu(const torch::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0, "swiglu: a joined gate/up tensor has an even last ",
              "dimension, not ", gate_up.sizes());
  if (!torch::GradMode::is_enabled() || !gate_up.requires_grad()) {
    const auto [gate, up] = detail::SwiGLU::halves(gate_up);
    return detail::swiglu_forward_fastest(gate, up);
  }
  return detail::SwiGLU::apply(at::TensorList(gate_up));
}

}  // namespace hpctrain::models
