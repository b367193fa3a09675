#pragma once
// The parameter digest: CRC-32C over every parameter's and buffer's bytes. Equal digests mean bit-identical
// models (how the requeue test compares a preempted run with an uninterrupted one). Reads the model to the host,
// so the Trainer computes it only when asked (Training::report_digest), unit by unit: under ZeRO-3 one block is
// gathered at a time, never the whole model.
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

#include <fmt/format.h>
#include <torch/nn/module.h>

#include <hpctrain/checksums.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/models/model_units.hpp>

namespace hpctrain::detail {

inline std::uint32_t bytes_crc32c(const torch::Tensor& tensor, std::uint32_t crc = 0) {
  const auto bytes = tensor.detach().cpu().contiguous();
  return crc32c(bytes.data_ptr(), static_cast<std::size_t>(bytes.nbytes()), crc);
}

/// Each parameter's CRC-32C (of its whole bytes), chained in registration order, then every buffer's bytes.
/// `visit_units` hands the parameters out a unit at a time, each whole during the call (a strategy's
/// visit_units), in any order.
template <class VisitUnits>
std::uint32_t parameters_digest(const torch::nn::Module& module, VisitUnits&& visit_units) {
  std::unordered_map<std::string, std::uint32_t> crc_of;
  visit_units([&](const models::NamedUnit& unit) {
    for (const auto& [name, tensor] : unit) crc_of[name] = bytes_crc32c(tensor);
  });
  std::uint32_t crc = 0;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const auto found = crc_of.find(item.key());
    if (found == crc_of.end())
      throw RuntimeError(errors::runtime_checkpoint,
                         fmt::format("parameters digest: parameter '{}' was in no unit visited", item.key()));
    crc = crc32c(&found->second, sizeof found->second, crc);
  }
  for (const auto& buffer : module.buffers()) crc = bytes_crc32c(buffer, crc);
  return crc;
}

/// The digest of a module whole on this rank.
inline std::uint32_t parameters_digest(torch::nn::Module& module) {
  return parameters_digest(module, [&](const models::UnitVisitor& visit) { visit(models::whole_unit(module)); });
}

}  // namespace hpctrain::detail
