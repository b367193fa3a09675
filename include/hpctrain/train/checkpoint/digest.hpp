#pragma once
// The parameter digest: CRC-32C over every parameter's and buffer's bytes. Equal digests mean bit-identical
// models (how the requeue test compares a preempted run with an uninterrupted one). Reads the whole model
// to the host, so the Trainer computes it only when asked (Training::report_digest).
#include <cstddef>
#include <cstdint>

#include <torch/nn/module.h>

#include <hpctrain/checksums.hpp>

namespace hpctrain::detail {

/// CRC-32C over every parameter's and buffer's bytes, in registration order.
inline std::uint32_t parameters_digest(const torch::nn::Module& module) {
  std::uint32_t crc = 0;
  auto add = [&](const torch::Tensor& tensor) {
    const auto bytes = tensor.detach().cpu().contiguous();
    crc = crc32c(bytes.data_ptr(), static_cast<std::size_t>(bytes.nbytes()), crc);
  };
  for (const auto& parameter : module.parameters()) add(parameter);
  for (const auto& buffer : module.buffers()) add(buffer);
  return crc;
}

}  // namespace hpctrain::detail
