#pragma once
// Knobs declared where their values are used, and values a helper takes either as written or from a knob:
// `hpctrain::knob("seq_len", 128, "tokens per window")` declares `--seq-len` and returns the handle that reads it;
// `Setting<T>` holds a value, or the name of the knob that gives it (`lm::from_pretrained("/shared/Llama")` or
// `lm::from_pretrained(ht::knob("from", "", "model directory"))`), read in the worker. Torch-free.
#include <algorithm>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/job/knobs.hpp>

namespace hpctrain {

/// A knob declared where its value is used (`hpctrain::knob` below): reads this run's value, the command line's
/// or else the default (the declared one, or a value set in code), from the knobs a factory or hook is given.
template <KnobType T>
class Knob {
 public:
  explicit Knob(std::string name) : name_(std::move(name)) {}
  const std::string& name() const { return name_; }
  std::string flag() const { return knob_flag(name_); }
  T operator()(const Knobs& knobs) const { return knobs.get<T>(name_); }

 private:
  std::string name_;
};

namespace detail {
/// The type a knob declared with a default of type T holds: `128` an integer, `"Q: "` a text.
template <class T>
using declared_knob_t = std::conditional_t<std::is_convertible_v<T, std::string_view> && !std::same_as<T, bool>,
                                           std::string, stored_knob_t<std::decay_t<T>>>;

/// The knobs the program declared with hpctrain::knob while main built its description. hpctrain::run adds them to
/// its table after the built-ins and Training::knob's. A program runs main again in every worker, so the workers
/// declare the same knobs before they read them.
inline Knobs& inline_knobs() {
  static Knobs table;
  return table;
}
}  // namespace detail

/// Declares knob `name` at the place its value is used — its default, one line of help and a check — and returns
/// the handle that reads it: `lm::prepared_tokens("train", ht::knob("seq_len", 128, "tokens per window"))`, or
/// `seq_len(run.knobs)` in a factory. `--help` lists it, the login node checks it, a value set in code stays its
/// default and the command line wins. Call it while main builds the description (not inside a factory, which only
/// the workers run). The same declaration again (a helper called for train and validation data) gives the same
/// knob; the same name with another default, help or type is a SpecError `[hpctrain.spec.knob]`.
template <class T>
Knob<detail::declared_knob_t<T>> knob(std::string name, T default_value, std::string help,
                                      KnobCheck<detail::declared_knob_t<T>> check = {}) {
  using Value = detail::declared_knob_t<T>;
  Knobs declared;
  declared.declare<Value>(name, Value(std::move(default_value)), std::move(help), std::move(check));
  auto& table = detail::inline_knobs();
  if (const auto* known = table.find(name)) {
    const auto& mine = declared.specs().front();
    if (known->help != mine.help || known->default_value != mine.default_value ||
        known->requirement != mine.requirement)
      throw SpecError(errors::spec_knob, knob_flag(name),
                      fmt::format("is declared twice: default {}, \"{}\" and default {}, \"{}\"",
                                  detail::format_knob_value(known->default_value), known->help,
                                  detail::format_knob_value(mine.default_value), mine.help));
  } else {
    table.extend(declared);
  }
  return Knob<Value>(std::move(name));
}

/// The name of a knob whose value a helper reads in the worker.
struct KnobName {
  std::string name;
};
/// `knob("max_steps")`: take the value from the knob `--max-steps`, declared elsewhere (a built-in knob).
inline KnobName knob(std::string name) { return {std::move(name)}; }

/// A directory an earlier stage of the chain writes (hpctrain::run over stages), known when a later stage runs:
/// `lm::from_pretrained(stage_dir("sft") / "export")`. Before that (at login), it reads
/// `<the sft job's directory>/export`, which exists nowhere: a login check takes it as the earlier job's to write.
class StageDirectory {
 public:
  explicit StageDirectory(std::string stage) : stage_(std::move(stage)) {}
  StageDirectory operator/(const std::filesystem::path& below) const {
    StageDirectory path = *this;
    path.below_ /= below;
    return path;
  }
  /// The directory for this stage's values (the knob stage_knob_values sets, job/stage_knobs.hpp). Throws SpecError
  /// `[hpctrain.spec.stage]` outside a later stage of a chain, or for a stage that is not an earlier one.
  std::filesystem::path resolve(const Knobs& knobs) const {
    const auto where = fmt::format("stage_dir(\"{}\")", stage_);
    if (knobs.find(stage_dirs_knob) == nullptr)
      throw SpecError(errors::spec_stage, where,
                      "names an earlier stage's directory: only a later stage of hpctrain::run's stages has one");
    const auto dirs = knobs.get<std::string>(stage_dirs_knob);
    std::vector<std::string> earlier;
    for (std::size_t start = 0; start <= dirs.size() && !dirs.empty();) {
      const auto end = std::min(dirs.find('\n', start), dirs.size());
      const std::string_view line(dirs.data() + start, end - start);
      if (line.starts_with(stage_ + "=")) return std::filesystem::path(line.substr(stage_.size() + 1)) / below_;
      earlier.emplace_back(line.substr(0, line.find('=')));
      start = end + 1;
    }
    throw SpecError(errors::spec_stage, where,
                    earlier.empty()
                        ? std::string("no stage runs before this one")
                        : fmt::format("no earlier stage has this name (earlier: {})", fmt::join(earlier, ", ")));
  }

