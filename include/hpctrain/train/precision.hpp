#pragma once
// Numeric precision of the forward pass. bf16 runs the forward under LibTorch's autocast (CUDA, and the
// CPU autocast LibTorch provides), with parameters, gradients and optimizer state kept in fp32.
#include <fstream>
#include <optional>
#include <string>
#include <string_view>

#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <torch/types.h>

#include <hpctrain/error.hpp>

namespace hpctrain {

/// Forward-pass precision.
enum class Precision { fp32, bf16, automatic };
/// Everything in fp32. The default.
inline constexpr Precision fp32 = Precision::fp32;
/// bf16 autocast for the forward pass; fp32 master weights.
inline constexpr Precision bf16 = Precision::bf16;

/// bf16 where the hardware computes it natively — a CUDA device, or a CPU with AVX512-BF16 or AMX — else
/// fp32 (bf16 autocast on a CPU without them is slower than fp32). Resolved in the worker, per rank's device.
inline constexpr Precision auto_precision = Precision::automatic;

/// "fp32", "bf16" or "auto".
inline std::string_view to_string(Precision precision) {
  switch (precision) {
    case Precision::bf16: return "bf16";
    case Precision::automatic: return "auto";
    default: return "fp32";
  }
}

/// The precision named `name` ("fp32", "bf16", "auto"), or nothing.
inline std::optional<Precision> precision_from_name(std::string_view name) {
  if (name == "fp32") return Precision::fp32;
  if (name == "bf16") return Precision::bf16;
  if (name == "auto") return Precision::automatic;
  return std::nullopt;
}

/// The dtype the sharded strategies reduce gradients in (FSDP2's MixedPrecisionPolicy reduce_dtype): the reduce-scatter
/// of zero2/zero3/hsdp and hsdp's all-reduce across replicas. bf16 halves the bytes of the reductions; each rank's
/// contribution and the partial sums are rounded to bf16 (8 significant bits). Gradients accumulated across
/// micro-batches and the shards the optimizer steps stay fp32 either way.
enum class ReduceDtype { fp32, bf16 };

/// "fp32" or "bf16".
inline std::string_view to_string(ReduceDtype dtype) { return dtype == ReduceDtype::bf16 ? "bf16" : "fp32"; }

/// The reduce dtype named `name` ("fp32", "bf16"), or nothing.
inline std::optional<ReduceDtype> reduce_dtype_from_name(std::string_view name) {
  if (name == "fp32") return ReduceDtype::fp32;
  if (name == "bf16") return ReduceDtype::bf16;
  return std::nullopt;
}

/// The scalar type a reduction in `dtype` runs in.
inline torch::ScalarType scalar_type_of(ReduceDtype dtype) {
  return dtype == ReduceDtype::bf16 ? torch::kBFloat16 : torch::kFloat32;
}

/// SpecError for a strategy that reduces gradients in fp32 only, asked for `dtype` by Training::reduce_dtype.
inline void require_fp32_reduce(ReduceDtype dtype, const std::string& strategy) {
  if (dtype == ReduceDtype::fp32) return;
  throw SpecError("reduce_dtype", std::string(to_string(dtype)),
                  fmt::format("{} all-reduces gradients in fp32 only; a bf16 reduction is zero2's, zero3's and hsdp's "
                              "(--sharding zero2|zero3|hsdp)",
                              strategy));
}

/// Whether this CPU runs bf16 matrix products natively (AVX512-BF16 or AMX): there CPU autocast pays off.
inline bool cpu_has_native_bf16() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line))
    if (line.rfind("flags", 0) == 0)
      return line.find(" avx512_bf16") != std::string::npos || line.find(" amx_bf16") != std::string::npos;
  return false;
}

/// `precision` with auto_precision resolved for `device`.
inline Precision resolve_precision(Precision precision, torch::Device device) {
  if (precision != Precision::automatic) return precision;
  return device.is_cuda() || (device.is_cpu() && cpu_has_native_bf16()) ? Precision::bf16 : Precision::fp32;
}

/// Enables autocast on `device` for its lifetime when `precision` is bf16; clears the autocast cache on
/// exit, every step, since the cached casts of the weights are stale once the optimizer has stepped.
class AutocastScope {
 public:
  AutocastScope(Precision precision, torch::Device device)
      : device_type_(device.type()), enabled_(precision == Precision::bf16) {
    if (!enabled_) return;
    previous_ = at::autocast::is_autocast_enabled(device_type_);
    at::autocast::set_autocast_dtype(device_type_, at::kBFloat16);
    at::autocast::set_autocast_enabled(device_type_, true);
    at::autocast::increment_nesting();
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;
  ~AutocastScope() {
    if (!enabled_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_type_, previous_);
  }

 private:
  c10::DeviceType device_type_;
  bool enabled_;
  bool previous_ = false;
};

}  // namespace hpctrain
