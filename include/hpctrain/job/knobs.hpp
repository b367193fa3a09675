#pragma once
// The knob table: every value a user may change on the command line without recompiling (`--lr 3e-4`,
// `--warmup-steps 200`). One table drives the login parser (an unknown or invalid knob fails before
// anything is written or queued), the worker parser (the same arguments, forwarded by the script) and
// `--help`; a sweep varies knobs by name and validates every combination with `validate`. Torch-free:
// the training layer declares its built-ins and the user's knobs here, the job layer only checks them.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/job/closest_name.hpp>

namespace hpctrain {

/// A knob's value: an integer, a real number, a switch or a text.
using KnobValue = std::variant<std::int64_t, double, bool, std::string>;

/// The C++ types a knob can have (`int` and other integers are stored as std::int64_t).
template <class T>
concept KnobType = std::same_as<T, bool> || std::integral<T> || std::floating_point<T> || std::same_as<T, std::string>;

namespace detail {
template <class T>
using stored_knob_t =
    std::conditional_t<std::same_as<T, bool>, bool,
                       std::conditional_t<std::integral<T>, std::int64_t,
                                          std::conditional_t<std::floating_point<T>, double, std::string>>>;

inline std::string_view knob_type_name(const KnobValue& value) {
  constexpr std::string_view names[] = {"an integer", "a number", "true or false", "a text"};
  return names[value.index()];
}

inline std::string format_knob_value(const KnobValue& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::same_as<V, bool>) return v ? "true" : "false";
        else if constexpr (std::same_as<V, std::string>) return v;
        else return fmt::format("{}", v);
      },
      value);
}
}  // namespace detail

/// A check on a knob's value with the requirement it states (`must be positive`), as the error says it.
template <class T>
class KnobCheck {
 public:
  /// Accepts every value.
  KnobCheck() = default;
  /// `ok(value)` decides; `requirement` is the reason an error gives ("must be a power of two").
  template <class Predicate>
  requires std::predicate<Predicate, const T&> KnobCheck(
      Predicate ok, std::string requirement = "rejected by the knob's check")  // NOLINT: implicit on purpose
      : ok_(std::move(ok)), requirement_(std::move(requirement)) {}

  /// The requirement when `value` fails the check, else nothing.
  std::optional<std::string> failure(const T& value) const {
    if (!ok_ || ok_(value)) return std::nullopt;
    return requirement_;
  }
  /// The requirement in words; empty when every value is accepted.
  const std::string& requirement() const { return requirement_; }

 private:
  std::function<bool(const T&)> ok_;
  std::string requirement_;
};

/// Numeric checks usable for any numeric knob: `ht::positive()`, `ht::at_least(1)`, `ht::between(0, 1)`.
struct NumericBounds {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_inclusive = true;
  std::string requirement;
  template <class T>
  requires(std::integral<T> || std::floating_point<T>) &&
      (!std::same_as<T, bool>)operator KnobCheck<T>() const {  // NOLINT: converts where a check is expected
    const auto bounds = *this;
    return KnobCheck<T>(
        [bounds](const T& value) {
          const auto v = static_cast<double>(value);
          return (bounds.min_inclusive ? v >= bounds.min : v > bounds.min) && v <= bounds.max;
        },
        requirement);
  }
};
/// Greater than zero.
inline NumericBounds positive() { return {0, std::numeric_limits<double>::infinity(), false, "must be positive"}; }
/// Zero or more.
inline NumericBounds non_negative() {
  return {0, std::numeric_limits<double>::infinity(), true, "must not be negative"};
}
/// `minimum` or more.
inline NumericBounds at_least(double minimum) {
  return {minimum, std::numeric_limits<double>::infinity(), true, fmt::format("must be at least {}", minimum)};
}
/// Between `low` and `high`, both included.
inline NumericBounds between(double low, double high) {
  return {low, high, true, fmt::format("must be between {} and {}", low, high)};
}

/// `--warmup-steps` for knob `warmup_steps`: the one place a knob's name becomes its flag.
inline std::string knob_flag(std::string_view name) {
  std::string flag = "--" + std::string(name);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}
