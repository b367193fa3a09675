#pragma once
// Learning-rate schedules as pure functions of the step: nothing to save in a checkpoint but the step.
#include <cmath>
#include <cstdint>
#include <functional>
#include <numbers>
#include <string>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/job/setting.hpp>

namespace hpctrain {

/// A multiplier of the base learning rate as a function of (step, total steps).
class LrSchedule {
 public:
  /// The base learning rate throughout. The default.
  static LrSchedule constant() { return LrSchedule(); }
  /// Linear warmup from 0 over `warmup_steps`, then a cosine decay to `final_fraction` of the base rate.
  static LrSchedule warmup_cosine(std::int64_t warmup_steps, double final_fraction = 0.0) {
    return warmup_then(Decay::cosine, warmup_steps, final_fraction);
  }
  /// Linear warmup from 0 over `warmup_steps`, then a linear decay to `final_fraction` of the base rate
  /// (fairseq's polynomial_decay with power 1, RoBERTa's recipe; transformers' linear schedule).
  static LrSchedule warmup_linear(std::int64_t warmup_steps, double final_fraction = 0.0) {
    return warmup_then(Decay::linear, warmup_steps, final_fraction);
  }

  /// Multiplier for the optimizer step `step` (0-based) of `total_steps`.
  double factor(std::int64_t step, std::int64_t total_steps) const {
    if (decay_ == Decay::none) return 1.0;
    if (step < warmup_steps_) return static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
    const std::int64_t decay_steps = total_steps - warmup_steps_;
    if (decay_steps <= 0) return 1.0;
    const double progress = std::min(1.0, static_cast<double>(step - warmup_steps_) / static_cast<double>(decay_steps));
    const double remaining =
        decay_ == Decay::cosine ? 0.5 * (1.0 + std::cos(std::numbers::pi * progress)) : 1.0 - progress;
    return final_fraction_ + (1.0 - final_fraction_) * remaining;
  }

  /// "constant", "warmup_cosine(<warmup>, <final fraction>)" or "warmup_linear(<warmup>, <final fraction>)".
  std::string describe() const {
    if (decay_ == Decay::none) return "constant";
    return fmt::format("warmup_{}({}, {})", decay_ == Decay::cosine ? "cosine" : "linear", warmup_steps_,
                       final_fraction_);
  }

 private:
  enum class Decay { none, cosine, linear };
  static LrSchedule warmup_then(Decay decay, std::int64_t warmup_steps, double final_fraction) {
    detail::require(warmup_steps >= 0, "schedule.warmup_steps", warmup_steps, "must not be negative");
    detail::require(final_fraction >= 0.0 && final_fraction <= 1.0, "schedule.final_fraction", final_fraction,
                    "must be in [0, 1]");
    LrSchedule schedule;
    schedule.decay_ = decay;
    schedule.warmup_steps_ = warmup_steps;
    schedule.final_fraction_ = final_fraction;
    return schedule;
  }

  Decay decay_ = Decay::none;
  std::int64_t warmup_steps_ = 0;
  double final_fraction_ = 0.0;
};

/// A schedule made from the run's knobs when the worker starts (Training::schedule takes it).
using ScheduleFromKnobs = std::function<LrSchedule(const Knobs&)>;
/// LrSchedule::warmup_cosine with its steps and floor as values or knobs:
/// `.schedule(ht::warmup_cosine(ht::knob("warmup_steps", 30, "linear warmup steps", ht::non_negative()), 0.1))`.
inline ScheduleFromKnobs warmup_cosine(Setting<std::int64_t> warmup_steps, Setting<double> final_fraction = 0.0) {
  return
      [=](const Knobs& knobs) { return LrSchedule::warmup_cosine(warmup_steps.get(knobs), final_fraction.get(knobs)); };
}
/// LrSchedule::warmup_linear with its steps and floor as values or knobs.
inline ScheduleFromKnobs warmup_linear(Setting<std::int64_t> warmup_steps, Setting<double> final_fraction = 0.0) {
  return
      [=](const Knobs& knobs) { return LrSchedule::warmup_linear(warmup_steps.get(knobs), final_fraction.get(knobs)); };
}

}  // namespace hpctrain
