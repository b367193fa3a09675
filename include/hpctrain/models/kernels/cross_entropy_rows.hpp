#pragma once
// The cross entropy of fp32 logits [rows, vocabulary] against one target each, and the logits' gradient
// softmax(z) − onehot(target) in the products' dtype: what the head's loss (lm/chunked_loss.hpp) needs from the
// logits, in one kernel on CUDA.
//
// ATen's operations pass over the logits five times for it: log_softmax reads them and writes its output, exp
// reads and writes that again, the cast to bf16 reads it once more and writes the gradient; at GPT-2's step (16 x
// 1024 tokens, vocabulary 50,304: 3.3 GB of fp32 logits) about 24 bytes move per logit. The row kernel reads each
// row twice (the second time mostly from L2: a row is 200 KB) and writes the gradient once, 10 bytes per logit in
// bf16, and zeroes the rows of ignored targets itself, so the head's backward products need no rows' weights.
// Compiled at run time (models/kernels/nvrtc_kernels.hpp) and probed once against the composite path
// (models/kernels/runtime_kernels.hpp); elsewhere, and on the CPU, the composite operations run as before.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <hpctrain/models/kernels/nvrtc_kernels.hpp>
#include <hpctrain/models/kernels/runtime_kernels.hpp>

namespace hpctrain::models::detail {

// One block per row: each thread keeps a running maximum and a sum of exponentials below it over V columns at a
// time (4: one 16-byte read of fp32 logits, where the rows allow it), the block combines them, thread 0 writes the
// row's loss, and a second pass writes the gradient (zero on a row whose target is `ignore`; a target outside the
// row gives a NaN loss rather than a read outside it).
inline const std::string cross_entropy_row_code = R"(
#define NEG_INF (-__int_as_float(0x7f800000))
__device__ __forceinline__ void combine(float& m, float& s, float m2, float s2) {
  const float top = fmaxf(m, m2);
  if (top == NEG_INF) return;
  s = s * __expf(m - top) + s2 * __expf(m2 - top);
  m = top;
}
template <int V>
__device__ __forceinline__ void load(const float* p, float (&v)[V]) {
  if (V == 4) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
    v[0] = *p;
  }
}
template <int V>
__device__ void cross_entropy_row(const float* logits, long long logits_stride, const long long* targets,
                                  long long ignore, float* losses, elem* grad, long long grad_stride,
                                  long long width) {
  const long long row = blockIdx.x;
  const float* z = logits + row * logits_stride;
  float m = NEG_INF, s = 0.0f;
  for (long long j = threadIdx.x * (long long)V; j < width; j += (long long)blockDim.x * V) {
    float v[V];
    load<V>(z + j, v);
    float top = v[0];
#pragma unroll
    for (int k = 1; k < V; ++k) top = fmaxf(top, v[k]);
    if (top == NEG_INF) continue;
    const float next = fmaxf(m, top);
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < V; ++k) sum += __expf(v[k] - next);
    s = s * __expf(m - next) + sum;
    m = next;
  }
  for (int offset = 16; offset > 0; offset >>= 1)
    combine(m, s, __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, s, offset));
  __shared__ float maxima[32], sums[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) maxima[warp] = m, sums[warp] = s;
  __syncthreads();
  if (warp == 0) {
    const bool held = lane < (int)(blockDim.x / 32);
    m = held ? maxima[lane] : NEG_INF;
    s = held ? sums[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1)
      combine(m, s, __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, s, offset));
    if (lane == 0) maxima[0] = m, sums[0] = s;
  }
  __syncthreads();
  m = maxima[0];
  s = sums[0];
  const long long target = targets[row];
  const bool counted = target != ignore;
  if (threadIdx.x == 0)
    losses[row] = !counted ? 0.0f : (target >= 0 && target < width) ? m + logf(s) - z[target] : __int_as_float(0x7fc00000);
  if (grad == nullptr) return;
  elem* g = grad + row * grad_stride;
  const float scale = counted ? 1.0f / s : 0.0f;
  for (long long j = threadIdx.x * (long long)V; j < width; j += (long long)blockDim.x * V) {
    float v[V];
    load<V>(z + j, v);
    Pack<V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float p = __expf(v[k] - m) * scale;
      out.v[k] = from_float(counted && j + k == target ? p - 1.0f : p);
    }
    *reinterpret_cast<Pack<V>*>(g + j) = out;
  }
}
#define CROSS_ENTROPY(V)                                                                                        \
  extern "C" __global__ void hpctrain_cross_entropy_rows_##V(const float* logits, long long logits_stride,       \
      const long long* targets, long long ignore, float* losses, elem* grad, long long grad_stride,               \
      long long width) {                                                                                          \
    cross_entropy_row<V>(logits, logits_stride, targets, ignore, losses, grad, grad_stride, width);              \
  }
CROSS_ENTROPY(4) CROSS_ENTROPY(1)
)";

/// One chunk of logits' cross entropy: the loss summed over the counted rows (fp32, 0-dim) and, when asked, the
/// logits' gradient softmax(z) − onehot(target) in the products' dtype. `row_weights` ([rows, 1]: 1 counted, 0
/// ignored) is defined where the gradient's ignored rows are not zeroed yet (the composite path: its caller scales
/// the [rows, width] factors of the products instead, a pass over the logits fewer); the kernel zeroes them.
struct LogitsLoss {
  torch::Tensor loss, gradient, row_weights;
};

