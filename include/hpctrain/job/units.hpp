#pragma once
// Memory sizes and time limits as Slurm reads them: `64_GiB` becomes `--mem=64G`, `2h` becomes
// `--time=0-02:00:00` (D-HH:MM:SS, the one format every Slurm release accepts without ambiguity).
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include <hpctrain/error.hpp>

namespace hpctrain {

/// An amount of memory, kept in MiB (Slurm's default unit).
struct Memory {
  std::uint64_t mebibytes = 0;
  friend constexpr bool operator==(Memory, Memory) = default;
};

namespace literals {
/// `512_MiB`
constexpr Memory operator""_MiB(unsigned long long n) { return Memory{n}; }
/// `64_GiB`
constexpr Memory operator""_GiB(unsigned long long n) { return Memory{n * 1024}; }
/// `1_TiB`
constexpr Memory operator""_TiB(unsigned long long n) { return Memory{n * 1024 * 1024}; }
}  // namespace literals

/// Memory as an sbatch value: the largest unit that divides it exactly (`64G`, `1536M`, `1T`).
inline std::string to_slurm(Memory memory) {
  const auto mib = memory.mebibytes;
  if (mib != 0 && mib % (1024 * 1024) == 0) return fmt::format("{}T", mib / (1024 * 1024));
  if (mib != 0 && mib % 1024 == 0) return fmt::format("{}G", mib / 1024);
  return fmt::format("{}M", mib);
}

/// A time limit in Slurm's `D-HH:MM:SS` form.
inline std::string format_slurm_time(std::chrono::seconds limit) {
  const auto total = limit.count();
  return fmt::format("{}-{:02}:{:02}:{:02}", total / 86400, total / 3600 % 24, total / 60 % 60, total % 60);
}

namespace detail {
inline bool parse_unsigned(std::string_view text, long long& out) {
  if (text.empty() || text.size() > 9) return false;
  out = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    out = out * 10 + (c - '0');
  }
  return true;
}
}  // namespace detail

/// Parses a size in bytes as nccl-tests' `-e` reads it, binary units: `1048576`, `8K`, `64M`, `1G`, or with `iB`
/// (`64MiB`, `1GiB`) or `B` (`8B`). Throws SpecError(`field`, ...) naming the value.
inline std::int64_t parse_bytes(std::string_view text, std::string_view field) {
  std::string_view number = text;
  std::int64_t scale = 1;
  for (auto [suffix, factor] : {std::pair<std::string_view, std::int64_t>{"KiB", 1 << 10},
                                {"MiB", 1 << 20},
                                {"GiB", 1 << 30},
                                {"K", 1 << 10},
                                {"M", 1 << 20},
                                {"G", 1 << 30},
                                {"B", 1}}) {
    if (number.size() > suffix.size() && number.ends_with(suffix)) {
      number.remove_suffix(suffix.size()), scale = factor;
      break;
    }
  }
  long long value = 0;
  if (!detail::parse_unsigned(number, value) || value == 0)
    throw SpecError(field, text.empty() ? std::string_view("\"\"") : text,
                    "expected a positive number of bytes, with K, M, G (KiB, MiB, GiB) or none");
  return static_cast<std::int64_t>(value) * scale;
}

/// One GPU's memory as `--gpu-memory` reads it.
struct GpuMemory {
  double bytes = 0;
  bool bare = false;  ///< a number without a unit: GiB, what --gpu-memory read before it took units
};

/// Parses one GPU's memory: a number with GB or TB (decimal, as GPUs are sold: an H100's `80GB` is 74.5 GiB), with
/// GiB or TiB (binary), or bare (GiB). Nothing when malformed or not above 0.
inline std::optional<GpuMemory> parse_gpu_memory(std::string_view text) {
  double scale = 1024.0 * 1024.0 * 1024.0;
  bool bare = true;
  for (auto [suffix, factor] : {std::pair<std::string_view, double>{"GiB", 1024.0 * 1024.0 * 1024.0},
                                {"TiB", 1024.0 * 1024.0 * 1024.0 * 1024.0},
                                {"GB", 1e9},
                                {"TB", 1e12}}) {
    if (text.size() > suffix.size() && text.ends_with(suffix)) {
      text.remove_suffix(suffix.size()), scale = factor, bare = false;
      break;
    }
  }
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || !(value > 0) || !std::isfinite(value))
    return std::nullopt;
  return GpuMemory{value * scale, bare};
}

/// Parses a command-line time limit: Slurm's forms (`MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`,
/// `D-HH:MM:SS`) or a number with a unit (`90s`, `30min`, `2h`, `1d`). Throws SpecError("time", ...).
inline std::chrono::seconds parse_slurm_time(std::string_view text) {
  const auto fail = [&] {
    return SpecError("time", text, "expected D-HH:MM:SS, HH:MM:SS, MM:SS, MM or a number with s/min/h/d");
  };
  long long value = 0;
  for (auto [suffix, scale] :
       {std::pair<std::string_view, long long>{"min", 60}, {"s", 1}, {"m", 60}, {"h", 3600}, {"d", 86400}}) {
    if (text.size() > suffix.size() && text.ends_with(suffix) &&
        detail::parse_unsigned(text.substr(0, text.size() - suffix.size()), value))
      return std::chrono::seconds(value * scale);
  }
  long long days = 0;
  std::string_view rest = text;
  const bool has_days = rest.find('-') != std::string_view::npos;
  if (has_days) {
    const auto dash = rest.find('-');
    if (!detail::parse_unsigned(rest.substr(0, dash), days)) throw fail();
    rest = rest.substr(dash + 1);
  }
  long long parts[3] = {0, 0, 0};
  int count = 0;
  while (true) {
    const auto colon = rest.find(':');
    if (count == 3 || !detail::parse_unsigned(rest.substr(0, colon), parts[count])) throw fail();
    ++count;
    if (colon == std::string_view::npos) break;
    rest = rest.substr(colon + 1);
  }
  long long seconds = 0;
  if (has_days) {  // D-HH, D-HH:MM, D-HH:MM:SS
    seconds = days * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2];
  } else if (count == 1) {  // MM
    seconds = parts[0] * 60;
  } else if (count == 2) {  // MM:SS
    seconds = parts[0] * 60 + parts[1];
  } else {  // HH:MM:SS
    seconds = parts[0] * 3600 + parts[1] * 60 + parts[2];
  }
  return std::chrono::seconds(seconds);
}

}  // namespace hpctrain
