#pragma once
// How the suite compares a device result with its reference: the relative L2 error over a whole model
// (every tensor flattened into one vector), in fp64 on the CPU. Whole-model, not per element: under bf16
// autocast a gradient near zero has a large relative error while the step it causes does not matter; the
// norm over the model is what a training run feels.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <hpctrain/train/precision.hpp>

namespace hpctrain_gpu_suite {

/// ||a - b|| / ||b|| over all tensors of `a` and `b` (same shapes, in order); 0 when both are zero.
inline double relative_error(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  TORCH_CHECK(a.size() == b.size(), "relative_error: ", a.size(), " tensors against ", b.size());
  double difference = 0, reference = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto x = a[i].detach().to(torch::kCPU, torch::kFloat64), y = b[i].detach().to(torch::kCPU, torch::kFloat64);
    TORCH_CHECK(x.sizes() == y.sizes(), "relative_error: tensor ", i, " has shape ", x.sizes(), " against ", y.sizes());
    difference += (x - y).pow(2).sum().item<double>();
    reference += y.pow(2).sum().item<double>();
  }
  if (reference == 0) return std::sqrt(difference);
  return std::sqrt(difference / reference);
}

/// |a - b| / |b| (0 when both are 0).
inline double relative_error(double a, double b) { return b == 0 ? std::abs(a) : std::abs(a - b) / std::abs(b); }

/// The tolerance of a comparison against an fp32 CPU reference. fp32: reassociation only (other kernels,
/// other summation orders, an all-reduce). bf16: autocast rounds every matrix product's output to 8 bits of
/// mantissa (2^-9 relative), and a few layers compound it: a few percent of the whole-model norm.
inline double tolerance_for(hpctrain::Precision precision) {
  return precision == hpctrain::Precision::bf16 ? 3e-2 : 1e-4;
}

/// "1.2e-03 <= 1e-04" for a table cell.
inline std::string within(double error, double tolerance) {
  char text[64];
  std::snprintf(text, sizeof text, "%.1e %s %.0e", error, error <= tolerance ? "<=" : ">", tolerance);
  return text;
}

}  // namespace hpctrain_gpu_suite
