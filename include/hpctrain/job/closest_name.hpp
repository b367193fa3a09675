#pragma once
// "Did you mean ...?": the candidate nearest a mistyped name by edit distance, for the knob table and the
// site file's keys and values.
#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hpctrain::detail {

/// Levenshtein distance (insertions, deletions, substitutions) between `a` and `b`.
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

/// The candidate closest to `name` when it is within 2 edits (more is another word, not a typo); the first
/// of equally close ones.
template <class Candidates>
std::optional<std::string> closest_name(std::string_view name, const Candidates& candidates) {
  std::optional<std::string> best;
  std::size_t best_distance = 3;
  for (const auto& candidate : candidates) {
    const auto d = edit_distance(name, candidate);
    if (d < best_distance) best = std::string(candidate), best_distance = d;
  }
  return best;
}

}  // namespace hpctrain::detail