#if HPCTRAIN_NVRTC_KERNELS
inline RowKernels& cross_entropy_row_kernels() {
  static auto* kernels = new RowKernels("hpctrain_cross_entropy", cross_entropy_row_code);  // kept for the process
  return *kernels;
}
#endif

/// The row kernel over fp32 `logits` [rows, vocabulary] (rows with unit stride along them) and int64 `targets`
/// [rows]; the gradient in `dtype` (bf16 or fp16) when `gradient`.
inline LogitsLoss cross_entropy_rows(const torch::Tensor& logits, const torch::Tensor& targets, std::int64_t ignore,
                                     c10::ScalarType dtype, bool gradient) {
#if HPCTRAIN_NVRTC_KERNELS
  std::int64_t rows = logits.size(0), width = logits.size(1), logits_stride = row_stride(logits), ignored = ignore;
  auto losses = torch::empty({rows}, logits.options());
  LogitsLoss out;
  if (gradient) out.gradient = torch::empty({rows, width}, logits.options().dtype(dtype));
  if (rows > 0) {
    const auto flat_targets = targets.to(torch::kInt64).contiguous();
    void* logits_pointer = logits.data_ptr();
    void* targets_pointer = flat_targets.data_ptr();
    void* losses_pointer = losses.data_ptr();
    void* grad_pointer = gradient ? out.gradient.data_ptr() : nullptr;
    std::int64_t grad_stride = width;
    const bool packs = width % 4 == 0 && logits_stride % 4 == 0 &&
                       reinterpret_cast<std::uintptr_t>(logits_pointer) % 16 == 0 &&
                       reinterpret_cast<std::uintptr_t>(grad_pointer) % 8 == 0;
    const std::int64_t vector = packs ? 4 : 1;
    const auto threads = static_cast<unsigned>(std::clamp<std::int64_t>((width / vector + 31) / 32 * 32, 32, 512));
    cross_entropy_row_kernels().launch(logits.device(), dtype, "hpctrain_cross_entropy_rows_" + std::to_string(vector),
                                       {static_cast<unsigned>(rows), 1, 1}, {threads, 1, 1},
                                       {&logits_pointer, &logits_stride, &targets_pointer, &ignored, &losses_pointer,
                                        &grad_pointer, &grad_stride, &width});
  }
  out.loss = losses.sum();
  return out;
#else
  (void)logits, (void)targets, (void)ignore, (void)dtype, (void)gradient;
  throw std::runtime_error("built without NVRTC's and CUDA's headers: no row kernels");
#endif
}

/// The composite operations (log_softmax, gather, exp, scatter_add, the cast): the same loss, the gradient with
/// its ignored rows still to be weighted (`row_weights`).
inline LogitsLoss cross_entropy_composite(const torch::Tensor& logits, const torch::Tensor& targets,
                                          std::int64_t ignore, c10::ScalarType dtype, bool gradient) {
  const auto counted = targets.ne(ignore);
  const auto safe = targets.masked_fill(counted.logical_not(), 0).unsqueeze(1);
  const auto weights = counted.to(torch::kFloat32).unsqueeze(1);
  auto log_p = torch::log_softmax(logits, 1);
  LogitsLoss out;
  out.loss = (log_p.gather(1, safe) * weights).sum().neg_();
  if (!gradient) return out;
  // dloss/dz = softmax(z) - onehot(target): log_p's memory becomes it.
  log_p.exp_().scatter_add_(1, safe, torch::full_like(weights, -1.0));
  out.gradient = log_p.to(dtype);
  out.row_weights = weights;
  return out;
}

/// Whether the row kernel agrees with the composite path for gradients in `dtype` on `device` (a small probe:
/// rows of 1000 and 999 columns, 4 and 1 a thread, an ignored row among them; asked once per process and dtype).
inline bool cross_entropy_row_kernels_agree(const torch::Device& device, c10::ScalarType dtype) {
  return kernels_agree(dtype, [&] {
    const auto options = torch::TensorOptions().device(device);
    for (const std::int64_t width : {1000, 999}) {
      const auto logits = torch::randn({16, width}, options) * 4;
      auto targets = torch::randint(width, {16}, options.dtype(torch::kInt64));
      targets[3] = -100;
      const auto fused = cross_entropy_rows(logits, targets, -100, dtype, true);
      const auto composite = cross_entropy_composite(logits, targets, -100, dtype, true);
      if (!close_to_composite(fused.loss, composite.loss) ||
          !close_to_composite(fused.gradient, composite.gradient.mul(composite.row_weights.to(dtype)))) {
        return false;
      }
    }
    return true;
  });
}

/// Whether the row kernel runs for gradients in `dtype` on `device`: row_kernels_possible and the probe passed.
inline bool cross_entropy_rows_usable(const torch::Device& device, c10::ScalarType dtype) {
  return row_kernels_possible(device, dtype) && cross_entropy_row_kernels_agree(device, dtype);
}

/// The cross entropy of `logits` (fp32 [rows, vocabulary]) by the row kernel where it runs, else by the composite
/// operations.
inline LogitsLoss cross_entropy_fastest(const torch::Tensor& logits, const torch::Tensor& targets, std::int64_t ignore,
                                        c10::ScalarType dtype, bool gradient) {
  const bool rows = logits.scalar_type() == torch::kFloat32 && logits.dim() == 2 && row_stride(logits) >= 0 &&
                    cross_entropy_rows_usable(logits.device(), dtype);
  return rows ? cross_entropy_rows(logits, targets, ignore, dtype, gradient)
              : cross_entropy_composite(logits, targets, ignore, dtype, gradient);
}

}  // namespace hpctrain::models::detail
