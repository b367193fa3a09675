#pragma once
// Hyper-parameter sweeps on job arrays: `Sweep().grid("lr", {3e-4, 1e-3}).grid("batch_size", {64, 128})` is
// four combinations, one array task each (`#SBATCH --array=0-3`, generated). Named configurations
// (`.configuration("small", {{"lr", 1e-3}, {"batch_size", 64}})`) are combinations too, crossed with the grid.
// A sweep varies the program's knobs (job/knobs.hpp) by name; before anything is written or queued every
// combination is checked with the same knob table the login parser uses (`resolve_sweep`). The script hands
// task i its values as `--name=value` words, each quoted for bash (render.hpp): a value never reaches a shell
// unquoted. Torch-free.
#include <algorithm>
#include <concepts>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/job/array.hpp>
#include <hpctrain/job/knobs.hpp>

namespace hpctrain {

/// One value a sweep gives a knob, written in the knob's own type (`3e-4`, `64`, `true`, `"adamw"`); kept as
/// the text the knob table parses, so an integer knob given 0.5 fails the check like `--batch-size 0.5` would.
class SweepValue {
 public:
  template <class T>
  requires(std::integral<T> || std::floating_point<T>) && (!std::same_as<T, bool>)SweepValue(T value)
      : text_(fmt::format("{}", value)) {}                     // NOLINT: implicit, for {3e-4, 1e-3}
  SweepValue(bool value) : text_(value ? "true" : "false") {}  // NOLINT
  SweepValue(const char* value) : text_(value) {}              // NOLINT
  SweepValue(std::string value) : text_(std::move(value)) {}   // NOLINT
  SweepValue(std::string_view value) : text_(value) {}         // NOLINT
  /// The value as the knob table reads it (`0.0003` for 3e-4: fmt's shortest exact form).
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

/// One combination: task `task` of the array runs with these knob values.
struct SweepCombination {
  int task = 0;
  std::string configuration;  ///< the named configuration it comes from; empty for a plain grid
  std::vector<std::pair<std::string, std::string>> values;  ///< (knob, value text), in declaration order

  /// `small lr=0.001 batch_size=64`: how messages and `--results` name it.
  std::string describe() const {
    std::string text = configuration;
    for (const auto& [knob, value] : values) text += fmt::format("{}{}={}", text.empty() ? "" : " ", knob, value);
    return text.empty() ? "(defaults)" : text;
  }
};

/// A hyper-parameter sweep: named configurations (or none) crossed with a grid (or none).
class Sweep {
 public:
  /// Adds knob `knob` with `values` to the grid: every combination so far is taken once with each value (the
  /// first knob varies slowest, like itertools.product). Throws SpecError `[hpctrain.spec.sweep]` for an empty
  /// list or a knob already in the grid.
  Sweep& grid(std::string knob, std::vector<SweepValue> values) {
    require_knob_name(knob);
    for (const auto& [name, listed] : grid_)
      detail::require(canonical(name) != canonical(knob), errors::spec_sweep, knob, "is in the grid twice");
    for (const auto& configuration : configurations_) forbid_overlap(configuration, knob);
    detail::require(!values.empty(), errors::spec_sweep, knob, "a grid needs at least one value");
    grid_.emplace_back(std::move(knob), std::move(values));
    return *this;
  }
  /// Adds a named configuration: its knob values go together. With a grid, every configuration is crossed
  /// with it. Throws SpecError `[hpctrain.spec.sweep]` for an empty or repeated name, a knob given twice, or a
  /// knob that is in the grid too.
  Sweep& configuration(std::string name, std::vector<std::pair<std::string, SweepValue>> values) {
    detail::require(!name.empty() && name.find_first_of(" \t\r\n") == std::string::npos, errors::spec_sweep,
                    name.empty() ? "\"\"" : name, "a configuration name is one word");
    for (const auto& existing : configurations_)
      detail::require(existing.name != name, errors::spec_sweep, name, "two configurations have this name");
    Configuration configuration{std::move(name), {}};
    for (auto& [knob, value] : values) {
      require_knob_name(knob);
      for (const auto& [seen, unused] : configuration.values)
        detail::require(canonical(seen) != canonical(knob), errors::spec_sweep,
                        fmt::format("{} {}", configuration.name, knob), "the configuration gives this knob twice");
      configuration.values.emplace_back(std::move(knob), value.text());
    }
    for (const auto& [knob, unused] : grid_) forbid_overlap(configuration, knob);
    configurations_.push_back(std::move(configuration));
    return *this;
  }
  /// At most `tasks` combinations run at once (`--array=0-N%tasks`). Default: as many as Slurm allows.
  Sweep& max_parallel(int tasks) {
    detail::require(tasks >= 1, errors::spec_sweep, fmt::format("max_parallel({})", tasks), "must be at least 1");
    max_parallel_ = tasks;
    return *this;
  }

