#pragma once
// One command line for a chain whose stages train different descriptions (hpctrain::run over stages, SFT then
// DPO): `--lr 1e-5` sets lr for every stage that has it, `--dpo.lr 5e-6` for stage dpo alone (and wins there);
// a knob the stages declare with different defaults keeps each stage's own unless given. Each stage's workers
// read their own table's values (stage_knob_values), with the directories of the stages before them. Torch-free.
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/job/setting.hpp>

namespace hpctrain {

/// One stage's name and its knob table.
struct StageKnobs {
  std::string stage;
  Knobs table;
};

/// The chain's table: a row per knob name any stage has (its type the same in every stage), then a row
/// `<stage>.<knob>` per stage and knob. Throws SpecError `[hpctrain.spec.stage]` for a knob of two types.
inline Knobs chain_knob_table(const std::vector<StageKnobs>& stages) {
  Knobs chain;
  for (const auto& stage : stages)
    for (const auto& spec : stage.table.specs()) {
      if (chain.find(spec.name) != nullptr) continue;
      KnobSpec row = spec;
      std::vector<std::string> defaults;
      bool one_default = true;
      for (const auto& other : stages) {
        const KnobSpec* theirs = other.table.find(spec.name);
        if (theirs == nullptr) continue;
        if (theirs->default_value.index() != spec.default_value.index())
          throw SpecError(errors::spec_stage, spec.flag(),
                          fmt::format("is {} in stage {} and {} in stage {}: one command line cannot set both",
                                      detail::knob_type_name(spec.default_value), stage.stage,
                                      detail::knob_type_name(theirs->default_value), other.stage));
        defaults.push_back(fmt::format(
            "{} {}", other.stage, theirs->has_default ? detail::format_knob_value(theirs->default_value) : "unset"));
        one_default = one_default && theirs->has_default == spec.has_default &&
                      (!spec.has_default || theirs->default_value == spec.default_value);
      }
      if (!one_default) {  // each stage keeps its own: --help names them
        row.has_default = false;
        row.help += fmt::format(" (default: {})", fmt::join(defaults, ", "));
      }
      chain.add_row(std::move(row));
    }
  for (const auto& stage : stages)
    for (const auto& spec : stage.table.specs()) {
      KnobSpec row = spec;
      row.name = knob_name(stage.stage + "." + spec.name);
      row.stage = stage.stage;
      chain.add_row(std::move(row));
    }
  return chain;
}

/// Stage `stage`'s table holding the chain's values (`chain_values`: chain_knob_table's, read from a command
/// line): each knob as given for this stage, else as given for every stage, else the stage's default; and
/// `stage_dirs`, the earlier stages' directories (a line `<stage>=<directory>` each).
inline Knobs stage_knob_values(const Knobs& chain_values, const StageKnobs& stage, const std::string& stage_dirs) {
  Knobs values = stage.table;
  values.declare<std::string>(std::string(StageDirectory::stage_dirs_knob), "", "the earlier stages' directories");
  for (const auto& spec : stage.table.specs()) {
    const auto own = knob_name(stage.stage + "." + spec.name);
    const auto& source = chain_values.given(own) ? own : spec.name;
    if (!chain_values.given(source)) continue;
    std::visit([&](const auto& value) { values.set(spec.name, value); }, *chain_values.value(source));
  }
  values.set(StageDirectory::stage_dirs_knob, stage_dirs);
  return values;
}

/// The value of HPCTRAIN_STAGE_DIRS (and of stage_knob_values' `stage_dirs`) for the stages before one.
inline std::string format_stage_dirs(const std::vector<std::pair<std::string, std::string>>& earlier) {
  std::string text;
  for (const auto& [stage, directory] : earlier) text += (text.empty() ? "" : "\n") + stage + "=" + directory;
  return text;
}

}  // namespace hpctrain
