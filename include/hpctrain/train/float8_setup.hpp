#pragma once
// Training::float8 (`--float8`) decided before the run: refused where it cannot run, in the worker's setup before
// anything is written (no run directory, no checkpoint), naming the device; else the projections' mode for the run
// (models/kernels/float8_projections.hpp).
#include <optional>
#include <string>

#include <fmt/format.h>
#include <torch/types.h>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/models/kernels/float8_projections.hpp>
#include <hpctrain/names.hpp>
#include <hpctrain/train/precision.hpp>
#include <hpctrain/train/training.hpp>

// The GPU's name and compute capability for the refusal's message: the CUDA runtime's headers where they exist (this
// header is the Trainer's only, which includes CUDA's graph headers on the same condition: train/step_graph.hpp).
#if __has_include(<ATen/cuda/CUDAContext.h>) && __has_include(<cuda_runtime_api.h>)
#define HPCTRAIN_FLOAT8_DEVICE_PROPERTIES 1
#include <ATen/cuda/CUDAContext.h>
#else
#define HPCTRAIN_FLOAT8_DEVICE_PROPERTIES 0
#endif

namespace hpctrain {

/// "cpu", or a CUDA device with its name and compute capability ("cuda:0 NVIDIA H100 80GB HBM3 (sm_90)"): what a
/// refusal of --float8 names.
inline std::string device_description(const torch::Device& device) {
#if HPCTRAIN_FLOAT8_DEVICE_PROPERTIES
  if (device.is_cuda()) {
    const auto* properties = at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index());
    return fmt::format("{} {} (sm_{}{})", device.str(), properties->name, properties->major, properties->minor);
  }
#endif
  return device.str();
}

/// SpecError `[hpctrain.spec.training.float8]` where Training::float8 cannot run: a precision other than bf16 (the
/// float8 products replace bf16 autocast's), LoRA (its frozen base keeps bf16 products: float8 trains what
/// changes), a device without float8 products (CUDA below compute capability 8.9, or no CUDA) unless `emulated` (the
/// test seam env::test_seam::float8_emulated: the same quantisation, the products in fp32, on any device).
/// `precision` is the run's, resolved for the device.
inline void refuse_unsupported_float8(const Training& training, Precision precision, const torch::Device& device,
                                      bool emulated) {
  if (!training.float8()) return;
  detail::refuse_float8_setting(true, precision, training.lora(training.knobs()).has_value());
  detail::require(emulated || models::float8_products_on(device), errors::spec_training_float8,
                  fmt::format("on, with the device {}", device_description(device)),
                  "float8 products (at::_scaled_mm with rowwise scales) need a CUDA GPU of compute capability 8.9 or "
                  "above (sm_89 Ada, sm_90 Hopper)");
}

/// The projections' mode of a run of `training` (after refuse_unsupported_float8): off, rowwise, or emulated under
/// the test seam.
inline models::Float8Projections float8_mode(const Training& training, bool emulated) {
  if (!training.float8()) return models::Float8Projections::off;
  return emulated ? models::Float8Projections::emulated : models::Float8Projections::rowwise;
}

/// Whether `environment` asks for the emulated float8 products (env::test_seam::float8_emulated set).
inline bool float8_emulated_by_seam(const Environment& environment) {
  return environment.get(env::test_seam::float8_emulated).has_value();
}

}  // namespace hpctrain
