#pragma once
// The language-model helpers take their values as hpctrain::Setting (job/setting.hpp): written in the program, or
// from a knob, declared where it is used (`lm::knob("seq_len", 128, "tokens per window")`) or elsewhere
// (`lm::knob("max_steps")`). Torch-free.
#include <hpctrain/job/setting.hpp>

namespace hpctrain::lm {

using hpctrain::knob;
using hpctrain::KnobName;
using hpctrain::Setting;

}  // namespace hpctrain::lm
