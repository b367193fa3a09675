#pragma once
// What an export writes: the weights' dtype and the most bytes of a safetensors file, and how the knobs
// --export-dtype and --export-shard-size spell them (models/hf/hf_export.hpp writes it).
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <torch/types.h>

namespace hpctrain::models {

/// How an export writes the weights.
struct ExportFormat {
  /// The dtype of every weight written (config.json's `dtype` and `torch_dtype` say it). Default: bf16.
  torch::Dtype dtype = torch::kBFloat16;
  /// The most bytes of a shard (a larger tensor gets one of its own). Default: 5 GB, transformers' max_shard_size.
  std::uint64_t max_shard_bytes = 5'000'000'000;
};

/// The name config.json gives `dtype` ("bfloat16", "float32", "float16").
inline std::string config_dtype_name(torch::Dtype dtype) {
  if (dtype == torch::kBFloat16) return "bfloat16";
  if (dtype == torch::kFloat16) return "float16";
  if (dtype == torch::kFloat64) return "float64";
  return "float32";
}

/// The dtype of a name: ours (bf16, fp16, fp32) or config.json's (bfloat16, float16, float32); nothing for another.
inline std::optional<torch::Dtype> export_dtype_from_name(std::string_view name) {
  if (name == "bf16" || name == "bfloat16") return torch::kBFloat16;
  if (name == "fp16" || name == "float16") return torch::kFloat16;
  if (name == "fp32" || name == "float32") return torch::kFloat32;
  return std::nullopt;
}

/// Bytes of a shard size as transformers' convert_file_size_to_int reads it: a whole number of bytes, or one with
/// a unit — KB, MB, GB (powers of 1000) or KiB, MiB, GiB (powers of 1024), "5GB" = 5,000,000,000. Nothing when
/// the text is none of these, or 0.
inline std::optional<std::uint64_t> parse_shard_size(std::string_view text) {
  std::uint64_t number = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (error != std::errc() || end == text.data() || number == 0) return std::nullopt;
  const std::string_view unit(end, static_cast<std::size_t>(text.data() + text.size() - end));
  const std::pair<std::string_view, std::uint64_t> units[] = {{"", 1},
                                                              {"B", 1},
                                                              {"KB", 1000},
                                                              {"MB", 1000000},
                                                              {"GB", 1000000000},
                                                              {"KiB", 1ull << 10},
                                                              {"MiB", 1ull << 20},
                                                              {"GiB", 1ull << 30}};
  for (const auto& [name, scale] : units)
    if (unit == name) {
      if (number > std::numeric_limits<std::uint64_t>::max() / scale) return std::nullopt;
      return number * scale;
    }
  return std::nullopt;
}

}  // namespace hpctrain::models
