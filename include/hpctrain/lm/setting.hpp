#pragma once
// A value a language-model helper needs that the program either writes down or leaves to a knob:
// `lm::from_pretrained("/shared/Llama-3.1-8B")` or `lm::from_pretrained(lm::knob("from"))`, the knob declared
// with Training::knob and read in the worker. Torch-free.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/job/knobs.hpp>

namespace hpctrain::lm {

/// The name of a knob whose value a helper reads in the worker.
struct KnobName {
  std::string name;
};
/// `lm::knob("from")`: take the value from the knob `--from`.
inline KnobName knob(std::string name) { return {std::move(name)}; }

/// A value given in the program, or the name of the knob that gives it.
template <class T>
class Setting {
 public:
  Setting(T value) : value_(std::move(value)) {}  // NOLINT: implicit, so that a plain value reads naturally
  Setting(KnobName knob) : knob_(std::move(knob.name)) {}  // NOLINT
  template <class U>
    requires(std::is_constructible_v<T, U> && !std::is_same_v<std::decay_t<U>, T> && !std::is_same_v<std::decay_t<U>, KnobName>)
  Setting(U&& value) : value_(T(std::forward<U>(value))) {}  // NOLINT: "/path" for a path

  /// The value for this run: the program's, or the knob's (a SpecError names an empty required string knob).
  T get(const Knobs& knobs) const {
    if (!knob_) return *value_;
    if constexpr (std::is_same_v<T, std::filesystem::path>) {
      auto text = knobs.get<std::string>(*knob_);
      if (text.empty()) throw SpecError(errors::spec_knob, "--" + dashed(*knob_), "is required (a path)");
      return std::filesystem::path(text);
    } else {
      return knobs.get<T>(*knob_);
    }
  }
  /// An optional path: the program's, or the knob's unless the knob is empty (`--tools ""`, its default: none).
  std::optional<T> get_optional(const Knobs& knobs) const
    requires std::is_same_v<T, std::filesystem::path>
  {
    if (!knob_) return *value_;
    auto text = knobs.get<std::string>(*knob_);
    if (text.empty()) return std::nullopt;
    return std::filesystem::path(text);
  }
  /// The knob's name, when the value comes from one.
  const std::optional<std::string>& knob_name() const { return knob_; }

 private:
  static std::string dashed(std::string name) {
    for (auto& c : name)
      if (c == '_') c = '-';
    return name;
  }
  std::optional<T> value_;
  std::optional<std::string> knob_;
};

}  // namespace hpctrain::lm
