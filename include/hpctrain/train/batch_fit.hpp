#pragma once
// A batch larger than an epoch of each rank's data is refused in the units the user typed (--batch-size is global or
// per rank, as the program declares), naming the largest that fits: by every rank once its data is loaded
// (Trainer), and on the login node before anything is written or queued where the data factory read the data's size
// there (lm::sft_jsonl counts its split's records: an upper bound of the rows the ranks get).
#include <cstdint>
#include <optional>
#include <string>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/train/builtin_knobs.hpp>
#include <hpctrain/train/run_context.hpp>
#include <hpctrain/train/training.hpp>

namespace hpctrain {

/// Refuses (SpecError) a step of `examples_per_step` examples a rank when an epoch gives each of `world` ranks only
/// `per_rank` examples of `data`. `bound` says how `per_rank` is known ("only" when counted, "at most" when read
/// at login); `flag` names the knob when the batch came from the command line.
inline void require_batch_within_epoch(const BatchSize& typed, std::int64_t examples_per_step, std::int64_t per_rank,
                                       std::int64_t world, const std::string& data, const std::string& bound,
                                       const std::optional<std::string>& flag = std::nullopt) {
  if (examples_per_step <= per_rank) return;
  const bool global = typed.scope == BatchScope::global;
  const auto value = fmt::format("{} ({})", typed.value, global ? "global" : "per rank");
  const auto reason = fmt::format(
      "{} examples per rank per step{}, but each rank gets {} {} examples per epoch of {} ({} ranks); at most {} here",
      examples_per_step, global ? fmt::format(" ({} ranks share it)", world) : "", bound, per_rank, data, world,
      global ? per_rank * world : per_rank);
  if (flag) throw SpecError(errors::spec_knob, *flag + " = " + value, reason);
  throw SpecError("training.batch_size", value, reason);
}

/// The program's login checks (Training::check_at_login; a pretrained directory that a job this one waits for will
/// write may be missing) and, when the command says how many ranks it starts, the batch of this run's knobs: a global
/// batch that does not divide by the ranks × accumulation, and one larger than an epoch of the training data where
/// its factory read the data's size. Both would fail every rank after the queue.
inline void check_training_at_login(const Training& training, const Knobs& knobs, const LoginCheckFacts& facts) {
  const auto data = training.check_at_login(knobs, facts.waits_for_jobs);
  const auto world = facts.world;
  if (!world) return;
  const auto configured = with_knobs(training, knobs);
  const std::int64_t examples_per_step =
      configured.micro_batch_per_rank(*world) * configured.gradient_accumulation();  // divides, or SpecError
  if (!data) return;
  const auto* knob = knobs.find("batch_size");
  const bool typed_here = knob != nullptr && knobs.get_if_given<std::int64_t>("batch_size").has_value();
  require_batch_within_epoch(configured.batch_size(), examples_per_step, data->examples / *world, *world, data->what,
                             "at most", typed_here ? std::optional(knob->flag()) : std::nullopt);
}

}  // namespace hpctrain
