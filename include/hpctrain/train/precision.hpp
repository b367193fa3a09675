#pragma once
// Numeric precision of the forward pass. bf16 runs the forward under LibTorch's autocast (CUDA, and the
// CPU autocast LibTorch provides), with parameters, gradients and optimizer state kept in fp32.
#include <string_view>

#include <ATen/autocast_mode.h>
#include <torch/types.h>

namespace hpctrain {

/// Forward-pass precision.
enum class Precision { fp32, bf16 };
/// Everything in fp32. The default.
inline constexpr Precision fp32 = Precision::fp32;
/// bf16 autocast for the forward pass; fp32 master weights.
inline constexpr Precision bf16 = Precision::bf16;

/// "fp32" or "bf16".
inline std::string_view to_string(Precision precision) { return precision == Precision::bf16 ? "bf16" : "fp32"; }

/// Enables autocast on `device` for its lifetime when `precision` is bf16; clears the autocast cache on
/// exit, every step, since the cached casts of the weights are stale once the optimizer has stepped.
class AutocastScope {
 public:
  AutocastScope(Precision precision, torch::Device device) : device_type_(device.type()), enabled_(precision == Precision::bf16) {
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