/// `warmup_steps` for `warmup-steps` (a flag without its dashes) or `warmup_steps`: the way back.
inline std::string knob_name(std::string_view name_or_flag) {
  std::string name(name_or_flag);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

/// One row of the table.
struct KnobSpec {
  std::string name;         ///< snake_case: `warmup_steps`; the flag is `--warmup-steps`
  std::string help;         ///< one line for `--help`
  KnobValue default_value;  ///< also fixes the type
  bool has_default = true;  ///< false: the description decides when the knob is not given
  std::string requirement;  ///< the check in words, for `--help`
  std::function<std::optional<std::string>(const KnobValue&)> check;  ///< the requirement when it fails
  /// The text a bare `--name` stands for, for a knob whose value may be left out (`--wandb [PROJECT]`); a
  /// switch's bare flag is `true` without it.
  std::optional<std::string> bare_value;
  std::string placeholder;  ///< `--help`'s name for the value (`[PROJECT]`); empty: by type
  /// The chain stage this row sets alone (`--dpo.lr`, job/stage_knobs.hpp); empty: a row of the whole program.
  std::string stage;

  /// `--warmup-steps` for `warmup_steps`.
  std::string flag() const { return knob_flag(name); }
};

/// The knob table and, once arguments were read, the values given.
class Knobs {
 public:
  /// Declares knob `name` of type T with its default, one line of help and a check. Throws SpecError
  /// `[hpctrain.spec.knob]` for a malformed or repeated name or a default that fails its own check.
  template <KnobType T>
  Knobs& declare(std::string name, T default_value, std::string help, KnobCheck<T> check = {}) {
    return add<T>(std::move(name), std::optional<T>(std::move(default_value)), std::move(help), std::move(check));
  }
  /// Declares a knob without a default: when it is not given, the program's own value applies.
  template <KnobType T>
  Knobs& declare_optional(std::string name, std::string help, KnobCheck<T> check = {}) {
    return add<T>(std::move(name), std::nullopt, std::move(help), std::move(check));
  }

  /// Appends `other`'s rows (a program's own knobs after the built-ins). A row both have with the same type and
  /// help is kept once (a table extended again); another row with a name this one has is a SpecError.
  Knobs& extend(const Knobs& other) {
    for (const auto& spec : other.specs_) {
      if (const auto* mine = find(spec.name)) {
        if (mine->help == spec.help && mine->default_value.index() == spec.default_value.index()) continue;
        throw SpecError(errors::spec_knob, spec.name, "is declared twice (a built-in knob has this name)");
      }
      specs_.push_back(spec);
    }
    for (const auto& [name, value] : other.values_) values_[name] = value;
    return *this;
  }

  /// Appends `spec` as it is (a chain's table, job/stage_knobs.hpp, copies its stages' rows). Throws SpecError
  /// `[hpctrain.spec.knob]` for a name the table has.
  Knobs& add_row(KnobSpec spec) {
    if (find(spec.name) != nullptr) throw SpecError(errors::spec_knob, spec.name, "is declared twice");
    specs_.push_back(std::move(spec));
    return *this;
  }

  /// The row of `name` (snake_case, or its flag spelling `warmup-steps`), or nullptr.
  const KnobSpec* find(std::string_view name) const {
    const auto key = canonical(name);
    for (const auto& spec : specs_)
      if (spec.name == key) return &spec;
    return nullptr;
  }
  /// Every row, in declaration order.
  const std::vector<KnobSpec>& specs() const { return specs_; }

  /// Parses `text` as knob `name`'s type and checks it. Throws SpecError `[hpctrain.spec.knob]` naming the
  /// knob, the value and the reason — the entry point a sweep uses for every combination.
  KnobValue validate(std::string_view name, std::string_view text) const {
    const KnobSpec& spec = require_known(name);
    auto value = parse_as(spec, text);
    if (auto failure = spec.check ? spec.check(value) : std::nullopt) throw knob_error(spec, text, *failure);
    return value;
  }
  /// Sets knob `name` from text (validated).
  Knobs& set(std::string_view name, std::string_view text) {
    auto value = validate(name, text);
    values_[require_known(name).name] = std::move(value);
    return *this;
  }
  /// Sets knob `name` from a value of its type (validated); a text goes through the text overload above.
  template <KnobType T>
  requires(!std::convertible_to<T, std::string_view>) Knobs& set(std::string_view name, T value) {
    const KnobSpec& spec = require_known(name);
    KnobValue stored = detail::stored_knob_t<T>(std::move(value));
    if (stored.index() != spec.default_value.index())
      throw knob_error(spec, detail::format_knob_value(stored),
                       fmt::format("expected {}", detail::knob_type_name(spec.default_value)));
    if (auto failure = spec.check ? spec.check(stored) : std::nullopt)
      throw knob_error(spec, detail::format_knob_value(stored), *failure);
    values_[spec.name] = std::move(stored);
    return *this;
  }
  /// Makes `value` knob `name`'s default (checked as a given value is): a description that sets in code what a
  /// knob also sets shows it as the knob's default (`--help`), and the command line still overrides it.
  template <KnobType T>
  Knobs& set_default(std::string_view name, T value) {
    const KnobSpec& spec = require_known(name);
    KnobValue stored = detail::stored_knob_t<T>(std::move(value));
    if (stored.index() != spec.default_value.index())
      throw knob_error(spec, detail::format_knob_value(stored),
                       fmt::format("expected {}", detail::knob_type_name(spec.default_value)));
    if (auto failure = spec.check ? spec.check(stored) : std::nullopt)
      throw knob_error(spec, detail::format_knob_value(stored), "its default " + *failure);
    auto& row = *std::find_if(specs_.begin(), specs_.end(), [&](const KnobSpec& r) { return r.name == spec.name; });
    row.default_value = std::move(stored);
    row.has_default = true;
    return *this;
  }
  /// Lets `--name` be given without a value, standing for `value` (checked as a given value is); `placeholder`
  /// names the value in `--help`: `allow_bare("wandb", "fashion", "[PROJECT]")`.
  Knobs& allow_bare(std::string_view name, std::string value, std::string placeholder) {
    const KnobSpec& spec = require_known(name);
    if (auto failure = spec.check ? spec.check(parse_as(spec, value)) : std::nullopt)
      throw knob_error(spec, value, "its value without an argument " + *failure);
    auto& row = *std::find_if(specs_.begin(), specs_.end(), [&](const KnobSpec& r) { return r.name == spec.name; });
    row.bare_value = std::move(value);
    row.placeholder = std::move(placeholder);
    return *this;
  }
  /// Whether `name` was given (on the command line or through `set`).
  bool given(std::string_view name) const { return values_.count(canonical(name)) != 0; }

  /// The value of `name`: as given, else its default. Throws SpecError `[hpctrain.spec.knob]` for an unknown
  /// knob, a type that is not the declared one, or a knob without default that was not given.
  template <KnobType T>
  T get(std::string_view name) const {
    const KnobSpec& spec = require_known(name);
    const auto at = values_.find(spec.name);
    if (at == values_.end() && !spec.has_default)
      throw knob_error(spec, "(not given)", "has no default; check given() first");
    const KnobValue& value = at != values_.end() ? at->second : spec.default_value;
    using Stored = detail::stored_knob_t<T>;
    if (!std::holds_alternative<Stored>(value))
      throw knob_error(spec, detail::format_knob_value(value),
                       fmt::format("is {}; get<{}> asks for another type", detail::knob_type_name(value),
                                   detail::knob_type_name(KnobValue(Stored{}))));
    return static_cast<T>(std::get<Stored>(value));
  }
  /// The value of `name`: as given, else its default; nothing for a knob without default that was not given.
  std::optional<KnobValue> value(std::string_view name) const {
    const KnobSpec& spec = require_known(name);
    if (const auto at = values_.find(spec.name); at != values_.end()) return at->second;
    if (spec.has_default) return spec.default_value;
    return std::nullopt;
  }
  /// The value of `name` when given, else nothing (the description's value applies).
  template <KnobType T>
  std::optional<T> get_if_given(std::string_view name) const {
    if (!given(name)) return std::nullopt;
    return get<T>(name);
  }

  /// Reads `--name value`, `--name=value` and, for a switch or a knob that allows it, a bare `--name` (followed by
  /// nothing or by another `--` argument); returns a copy holding the
  /// values. Throws UsageError for an unknown argument (naming it, and the closest knob) or a missing value,
  /// and SpecError `[hpctrain.spec.knob]` for an invalid value.
  Knobs with_arguments(const std::vector<std::string>& args) const {
    Knobs parsed = *this;
    for (std::size_t i = 0; i < args.size(); ++i) {
      const std::string& arg = args[i];
      if (!arg.starts_with("--") || arg.size() == 2) throw unknown_argument(arg);
      const auto equals = arg.find('=');
      const std::string flag = arg.substr(0, equals);
      const KnobSpec* spec = find(std::string_view(flag).substr(2));
      if (spec == nullptr) throw unknown_argument(flag);
      if (equals != std::string::npos) {
        parsed.set(spec->name, std::string_view(arg).substr(equals + 1));
      } else if (std::holds_alternative<bool>(spec->default_value)) {
        parsed.set(spec->name, "true");
      } else if (spec->bare_value && (i + 1 == args.size() || args[i + 1].starts_with("--"))) {
        parsed.set(spec->name, *spec->bare_value);
      } else {
        if (i + 1 == args.size())
          throw UsageError(fmt::format("{} needs a value ({})", flag, detail::knob_type_name(spec->default_value)));
        parsed.set(spec->name, args[++i]);
      }
    }
    return parsed;
  }
  /// The given values as arguments (`--lr 0.001`), what a login command forwards to its workers.
  std::vector<std::string> arguments() const {
    std::vector<std::string> args;
    for (const auto& spec : specs_) {
      const auto at = values_.find(spec.name);
      if (at == values_.end()) continue;
      args.push_back(fmt::format("{}={}", spec.flag(), detail::format_knob_value(at->second)));
    }
    return args;
  }

  /// The `--help` section: one line per knob with its type, default and requirement.
  std::string help() const {
    if (specs_.empty()) return "";
    std::string text = "Training knobs (checked here before anything is written or queued; read by the workers):\n";
    std::vector<std::string> stages;
    for (const auto& spec : specs_) {
      if (!spec.stage.empty()) {  // a chain's per-stage rows: one paragraph below, not a line each
        if (std::find(stages.begin(), stages.end(), spec.stage) == stages.end()) stages.push_back(spec.stage);
        continue;
      }
      const std::string left = fmt::format(
          "  {} {}", spec.flag(), spec.placeholder.empty() ? placeholder(spec.default_value) : spec.placeholder);
      std::string right = spec.help;
      std::vector<std::string> notes;
      if (spec.has_default) notes.push_back("default: " + detail::format_knob_value(spec.default_value));
      if (!spec.requirement.empty()) notes.push_back(spec.requirement);
      if (!notes.empty()) right += fmt::format(" ({})", fmt::join(notes, "; "));
      // A flag wider than the column gets its own line, its text below it in the column.
      text +=
          left.size() < 30 ? fmt::format("{:<30}{}\n", left, right) : fmt::format("{}\n{:<30}{}\n", left, "", right);
    }
    if (!stages.empty())
      text += fmt::format(
          "A knob above applies to every stage that has it; --<stage>.<knob> sets it for one stage of the chain "
          "({}) and wins there: --{}.{} {}\n",
          fmt::join(stages, ", "), stages.back(), knob_flag(specs_.front().name).substr(2),
          specs_.front().placeholder.empty() ? placeholder(specs_.front().default_value) : specs_.front().placeholder);
    return text;
  }

 private:
  template <class T>
  Knobs& add(std::string name, std::optional<T> default_value, std::string help, KnobCheck<T> check) {
    using Stored = detail::stored_knob_t<T>;
    const bool well_formed = !name.empty() && name.front() >= 'a' && name.front() <= 'z' &&
                             std::all_of(name.begin(), name.end(), [](char c) {
                               return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
                             });
    if (!well_formed) throw SpecError(errors::spec_knob, name, "a knob name is snake_case: [a-z][a-z0-9_]*");
    if (find(name) != nullptr) throw SpecError(errors::spec_knob, name, "is declared twice");
    KnobSpec spec;
    spec.name = std::move(name);
    spec.help = std::move(help);
    spec.default_value = default_value ? KnobValue(Stored(*default_value)) : KnobValue(Stored{});
    spec.has_default = default_value.has_value();
    spec.requirement = check.requirement();
    spec.check = [check = std::move(check)](const KnobValue& value) -> std::optional<std::string> {
      return check.failure(static_cast<T>(std::get<Stored>(value)));
    };
    if (default_value)
      if (auto failure = spec.check(spec.default_value))
        throw knob_error(spec, detail::format_knob_value(spec.default_value), "its default " + *failure);
    specs_.push_back(std::move(spec));
    return *this;
  }

  static std::string canonical(std::string_view name) { return knob_name(name); }
  static std::string placeholder(const KnobValue& value) {
    constexpr std::string_view names[] = {"N", "X", "[true|false]", "TEXT"};
    return std::string(names[value.index()]);
  }

  const KnobSpec& require_known(std::string_view name) const {
    if (const auto* spec = find(name)) return *spec;
    throw SpecError(errors::spec_knob, name, fmt::format("no such knob{}", closest_hint(name)));
  }

  static SpecError knob_error(const KnobSpec& spec, std::string_view value, std::string_view reason) {
    return SpecError(errors::spec_knob, fmt::format("{} = {}", spec.flag(), value), reason);
  }

  static KnobValue parse_as(const KnobSpec& spec, std::string_view text) {
    const auto expected = [&] {
      return knob_error(spec, text.empty() ? "\"\"" : text,
                        fmt::format("expected {}", detail::knob_type_name(spec.default_value)));
    };
    switch (spec.default_value.index()) {
      case 0: {
        std::int64_t value = 0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (error != std::errc() || end != text.data() + text.size()) throw expected();
        return value;
      }
      case 1: {
        // std::from_chars for double is missing from libstdc++ < 11's headers on some systems: strtod on a copy.
        const std::string copy(text);
        char* end = nullptr;
        const double value = copy.empty() ? 0 : std::strtod(copy.c_str(), &end);
        if (copy.empty() || end != copy.c_str() + copy.size() || !std::isfinite(value)) throw expected();
        return value;
      }
      case 2:
        if (text == "true" || text == "1" || text == "yes" || text == "on") return true;
        if (text == "false" || text == "0" || text == "no" || text == "off") return false;
        throw expected();
      default: return std::string(text);
    }
  }

  // The knob closest to `name` by edit distance, when it is close enough to be a typo; or, for a name of
  // transformers' TrainingArguments / TRL (what a user coming from `srun torchrun train.py` types), the knob
  // that means the same here.
  std::string closest_hint(std::string_view name) const {
    static const std::pair<std::string_view, std::string_view> other_spellings[] = {
        {"learning_rate", "lr"},
        {"num_train_epochs", "epochs"},
        {"per_device_train_batch_size", "batch_size"},
        {"train_batch_size", "batch_size"},
        {"per_device_eval_batch_size", "eval_batch_size"},
        {"logging_steps", "log_every"},
        {"eval_steps", "eval_every"},
        {"save_steps", "checkpoint_every"},
        {"max_seq_length", "max_length"},
        {"gradient_checkpointing", "activation_checkpointing"},
        {"bf16", "precision"},
        {"resume_from_checkpoint", "resume"},
    };
    for (const auto& [theirs, ours] : other_spellings) {
      if (canonical(name) != theirs) continue;
      if (ours == "resume") return " (transformers' name; here it is --resume [DIR], given with --submit or --local)";
      if (const KnobSpec* spec = find(ours)) {
        const bool per_rank_note = theirs == "per_device_train_batch_size" || theirs == "train_batch_size";
        return fmt::format(" (transformers' and TRL's name; here it is {}{}{})", spec->flag(),
                           ours == "precision" ? " bf16" : "",
                           per_rank_note ? ", whose scope, per rank or global, the program declares" : "");
      }
    }
    if (canonical(name) == "gradient_accumulation_steps")
      return " (transformers' and TRL's name; here the program sets it: Training::gradient_accumulation(n))";
    const auto key = canonical(name);
    const KnobSpec* best = nullptr;
    std::size_t best_distance = 3;  // more edits than that is another word, not a typo
    for (const auto& spec : specs_) {
      const auto d = detail::edit_distance(key, spec.name);
      if (d < best_distance) best = &spec, best_distance = d;
    }
    return best ? fmt::format(" (did you mean {}?)", best->flag()) : "";
  }

  UsageError unknown_argument(std::string_view arg) const {
    if (!arg.starts_with("--"))
      return UsageError(fmt::format("unexpected argument '{}'; training knobs are given as --name value", arg));
    std::vector<std::string> flags;
    for (const auto& spec : specs_)
      if (spec.stage.empty()) flags.push_back(spec.flag());  // not every stage's copy of each
    return UsageError(fmt::format("unknown option {}{}; the knobs are: {}", arg, closest_hint(arg.substr(2)),
                                  flags.empty() ? "none" : fmt::format("{}", fmt::join(flags, " "))));
  }

  std::vector<KnobSpec> specs_;
  std::map<std::string, KnobValue, std::less<>> values_;
};

/// What a login check (run_job's `login_check`) knows of the command besides the knob values.
struct LoginCheckFacts {
  std::optional<int> world;     ///< the ranks the command starts, where it says (login_world)
  bool waits_for_jobs = false;  ///< the job starts after others (--after, Job::after): what they write may be missing
};

}  // namespace hpctrain
