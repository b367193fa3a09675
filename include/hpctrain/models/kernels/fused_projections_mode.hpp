#pragma once
// When the projections of one input run as one matrix product (models/kernels/fused_projections.hpp): a process-wide
// switch, torch-free because --plan (lm/memory_plan.hpp) counts what it keeps.
namespace hpctrain::models {

/// When projections of one input run as one product.
enum class FusedProjections {
  under_autocast,  ///< under autocast (mixed precision training), the default
  always,          ///< also in fp32 and bf16 without autocast (a copy of the weights each forward)
  never,           ///< one product per projection, as transformers computes them
};

namespace detail {
inline FusedProjections& fused_projections_switch() {
  static FusedProjections mode = FusedProjections::under_autocast;
  return mode;
}
}  // namespace detail

/// Sets when projections of one input are fused (process-wide; default FusedProjections::under_autocast).
inline void set_fused_projections(FusedProjections mode) { detail::fused_projections_switch() = mode; }
inline FusedProjections fused_projections() { return detail::fused_projections_switch(); }

}  // namespace hpctrain::models
