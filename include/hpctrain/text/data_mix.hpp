#pragma once
// Several data sources named in one `--data` value and mixed by weight: `a.parquet:0.7,b.jsonl:0.3`. Each entry is
// a path (a file or a dataset directory, as one `--data` takes) and, after its last ':', a weight; the weights are
// relative (they need not add up to 1). Without weights (`a.jsonl,b.jsonl`) each source weighs as many as its rows:
// the sources are concatenated. A value that names an existing file or directory as a whole is that one source,
// whatever commas or colons its name holds. Torch-free: the login node reads it (lm/sft.hpp), the worker mixes
// (train/data/mix.hpp).
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>

namespace hpctrain::text {

/// One source of a mix: its path and its weight (none: as many as its rows).
struct WeightedData {
  std::filesystem::path path;
  std::optional<double> weight;
  bool operator==(const WeightedData&) const = default;
};

namespace detail {
/// The weight after the last ':' of `entry` when what follows it reads whole as a number; none otherwise (a
/// path such as `C:data` or `dir:v2/file.jsonl` keeps its colon).
inline std::optional<double> weight_suffix(std::string_view entry, std::size_t& colon) {
  colon = entry.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == entry.size()) return std::nullopt;
  const std::string number(entry.substr(colon + 1));
  if (number.find_first_not_of("0123456789.eE+-") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size()) return std::nullopt;
  return value;
}
}  // namespace detail

/// The sources `value` names: one (the whole value) when it exists on disk or holds no ',' and no weight, else
/// each comma-separated entry. SpecError `[hpctrain.spec.data.mix]` naming the entry: an empty one, a weight that
/// is not a positive finite number, weights on some entries but not all.
inline std::vector<WeightedData> parse_data_mix(std::string_view value) {
  std::error_code error;
  if (value.empty() || std::filesystem::exists(std::filesystem::path(value), error)) return {{std::string(value), {}}};
  std::vector<WeightedData> sources;
  std::size_t weighted = 0;
  for (std::size_t begin = 0; begin <= value.size();) {
    const auto comma = std::min(value.find(',', begin), value.size());
    const auto entry = value.substr(begin, comma - begin);
    begin = comma + 1;
    std::size_t colon = 0;
    const auto weight = detail::weight_suffix(entry, colon);
    const auto path = weight ? entry.substr(0, colon) : entry;
    if (path.empty())
      throw SpecError(errors::spec_data_mix, fmt::format("--data entry '{}'", entry),
                      "names no file (a mix is FILE:WEIGHT,FILE:WEIGHT,...)");
    if (weight && !(std::isfinite(*weight) && *weight > 0))
      throw SpecError(errors::spec_data_mix, fmt::format("--data entry '{}'", entry),
                      "its weight must be a positive finite number");
    weighted += weight ? 1 : 0;
    sources.push_back({std::string(path), weight});
  }
  if (weighted != 0 && weighted != sources.size())
    for (const auto& source : sources)
      if (!source.weight)
        throw SpecError(errors::spec_data_mix, fmt::format("--data entry '{}'", source.path.string()),
                        "has no weight while others have one: give every source a weight, or none (each source then "
                        "weighs as many as its rows)");
  return sources;
}

/// `sources` written back as one `--data` value (`a.parquet:0.7,b.jsonl:0.3`), for messages.
inline std::string data_mix_string(const std::vector<WeightedData>& sources) {
  std::string out;
  for (const auto& source : sources)
    out += (out.empty() ? "" : ",") + source.path.string() +
           (source.weight ? fmt::format(":{}", *source.weight) : std::string());
  return out;
}

}  // namespace hpctrain::text
