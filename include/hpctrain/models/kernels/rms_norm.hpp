#pragma once
// RMSNorm of a 16-bit input with a weight of the same dtype — what every norm of a block sees on the bf16 residual
// stream of ZeRO-3 and HSDP under bf16 (train/strategies/fully_sharded.hpp: the blocks gathered in bf16, their input
// bf16) — in transformers' order: y = x in fp32, n = y · rsqrt(mean(y²) + eps) rounded to x's dtype, out = weight · n
// rounded again.
//
// ATen's operations run that as eight kernels forward (the cast, the square, the mean, the sum with eps, rsqrt, the
// product, the cast back, the weight's product) and more backward, and keep the fp32 copy of x for it (4 bytes a token
// and hidden unit, twice a block). ATen's fused rms_norm takes an fp32 input only where the weight is fp32 too, and
// rounds differently. On CUDA each direction here is one hand-written kernel compiled at run time
// (models/kernels/nvrtc_kernels.hpp): forward reads a row once, keeps it in registers for the reduction and writes the
// output and the row's rsqrt (4 bytes a row: all backward keeps beside x and the weight); backward reads x and the
// output's gradient once, writes x's gradient and sums the weight's over each block's rows in registers (one fp32 row
// of partial sums a block, added up after). Probed once against the composite path
// (models/kernels/runtime_kernels.hpp); elsewhere, on the CPU and for any other dtypes, the composite operations run as
// before, bit for bit.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include <hpctrain/models/kernels/nvrtc_kernels.hpp>
#include <hpctrain/models/kernels/runtime_kernels.hpp>

namespace hpctrain::models {

namespace detail {

// The row kernels: a block of T threads over a row of `width` columns, each thread C chunks of 8 consecutive columns
// (column t · 8 + c · T · 8: one 16-byte access per chunk), kept in registers between the reduction and the writes. The
// block sums its threads' partial sums (every warp reduces the warps' totals, so every thread has the sum after two
// barriers). Forward: grid-stride over rows. Backward: each block walks its rows, holding the weight's 8·C columns and
// their gradient's running sums; dx = r·g − r³·Σ(g·y)/width · y with g = dout·weight rounded as autograd rounds it.
inline const std::string rms_norm_row_code = R"(
__device__ __forceinline__ float block_sum(float v, float* shared) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // the previous call's readers are done with `shared`
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < (int)(blockDim.x / 32) ? shared[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ void load8(const elem* p, float (&v)[8]) {
  const Pack<8> q = *reinterpret_cast<const Pack<8>*>(p);
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = to_float(q.v[k]);
}
template <int C>
__device__ void rms_norm_forward_rows(const elem* x, long long x_stride, const elem* weight, elem* out,
                                      long long out_stride, float* rstd, long long rows, long long width, float eps) {
  __shared__ float shared[32];
  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    float y[C][8];
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const long long j = (threadIdx.x + (long long)c * blockDim.x) * 8;
      if (j >= width) continue;
      load8(x + row * x_stride + j, y[c]);
#pragma unroll
      for (int k = 0; k < 8; ++k) sum += y[c][k] * y[c][k];
    }
    const float r = rsqrtf(block_sum(sum, shared) / (float)width + eps);
    if (threadIdx.x == 0) rstd[row] = r;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const long long j = (threadIdx.x + (long long)c * blockDim.x) * 8;
      if (j >= width) continue;
      float w[8];
      load8(weight + j, w);
      Pack<8> o;
#pragma unroll
      for (int k = 0; k < 8; ++k) o.v[k] = from_float(w[k] * to_float(from_float(y[c][k] * r)));
      *reinterpret_cast<Pack<8>*>(out + row * out_stride + j) = o;
    }
  }
}
template <int C>
__device__ void rms_norm_backward_rows(const elem* x, long long x_stride, const elem* weight, const elem* grad,
                                       long long grad_stride, const float* rstd, elem* x_grad, long long x_grad_stride,
                                       float* weight_partial, long long rows, long long width) {
  __shared__ float shared[32];
  float w[C][8], w_sum[C][8];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const long long j = (threadIdx.x + (long long)c * blockDim.x) * 8;
#pragma unroll
    for (int k = 0; k < 8; ++k) w_sum[c][k] = 0.0f, w[c][k] = 0.0f;
    if (j < width) load8(weight + j, w[c]);
  }
  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    const float r = rstd[row];
    float y[C][8], g[C][8];
    float dot = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const long long j = (threadIdx.x + (long long)c * blockDim.x) * 8;
      if (j >= width) continue;
      float d[8];
      load8(x + row * x_stride + j, y[c]);
      load8(grad + row * grad_stride + j, d);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        g[c][k] = to_float(from_float(d[k] * w[c][k]));  // the normalised row's gradient, in x's dtype as autograd's
        dot += g[c][k] * y[c][k];
        w_sum[c][k] += d[k] * to_float(from_float(y[c][k] * r));
      }
    }
    const float coefficient = r * r * r * block_sum(dot, shared) / (float)width;
    if (x_grad == nullptr) continue;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const long long j = (threadIdx.x + (long long)c * blockDim.x) * 8;
      if (j >= width) continue;
      Pack<8> dx;