  /// The number of combinations (array tasks).
  std::size_t size() const {
    std::size_t n = std::max<std::size_t>(configurations_.size(), 1);
    for (const auto& [knob, values] : grid_) n *= values.size();
    return n;
  }
  /// Every combination, task ids 0, 1, ... in order: configurations outermost, then the grid.
  std::vector<SweepCombination> combinations() const {
    std::vector<SweepCombination> all;
    const std::vector<Configuration> bases =
        configurations_.empty() ? std::vector<Configuration>{Configuration{}} : configurations_;
    for (const auto& base : bases) {
      std::vector<SweepCombination> partial = {SweepCombination{0, base.name, base.values}};
      for (const auto& [knob, values] : grid_) {
        std::vector<SweepCombination> next;
        for (const auto& combination : partial)
          for (const auto& value : values) {
            auto extended = combination;
            extended.values.emplace_back(knob, value.text());
            next.push_back(std::move(extended));
          }
        partial = std::move(next);
      }
      for (auto& combination : partial) {
        combination.task = static_cast<int>(all.size());
        all.push_back(std::move(combination));
      }
    }
    return all;
  }
  /// The array this sweep runs as: `0-<size-1>[%max_parallel]`.
  ArraySpec array() const {
    detail::require(!empty(), errors::spec_sweep, "Sweep()", "a sweep needs a grid or a configuration");
    detail::require(size() < static_cast<std::size_t>(slurm_max_array_size_limit), errors::spec_sweep, size(),
                    "combinations: more than a Slurm array can hold");
    const auto text = fmt::format("0-{}{}", size() - 1, max_parallel_ ? fmt::format("%{}", *max_parallel_) : "");
    return parse_array_spec(text);
  }
  /// Whether nothing was added.
  bool empty() const { return grid_.empty() && configurations_.empty(); }

 private:
  struct Configuration {
    std::string name;
    std::vector<std::pair<std::string, std::string>> values;
  };
  static std::string canonical(std::string_view name) { return knob_name(name); }
  static void require_knob_name(std::string_view knob) {
    detail::require(!knob.empty() && knob.find_first_of(" \t\r\n=") == std::string_view::npos, errors::spec_sweep,
                    knob.empty() ? "\"\"" : knob, "a knob name is one word without '='");
  }
  static void forbid_overlap(const Configuration& configuration, std::string_view knob) {
    for (const auto& [name, value] : configuration.values)
      detail::require(canonical(name) != canonical(knob), errors::spec_sweep, knob,
                      fmt::format("is both in the grid and in configuration {}", configuration.name));
  }

  std::vector<std::pair<std::string, std::vector<SweepValue>>> grid_;
  std::vector<Configuration> configurations_;
  std::optional<int> max_parallel_;
};

/// A sweep checked against a knob table: per task, the values as the table spells them and the worker
/// arguments (`--lr=0.0003`) the script passes.
struct ResolvedSweep {
  std::vector<SweepCombination> combinations;  ///< knob names canonical (`batch_size`), values re-spelled
  std::vector<std::vector<std::string>> args;  ///< per task: `--name=value` words
};

namespace detail {
/// The reason of an hpctrain error without its `[id] <subject>: ` prefix.
inline std::string reason_of(const Error& error, bool drop_subject) {
  std::string_view text = error.what();
  if (const auto bracket = text.find("] "); text.starts_with('[') && bracket != std::string_view::npos)
    text.remove_prefix(bracket + 2);
  if (drop_subject)
    if (const auto colon = text.find(": "); colon != std::string_view::npos) text.remove_prefix(colon + 2);
  return std::string(text);
}
}  // namespace detail

/// Checks every combination of `sweep` with `knobs` (the login parser's table): a knob the table does not
/// declare fails naming it (and the closest knob); a value the knob refuses fails naming the combination, the
/// knob and the value. Throws SpecError `[hpctrain.spec.sweep]`; nothing is written before this returns.
inline ResolvedSweep resolve_sweep(const Sweep& sweep, const Knobs& knobs) {
  ResolvedSweep resolved;
  resolved.combinations = sweep.combinations();
  // Undeclared knobs first: one message for the sweep, not one per combination.
  for (const auto& combination : resolved.combinations)
    for (const auto& [knob, value] : combination.values)
      if (knobs.find(knob) == nullptr) {
        try {
          knobs.validate(knob, value);
        } catch (const SpecError& error) {
          throw SpecError(errors::spec_sweep, fmt::format("sweep over {}", knob), detail::reason_of(error, true));
        }
      }
  for (auto& combination : resolved.combinations) {
    std::vector<std::string> args;
    const auto described = combination.describe();
    for (auto& [knob, value] : combination.values) {
      const KnobSpec& spec = *knobs.find(knob);
      try {
        value = detail::format_knob_value(knobs.validate(knob, value));
      } catch (const SpecError& error) {
        throw SpecError(errors::spec_sweep, fmt::format("sweep combination {} ({})", combination.task, described),
                        detail::reason_of(error, false));
      }
      knob = spec.name;
      args.push_back(fmt::format("{}={}", spec.flag(), value));
    }
    resolved.args.push_back(std::move(args));
  }
  return resolved;
}

/// The same without a knob table (a render in a test, a torch-free program with its own worker protocol): the
/// values are passed as written, unchecked.
inline ResolvedSweep unchecked_sweep(const Sweep& sweep) {
  ResolvedSweep resolved;
  resolved.combinations = sweep.combinations();
  for (const auto& combination : resolved.combinations) {
    std::vector<std::string> args;
    for (const auto& [knob, value] : combination.values) {
      args.push_back(fmt::format("{}={}", knob_flag(knob), value));
    }
    resolved.args.push_back(std::move(args));
  }
  return resolved;
}

}  // namespace hpctrain
