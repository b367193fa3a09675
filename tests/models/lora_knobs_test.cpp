// LoRA set in code and the --lora-* knobs tell one story (issue: the knobs said r 0 while the program trained
// r 8, and --lora-r 0 still trained r 8): the code's values become the knobs' defaults, the command line
// overrides them; a target that names no layer of the pretrained model exits 2 at login, not after the queue.
#include <catch2/catch.hpp>

#include <hpctrain/lm/lm.hpp>
#include <hpctrain/train/data/source.hpp>

#include "models_test_support.hpp"

namespace hm = hpctrain::models;
namespace lm = hpctrain::lm;

namespace {
hm::LoraConfig rank_8_on_all_projections() {
  hm::LoraConfig config;
  config.r = 8;
  config.alpha = 32;
  config.targets = {"q_proj", "k_proj", "v_proj", "o_proj"};
  return config;
}

/// The Training's knob table with `arguments` (name, value) given, as the login node parses them.
hpctrain::Knobs given(const hpctrain::Training& training,
                      const std::vector<std::pair<std::string, std::string>>& arguments) {
  auto knobs = training.knobs();
  for (const auto& [name, value] : arguments) knobs.set(name, value);
  return knobs;
}
}  // namespace

TEST_CASE("LoRA set in code is the --lora-* knobs' default, which the command line overrides", "[lm][lora]") {
  const auto training = lm::causal_lm_training().lora(rank_8_on_all_projections());
  const auto help = training.knobs().help();
  CHECK_THAT(help, Catch::Contains("--lora-r") && Catch::Contains("default: 8"));
  CHECK_THAT(help, Catch::Contains("default: q_proj,k_proj,v_proj,o_proj"));

  const auto as_coded = training.lora(given(training, {}));
  REQUIRE(as_coded.has_value());
  CHECK(as_coded->r == 8);
  CHECK(as_coded->alpha == 32);
  CHECK(as_coded->targets == std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj"});

  CHECK_FALSE(training.lora(given(training, {{"lora_r", "0"}})).has_value());  // --lora-r 0: every parameter trains
  const auto overridden = training.lora(given(training, {{"lora_r", "16"}, {"lora_targets", "gate_proj,up_proj"}}));
  REQUIRE(overridden.has_value());
  CHECK(overridden->r == 16);
  CHECK(overridden->alpha == 32);  // the code's, not the knob's own default
  CHECK(overridden->targets == std::vector<std::string>{"gate_proj", "up_proj"});

  // Without the knobs (a plain Training) the code's LoRA is the run's, as before.
  const auto plain = hpctrain::Training().lora(rank_8_on_all_projections());
  REQUIRE(plain.lora(plain.knobs()).has_value());
  CHECK(plain.lora(plain.knobs())->r == 8);
}

TEST_CASE("A LoRA target that names no layer of the pretrained model exits 2 at login, naming it and the layers",
          "[lm][lora]") {
  const auto dir = models_test::scratch("lora-knobs");
  hpctrain::detail::write_file_atomically(dir / "config.json", hm::LlamaConfig().to_json().dump());
  const auto training = lm::causal_lm_training().model(lm::from_pretrained(dir)).lora(rank_8_on_all_projections());
  CHECK_NOTHROW(training.check_at_login(given(training, {})));
  CHECK_NOTHROW(training.check_at_login(given(training, {{"lora_targets", "all-linear"}})));
  CHECK_NOTHROW(training.check_at_login(given(training, {{"lora_targets", "layers.0.self_attn.q_proj"}})));
  CHECK_NOTHROW(training.check_at_login(given(training, {{"lora_r", "0"}, {"lora_targets", "q_prj"}})));  // LoRA off
  CHECK_THROWS_WITH(
      training.check_at_login(given(training, {{"lora_targets", "q_proj,q_prj"}})),
      fmt::format("[hpctrain.spec.knob] --lora-targets = q_proj,q_prj: 'q_prj' names no layer of {}: its layers are "
                  "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head, or all-linear",
                  dir.string()));
}
