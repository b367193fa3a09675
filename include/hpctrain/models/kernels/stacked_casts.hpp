#pragma once
// The weights of projections fused into one product (models/kernels/fused_projections.hpp) cast into one buffer:
// shared by the products that narrow them, bf16 (models/kernels/mixed_precision_products.hpp) and float8
// (models/kernels/float8_projections.hpp).
#include <cstdint>

#include <torch/torch.h>

namespace hpctrain::models::detail {

/// `tensors` (equal but for their first dimension) cast to `dtype` into one tensor, stacked along the first
/// dimension: one cast kernel each, no concatenation.
inline torch::Tensor cast_stacked(at::TensorList tensors, c10::ScalarType dtype) {
  if (tensors.size() == 1) return tensors[0].to(dtype);
  auto shape = tensors[0].sizes().vec();
  shape[0] = 0;
  for (const auto& t : tensors) shape[0] += t.size(0);
  auto out = torch::empty(shape, tensors[0].options().dtype(dtype));
  std::int64_t row = 0;
  for (const auto& t : tensors) {
    out.narrow(0, row, t.size(0)).copy_(t);
    row += t.size(0);
  }
  return out;
}

}  // namespace hpctrain::models::detail
