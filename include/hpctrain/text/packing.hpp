#pragma once
// Packing examples into rows of a fixed capacity, as TRL's `pack_dataset(strategy="bfd")` does: best-fit
// decreasing — the longest example first, each into the fullest row it still fits in (a new row when none
// has room). Deterministic: ties in length are taken in index order, ties in room by the older row.
// Torch-free.
#include <algorithm>
#include <cstddef>
#include <map>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>

namespace hpctrain::text {

/// Rows of example indices whose lengths sum to at most `capacity`, by best-fit decreasing. SpecError
/// `[hpctrain.spec.packing.length]` for an example longer than `capacity` (truncate or drop it first).
inline std::vector<std::vector<std::size_t>> pack_best_fit_decreasing(const std::vector<std::size_t>& lengths,
                                                                      std::size_t capacity) {
  std::vector<std::size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<std::size_t>> rows;
  std::multimap<std::size_t, std::size_t> room;  // room left → row, in the order rows were opened
  for (const auto i : order) {
    if (lengths[i] > capacity)
      throw SpecError("packing.length", fmt::format("{} (example {})", lengths[i], i),
                      fmt::format("exceeds the row capacity {}", capacity));
    const auto fit = room.lower_bound(lengths[i]);  // the least room that still holds it: the best fit
    std::size_t row;
    if (fit == room.end()) {
      row = rows.size();
      rows.emplace_back();
    } else {
      row = fit->second;
      room.erase(fit);
    }
    rows[row].push_back(i);
    const std::size_t used = std::accumulate(rows[row].begin(), rows[row].end(), std::size_t{0},
                                             [&](std::size_t sum, std::size_t e) { return sum + lengths[e]; });
    if (used < capacity) room.emplace(capacity - used, row);
  }
  return rows;
}

/// The fraction of a batch's token slots that are padding: rows padded to `capacity` each.
inline double padding_fraction(const std::vector<std::vector<std::size_t>>& rows,
                               const std::vector<std::size_t>& lengths, std::size_t capacity) {
  if (rows.empty() || capacity == 0) return 0.0;
  std::size_t tokens = 0;
  for (const auto& row : rows)
    for (const auto e : row) tokens += lengths[e];
  return 1.0 - static_cast<double>(tokens) / static_cast<double>(rows.size() * capacity);
}

}  // namespace hpctrain::text