#pragma unroll
      for (int k = 0; k < 8; ++k) dx.v[k] = from_float(r * g[c][k] - coefficient * y[c][k]);
      *reinterpret_cast<Pack<8>*>(x_grad + row * x_grad_stride + j) = dx;
    }
  }
  if (weight_partial == nullptr) return;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const long long j = (threadIdx.x + (long long)c * blockDim.x) * 8;
    if (j >= width) continue;
#pragma unroll
    for (int k = 0; k < 8; ++k) weight_partial[blockIdx.x * width + j + k] = w_sum[c][k];
  }
}
#define RMS_NORM(C)                                                                                                 \
  extern "C" __global__ void hpctrain_rms_norm_forward_##C(const elem* x, long long x_stride, const elem* weight,    \
      elem* out, long long out_stride, float* rstd, long long rows, long long width, float eps) {                    \
    rms_norm_forward_rows<C>(x, x_stride, weight, out, out_stride, rstd, rows, width, eps);                         \
  }                                                                                                                 \
  extern "C" __global__ void hpctrain_rms_norm_backward_##C(const elem* x, long long x_stride, const elem* weight,   \
      const elem* grad, long long grad_stride, const float* rstd, elem* x_grad, long long x_grad_stride,            \
      float* weight_partial, long long rows, long long width) {                                                     \
    rms_norm_backward_rows<C>(x, x_stride, weight, grad, grad_stride, rstd, x_grad, x_grad_stride, weight_partial,  \
                              rows, width);                                                                         \
  }
RMS_NORM(1) RMS_NORM(2) RMS_NORM(4)
)";

/// How the row kernels cover a row of `width` columns: threads a block and chunks of 8 columns a thread (1, 2 or 4),
/// or none past 32,768 columns.
struct RmsNormLaunch {
  std::int64_t threads = 256, chunks = 1;
};
inline std::optional<RmsNormLaunch> rms_norm_launch(std::int64_t width) {
  RmsNormLaunch launch;
  while (launch.threads * 8 * 4 < width && launch.threads < 1024) launch.threads *= 2;
  while (launch.threads * 8 * launch.chunks < width && launch.chunks < 4) launch.chunks *= 2;
  if (launch.threads * 8 * launch.chunks < width) return std::nullopt;
  return launch;
}

