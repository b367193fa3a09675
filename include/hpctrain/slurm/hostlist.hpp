#pragma once
// Slurm's hostlist grammar, written here instead of linking libslurm: a user's binary must not be tied to
// one Slurm release's ABI. Tested against `scontrol show hostnames` / `scontrol show hostlist` of the
// local Slurm (tests/slurm/hostlist_oracle_test.cpp). Grammar and the few deliberate differences from
// Slurm 22.05 are in docs/slurm.md.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>

namespace hpctrain::slurm {

/// A malformed hostlist expression: `[hpctrain.runtime.hostlist] hostlist "<expr>": <reason> at position <n>`.
class HostlistError : public RuntimeError {
 public:
  HostlistError(std::string_view expression, std::size_t position, std::string_view reason)
      : RuntimeError(errors::runtime_hostlist,
                     fmt::format("hostlist \"{}\": {} at position {}", expression, reason, position)),
        expression_(expression),
        position_(position) {}
  /// The whole expression that failed to parse.
  const std::string& expression() const noexcept { return expression_; }
  /// 0-based offset of the offending character in expression().
  std::size_t position() const noexcept { return position_; }

 private:
  std::string expression_;
  std::size_t position_;
};

/// Slurm refuses ranges of more than this many hosts (its MAX_RANGE); so do we.
inline constexpr std::uint64_t max_hosts_per_range = 64 * 1024;
/// Several bracket groups multiply: an item, and a whole list, may expand to at most this many hosts (no cluster is
/// bigger).
inline constexpr std::uint64_t max_hosts_per_item = 1024 * 1024;

namespace detail {

inline bool is_digit(char c) { return c >= '0' && c <= '9'; }
// Slurm splits hostlists on commas and on whitespace (`scontrol show hostnames "n1 n2"` gives two hosts).
inline bool is_separator(char c) { return c == ',' || c == ' ' || c == '\t' || c == '\n'; }

struct NumberRange {
  std::uint64_t low = 0, high = 0;
  int width = 0;  // digits of the low bound as written: Slurm zero-pads every member to it
};

// One bracket group's contents, e.g. "01-03,7"; `offset` is where `body` starts in `expression`.
inline std::vector<NumberRange> parse_bracket(std::string_view expression, std::string_view body, std::size_t offset) {
  std::vector<NumberRange> ranges;
  std::size_t i = 0;
  auto number = [&](std::uint64_t& value, int& width) {
    const std::size_t start = i;
    value = 0;
    while (i < body.size() && is_digit(body[i])) {
      const auto digit = static_cast<std::uint64_t>(body[i] - '0');
      if (value > (UINT64_MAX - digit) / 10) throw HostlistError(expression, offset + start, "number too large");
      value = value * 10 + digit;
      ++i;
    }
    if (i == start) {
      throw HostlistError(
          expression, offset + i,
          i < body.size() ? fmt::format("expected a number, found '{}'", body[i]) : std::string("expected a number"));
    }
    width = static_cast<int>(i - start);
  };
  for (;;) {
    const std::size_t range_start = i;
    NumberRange range;
    number(range.low, range.width);
    range.high = range.low;
    if (i < body.size() && body[i] == '-') {
      ++i;
      int high_width = 0;
      number(range.high, high_width);
      if (range.high < range.low) {
        throw HostlistError(expression, offset + range_start,
                            fmt::format("descending range {}", body.substr(range_start, i - range_start)));
      }
      if (range.high - range.low >= max_hosts_per_range) {
        throw HostlistError(expression, offset + range_start,
                            fmt::format("range {} has more than {} hosts", body.substr(range_start, i - range_start),
                                        max_hosts_per_range));
      }
    }
    ranges.push_back(range);
    if (i == body.size()) return ranges;
    if (body[i] != ',')
      throw HostlistError(expression, offset + i, fmt::format("unexpected '{}' in brackets", body[i]));
    ++i;
  }
}

// Expands one item such as "rack[1-2]-n[01-02]" (bracket groups form a cartesian product) and appends the hosts.
inline void expand_item(std::string_view expression, std::size_t item_start, std::string_view item,
                        std::vector<std::string>& hosts) {
  // Split into literal text and bracket groups.
  std::vector<std::string> literals(1);
  std::vector<std::vector<NumberRange>> groups;
  for (std::size_t i = 0; i < item.size(); ++i) {
    if (item[i] == ']') throw HostlistError(expression, item_start + i, "']' without '['");
    if (item[i] != '[') {
      literals.back() += item[i];
      continue;
    }
    const std::size_t close = item.find_first_of("[]", i + 1);
    if (close == std::string_view::npos) throw HostlistError(expression, item_start + i, "unclosed '['");
    if (item[close] == '[') throw HostlistError(expression, item_start + close, "'[' inside brackets");
    groups.push_back(parse_bracket(expression, item.substr(i + 1, close - i - 1), item_start + i + 1));
    literals.emplace_back();
    i = close;
  }
  if (groups.empty()) {
    hosts.push_back(literals.front());
    return;
  }
  // Odometer over the groups' members: the last group varies fastest.
  std::vector<std::vector<std::string>> members;
  std::uint64_t total = 1;
  for (const auto& group : groups) {
    std::uint64_t size = 0;
    for (const auto& range : group) size += range.high - range.low + 1;
    if (total > max_hosts_per_item / size) {
      throw HostlistError(expression, item_start, fmt::format("expands to more than {} hosts", max_hosts_per_item));
    }
    total *= size;
  }
  // The whole list obeys the same bound: many items of 64k hosts each took gigabytes before
  // (tests/fuzz/corpus/hostlist/items_beyond_any_cluster).
  if (total > max_hosts_per_item - std::min<std::uint64_t>(hosts.size(), max_hosts_per_item)) {
    throw HostlistError(expression, item_start,
                        fmt::format("the list expands to more than {} hosts", max_hosts_per_item));
  }
  for (const auto& group : groups) {
    std::vector<std::string> names;
    for (const auto& range : group)
      for (std::uint64_t n = range.low;; ++n) {
        names.push_back(fmt::format("{:0{}}", n, range.width));
        if (n == range.high) break;
      }
    members.push_back(std::move(names));
  }
  // Slurm's order: the last group varies fastest, then the first, the second, ... and the one before the
  // last slowest (its _push_range_list recurses on the prefix's last bracket). With one or two groups
  // that is the plain cartesian order.
  std::vector<std::size_t> fastest_first{members.size() - 1};
  for (std::size_t g = 0; g + 1 < members.size(); ++g) fastest_first.push_back(g);
  std::vector<std::size_t> index(members.size(), 0);
  for (;;) {
    std::string host = literals[0];
    for (std::size_t g = 0; g < members.size(); ++g) host += members[g][index[g]] + literals[g + 1];
    hosts.push_back(std::move(host));
    std::size_t carry = 0;
    for (; carry < fastest_first.size(); ++carry) {
      const std::size_t g = fastest_first[carry];
      if (++index[g] < members[g].size()) break;
      index[g] = 0;
    }
    if (carry == fastest_first.size()) return;
  }
}

// A host name split as Slurm compresses it: the trailing digits are the number, the rest the prefix.
struct NumberedHost {
  std::string_view prefix, digits;
};

inline NumberedHost split_trailing_number(std::string_view host) {
  std::size_t start = host.size();
  while (start > 0 && is_digit(host[start - 1])) --start;
  // Numbers beyond 64 bits cannot be ranged; such names stay literal.
  if (host.size() - start > 19) start = host.size();
  return {host.substr(0, start), host.substr(start)};
}

inline std::uint64_t to_number(std::string_view digits) {
  std::uint64_t value = 0;
  for (char c : digits) value = value * 10 + static_cast<std::uint64_t>(c - '0');
  return value;
}

}  // namespace detail

/// Expands a Slurm hostlist (`n[01-03,7],login1 rack[1-2]-n[1-2]`) into host names, in order, duplicates kept.
/// Throws HostlistError naming the expression and the position for malformed input (`n[1-`, `n[3-1]`).
inline std::vector<std::string> expand_hostlist(std::string_view expression) {
  std::vector<std::string> hosts;
  std::size_t i = 0;
  while (i < expression.size()) {
    if (detail::is_separator(expression[i])) {
      ++i;
      continue;
    }
    // An item ends at a separator outside brackets.
    const std::size_t start = i;
    bool in_bracket = false;
    while (i < expression.size() && (in_bracket || !detail::is_separator(expression[i]))) {
      if (expression[i] == '[') in_bracket = true;
      if (expression[i] == ']') in_bracket = false;
      ++i;
    }
    detail::expand_item(expression, start, expression.substr(start, i - start), hosts);
  }
  return hosts;
}

/// The shortest hostlist Slurm would write for `hosts` in this order (as `scontrol show hostlist`):
/// consecutive hosts with the same prefix share one bracket, ascending runs become ranges; order and
/// duplicates are kept, so expand_hostlist(compress_hostlist(h)) == h.
inline std::string compress_hostlist(const std::vector<std::string>& hosts) {
  for (const auto& host : hosts) {
    const auto bad = host.find_first_of("[], \t\n");
    if (host.empty() || bad != std::string::npos) {
      throw HostlistError(host, host.empty() ? 0 : bad, "not a host name");
    }
  }
  struct Range {
    std::uint64_t low, high;
    int width;
  };
  std::string out;
  std::size_t i = 0;
  while (i < hosts.size()) {
    const auto first = detail::split_trailing_number(hosts[i]);
    if (!out.empty()) out += ',';
    if (first.digits.empty()) {
      out += hosts[i++];
      continue;
    }
    std::vector<Range> ranges;
    std::size_t count = 0;
    for (; i < hosts.size(); ++i, ++count) {
      const auto next = detail::split_trailing_number(hosts[i]);
      if (next.digits.empty() || next.prefix != first.prefix) break;
      const auto value = detail::to_number(next.digits);
      // Extend the open range only when the next number written at the range's width is this host's text
      // (n9,n10 -> n[9-10]; n001,n002,n3 -> n[001-002,3] as Slurm writes it).
      // A range stops at Slurm's MAX_RANGE so that the result expands again.
      if (!ranges.empty() && ranges.back().high != UINT64_MAX && value == ranges.back().high + 1 &&
          ranges.back().high - ranges.back().low + 1 < max_hosts_per_range &&
          fmt::format("{:0{}}", value, ranges.back().width) == next.digits) {
        ranges.back().high = value;
      } else {
        ranges.push_back({value, value, static_cast<int>(next.digits.size())});
      }
    }
    out += first.prefix;
    if (count == 1) {
      out += fmt::format("{:0{}}", ranges[0].low, ranges[0].width);
      continue;
    }
    out += '[';
    for (std::size_t r = 0; r < ranges.size(); ++r) {
      if (r > 0) out += ',';
      out += fmt::format("{:0{}}", ranges[r].low, ranges[r].width);
      if (ranges[r].high != ranges[r].low) out += fmt::format("-{:0{}}", ranges[r].high, ranges[r].width);
    }
    out += ']';
  }
  return out;
}

}  // namespace hpctrain::slurm