  /// The knob a chain's stage values carry the earlier stages' directories in (job/stage_knobs.hpp).
  static constexpr std::string_view stage_dirs_knob = "hpctrain_stage_dirs";

 private:
  std::string stage_;
  std::filesystem::path below_;
};
/// The directory stage `stage` of this program's chain runs in, for a later stage: `stage_dir("sft") / "export"`.
inline StageDirectory stage_dir(std::string stage) { return StageDirectory(std::move(stage)); }

/// A value given in the program, or the name of the knob that gives it.
template <class T>
class Setting {
 public:
  /// An earlier stage's directory, read when the stage runs.
  Setting(StageDirectory directory) requires std::is_same_v<T, std::filesystem::path>  // NOLINT: implicit
      : computed_([directory = std::move(directory)](const Knobs& knobs) { return directory.resolve(knobs); }) {}
  Setting(T value) : value_(std::move(value)) {}           // NOLINT: implicit, so that a plain value reads naturally
  Setting(KnobName knob) : knob_(std::move(knob.name)) {}  // NOLINT
  template <KnobType K>
  requires(std::is_same_v<K, T> || (std::is_same_v<T, std::filesystem::path> && std::is_same_v<K, std::string>))
      Setting(const Knob<K>& knob)
      : knob_(knob.name()) {}  // NOLINT: a knob declared inline
  template <class U>
  requires(std::is_constructible_v<T, U> && !std::is_same_v<std::decay_t<U>, T> &&
           !std::is_same_v<std::decay_t<U>, KnobName>) Setting(U&& value)
      : value_(T(std::forward<U>(value))) {}  // NOLINT: "/path" for a path

  /// The value for this run: the program's, or the knob's (a SpecError names an empty required string knob).
  T get(const Knobs& knobs) const {
    if (computed_) return computed_(knobs);
    if (!knob_) return *value_;
    if constexpr (std::is_same_v<T, std::filesystem::path>) {
      auto text = knobs.get<std::string>(*knob_);
      if (text.empty()) throw SpecError(errors::spec_knob, knob_flag(*knob_), "is required (a path)");
      return std::filesystem::path(text);
    } else {
      return knobs.get<T>(*knob_);
    }
  }
  /// An optional path: the program's, or the knob's unless the knob is empty (`--tools ""`, its default: none).
  std::optional<T> get_optional(const Knobs& knobs) const requires std::is_same_v<T, std::filesystem::path> {
    if (computed_) return computed_(knobs);
    if (!knob_) return *value_;
    auto text = knobs.get<std::string>(*knob_);
    if (text.empty()) return std::nullopt;
    return std::filesystem::path(text);
  }
  /// The knob's name, when the value comes from one.
  const std::optional<std::string>& knob_name() const { return knob_; }

 private:
  std::optional<T> value_;
  std::optional<std::string> knob_;
  std::function<T(const Knobs&)> computed_;  ///< a value known when the stage runs (StageDirectory)
};

}  // namespace hpctrain
