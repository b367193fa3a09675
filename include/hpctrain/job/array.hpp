#pragma once
// Job arrays: `Job::array("0-15%4")` becomes `#SBATCH --array=0-15%4`. The spec is checked as Slurm reads it
// (comma-separated indices `N`, ranges `N-M`, steps `N-M:S`, an optional `%T` throttle at the end) when it
// is set, and against the cluster's MaxArraySize (`scontrol show config`) before submitting. Each task logs to
// `hpctrain-jobs/<name>/<array id>/slurm-<array id>_<task>.out` and runs in `<array id>/<array id>_<task>/`.
#include <algorithm>
#include <charconv>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>

namespace hpctrain {

/// A parsed `--array` value.
struct ArraySpec {
  std::string text;             ///< as written (what `--array=` gets)
  std::vector<int> indices;     ///< the task ids, ascending, without repeats
  std::optional<int> throttle;  ///< `%T`: at most T tasks run at once
  /// The highest task id.
  int max_index() const { return indices.empty() ? 0 : indices.back(); }
};

/// Slurm's own ceiling on MaxArraySize (slurm.conf(5): "must be less than 4000001").
inline constexpr int slurm_max_array_size_limit = 4000001;

namespace detail {
inline bool parse_array_number(std::string_view text, int& value) {
  if (text.empty() || text.size() > 9) return false;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size() && value >= 0;
}
}  // namespace detail

/// Parses an array spec; throws SpecError(`array`) naming the spec, the part and the reason.
inline ArraySpec parse_array_spec(std::string_view text) {
  const auto fail = [&](std::string_view reason) { throw SpecError("array", text.empty() ? "\"\"" : text, reason); };
  if (text.empty()) fail("expected task ids like 0-15, 1,3,5, 0-30:10 or 0-15%4");
  ArraySpec spec;
  spec.text = std::string(text);
  std::string_view list = text;
  if (const auto percent = text.find('%'); percent != std::string_view::npos) {
    int throttle = 0;
    if (!detail::parse_array_number(text.substr(percent + 1), throttle) || throttle < 1)
      fail(fmt::format("the throttle after % must be a whole number >= 1, got '{}'", text.substr(percent + 1)));
    spec.throttle = throttle;
    list = text.substr(0, percent);
  }
  std::set<int> indices;
  std::size_t begin = 0;
  while (begin <= list.size()) {
    const auto comma = list.find(',', begin);
    const auto part = list.substr(begin, comma == std::string_view::npos ? std::string_view::npos : comma - begin);
    begin = comma == std::string_view::npos ? list.size() + 1 : comma + 1;
    if (part.empty()) fail("an empty task id between commas");
    std::string_view range = part;
    int step = 1;
    if (const auto colon = part.find(':'); colon != std::string_view::npos) {
      if (!detail::parse_array_number(part.substr(colon + 1), step) || step < 1)
        fail(fmt::format("'{}': the step after : must be a whole number >= 1", part));
      range = part.substr(0, colon);
      if (range.find('-') == std::string_view::npos) fail(fmt::format("'{}': a step needs a range (0-30:10)", part));
    }
    int first = 0, last = 0;
    if (const auto dash = range.find('-'); dash != std::string_view::npos) {
      if (!detail::parse_array_number(range.substr(0, dash), first) ||
          !detail::parse_array_number(range.substr(dash + 1), last))
        fail(fmt::format("'{}': expected a range of whole numbers N-M", part));
      if (first > last) fail(fmt::format("'{}': the range ends before it starts", part));
    } else {
      if (!detail::parse_array_number(range, first)) fail(fmt::format("'{}': expected a whole number >= 0", part));
      last = first;
    }
    if (last >= slurm_max_array_size_limit)
      fail(fmt::format("'{}': Slurm's task ids stay below {}", part, slurm_max_array_size_limit));
    for (long long i = first; i <= last; i += step) indices.insert(static_cast<int>(i));
  }
  spec.indices.assign(indices.begin(), indices.end());
  return spec;
}

/// Throws SpecError(`array`) when a task id reaches the cluster's MaxArraySize (ids must stay below it).
inline void check_array_against_max_size(const ArraySpec& spec, int max_array_size) {
  detail::require(spec.max_index() < max_array_size, "array", spec.text,
                  fmt::format("task id {} is not below this cluster's MaxArraySize ({}; scontrol show config)",
                              spec.max_index(), max_array_size));
}

/// Expands a task list as scontrol prints it for pending tasks (`2-7%2`, `1,3,5`, `0-30:10`).
inline std::vector<int> expand_task_list(std::string_view text) {
  try {
    return parse_array_spec(text).indices;
  } catch (const SpecError&) {
    return {};
  }
}

}  // namespace hpctrain