/// transformers' LlamaRMSNorm: x normalised in fp32, rounded to x's dtype, then scaled by `weight` (in the two
/// operands' promoted dtype). The composite path, and the reference the kernels are probed against.
inline torch::Tensor rms_norm_composite(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  auto y = x.to(torch::kFloat32);
  y = y * torch::rsqrt(y.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * y.to(x.scalar_type());
}

#if HPCTRAIN_NVRTC_KERNELS
inline RowKernels& rms_norm_row_kernels() {
  static auto* kernels = new RowKernels("hpctrain_rms_norm", rms_norm_row_code);  // kept for the process
  return *kernels;
}
#endif

/// The forward kernel: the output (x's shape and dtype, contiguous) and each row's rsqrt (fp32, [rows]).
inline std::pair<torch::Tensor, torch::Tensor> rms_norm_forward_rows(const torch::Tensor& x,
                                                                     const torch::Tensor& weight, double eps) {
#if HPCTRAIN_NVRTC_KERNELS
  std::int64_t width = x.size(-1), rows = x.numel() / std::max<std::int64_t>(width, 1), x_stride = row_stride(x);
  auto out = torch::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  auto rstd = torch::empty({rows}, x.options().dtype(torch::kFloat32));
  const auto launch = rms_norm_launch(width);
  if (rows == 0) return {out, rstd};
  if (!launch) throw std::runtime_error("rms_norm: a row of " + std::to_string(width) + " columns is too wide");
  void* pointers[] = {x.data_ptr(), weight.data_ptr(), out.data_ptr(), rstd.data_ptr()};
  std::int64_t out_stride = width;
  float epsilon = static_cast<float>(eps);
  std::vector<void*> arguments{&pointers[0], &x_stride, &pointers[1], &pointers[2], &out_stride,
                               &pointers[3], &rows,     &width,       &epsilon};
  const auto blocks = std::min<std::int64_t>(rows, 1 << 20);
  rms_norm_row_kernels().launch(
      x.device(), x.scalar_type(), "hpctrain_rms_norm_forward_" + std::to_string(launch->chunks),
      {static_cast<unsigned>(blocks), 1, 1}, {static_cast<unsigned>(launch->threads), 1, 1}, std::move(arguments));
  return {out, rstd};
#else
  (void)x, (void)weight, (void)eps;
  throw std::runtime_error("built without NVRTC's and CUDA's headers: no row kernels");
#endif
}

/// The backward kernel: x's gradient (when `x_grad`) and the weight's (when `weight_grad`), either undefined when not
/// asked for.
inline std::pair<torch::Tensor, torch::Tensor> rms_norm_backward_rows(const torch::Tensor& x,
                                                                      const torch::Tensor& weight,
                                                                      const torch::Tensor& rstd,
                                                                      const torch::Tensor& grad, bool x_grad,
                                                                      bool weight_grad) {
#if HPCTRAIN_NVRTC_KERNELS
  std::int64_t width = x.size(-1), rows = x.numel() / std::max<std::int64_t>(width, 1), x_stride = row_stride(x),
               grad_stride = row_stride(grad), x_grad_stride = width;
  const auto launch = rms_norm_launch(width);
  if (!launch) throw std::runtime_error("rms_norm: a row of " + std::to_string(width) + " columns is too wide");
  // Enough blocks to fill the device, few enough that the weight's partial sums stay small (one fp32 row a block).
  const auto blocks = std::clamp<std::int64_t>(rows, 1, 512);
  torch::Tensor dx, partial;
  if (x_grad) dx = torch::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (weight_grad) partial = torch::empty({blocks, width}, x.options().dtype(torch::kFloat32));
  if (rows == 0) return {dx, weight_grad ? torch::zeros_like(weight) : torch::Tensor()};
  void* pointers[] = {x.data_ptr(),
                      weight.data_ptr(),
                      grad.data_ptr(),
                      rstd.data_ptr(),
                      x_grad ? dx.data_ptr() : nullptr,
                      weight_grad ? partial.data_ptr() : nullptr};
  std::vector<void*> arguments{&pointers[0], &x_stride,      &pointers[1], &pointers[2], &grad_stride, &pointers[3],
                               &pointers[4], &x_grad_stride, &pointers[5], &rows,        &width};
  rms_norm_row_kernels().launch(
      x.device(), x.scalar_type(), "hpctrain_rms_norm_backward_" + std::to_string(launch->chunks),
      {static_cast<unsigned>(blocks), 1, 1}, {static_cast<unsigned>(launch->threads), 1, 1}, std::move(arguments));
  return {dx, weight_grad ? partial.sum(0).to(weight.scalar_type()) : torch::Tensor()};
#else
  (void)x, (void)weight, (void)rstd, (void)grad, (void)x_grad, (void)weight_grad;
  throw std::runtime_error("built without NVRTC's and CUDA's headers: no row kernels");
#endif
}

/// Whether the kernels agree with the composite path under autograd for elements of `dtype` on `device`: output, x's
/// gradient and the weight's, at widths taking 1, 2 and 4 chunks a thread, over more rows than the backward's blocks
/// (asked once per process and dtype). x and the output's gradient are positive, so the weight's gradient, a sum over
/// the rows, has no cancellation: autograd rounds each of its products to the weight's dtype and the kernel does not,
/// which over random signs would leave a column's small sum far from the other in relative terms.
inline bool rms_norm_row_kernels_agree(const torch::Device& device, c10::ScalarType dtype) {
  return kernels_agree(dtype, [&] {
    const torch::AutoGradMode with_grad(true);
    const auto options = torch::TensorOptions().dtype(dtype).device(device);
    for (const std::int64_t width : {256, 4096, 6144}) {
      const std::int64_t rows = width == 256 ? 600 : 16;
      const auto x = torch::rand({rows, width}, options) + 0.5, grad = torch::rand({rows, width}, options) + 0.5;
      const auto weight = (1 + 0.1 * torch::randn({width}, options)).requires_grad_(true);
      const auto input = x.detach().requires_grad_(true);
      const auto expected = rms_norm_composite(input, weight, 1e-5);
      const auto gradients = torch::autograd::grad({expected}, {input, weight}, {grad});
      const auto [out, rstd] = rms_norm_forward_rows(x, weight.detach(), 1e-5);
      const auto [dx, dw] = rms_norm_backward_rows(x, weight.detach(), rstd, grad, true, true);
      if (!close_to_composite(out, expected.detach()) || !close_to_composite(dx, gradients[0]) ||
          !close_to_composite(dw, gradients[1]))
        return false;
    }
    return true;
  });
}

/// Whether `t` can be read as rows by the kernels: rows with unit stride along them, each starting 16-byte aligned.
inline bool rms_norm_rows_readable(const torch::Tensor& t) {
  const auto stride = row_stride(t);
  return stride >= 0 && stride % 8 == 0 && reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0;
}

/// Whether the kernels run for `x` and `weight`: row_kernels_possible, the weight x's dtype and contiguous, rows of a
/// width in 8s up to 32,768 that the kernels can read, and the probe passed.
inline bool rms_norm_rows_usable(const torch::Tensor& x, const torch::Tensor& weight) {
  if (!row_kernels_possible(x.device(), x.scalar_type()) || weight.scalar_type() != x.scalar_type()) return false;
  const auto width = x.size(-1);
  if (weight.dim() != 1 || weight.size(0) != width || !weight.is_contiguous() || width % 8 != 0 ||
      !rms_norm_rows_readable(x) || !rms_norm_rows_readable(weight) || !rms_norm_launch(width))
    return false;
  return rms_norm_row_kernels_agree(x.device(), x.scalar_type());
}

/// RMSNorm by the row kernels, as one autograd node: keeps x, the weight and each row's rsqrt.
struct RmsNormRows : torch::autograd::Function<RmsNormRows> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, double eps) {
    auto [out, rstd] = rms_norm_forward_rows(x, weight, eps);
    ctx->save_for_backward({x, weight, rstd});
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& grad = grads[0];
    if (!grad.defined()) return {torch::Tensor(), torch::Tensor(), torch::Tensor()};
    // The output's gradient as rows the kernel reads (autograd hands a contiguous one almost always; a fresh copy
    // otherwise, aligned).
    auto rows = grad.to(saved[0].scalar_type());
    if (!rms_norm_rows_readable(rows)) rows = rows.clone(at::MemoryFormat::Contiguous);
    auto [dx, dw] =
        rms_norm_backward_rows(saved[0], saved[1], saved[2], rows, ctx->needs_input_grad(0), ctx->needs_input_grad(1));
    return {dx, dw, torch::Tensor()};
  }
};

}  // namespace detail

/// RMSNorm in transformers' order (detail::rms_norm_composite): by the row kernels for a 16-bit x with a weight of its
/// dtype on CUDA, where they run; by the composite operations elsewhere.
inline torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  if (!detail::rms_norm_rows_usable(x, weight)) return detail::rms_norm_composite(x, weight, eps);
  if (!torch::GradMode::is_enabled() || !(x.requires_grad() || weight.requires_grad()))
    return detail::rms_norm_forward_rows(x, weight, eps).first;
  return detail::RmsNormRows::apply(x, weight, eps);
}

}  // namespace hpctrain::models
