// DPO's loss variants and metrics (lm/dpo_loss.hpp) on fixed log-probabilities against values derived by hand from
// TRL's DPOTrainer.dpo_loss (trl 0.24), the completions' log-probabilities from hand-made logits, and the
// preference rows (lm/preference_data.hpp): the implicit prompt of two conversations, and the rows that exit 2.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include <hpctrain/lm/dpo_loss.hpp>
#include <hpctrain/lm/preference_data.hpp>

namespace hl = hpctrain::lm;

namespace {
// Pair 1: the policy prefers chosen by 2 nats more than the reference; pair 2: by 1 nat less.
const auto chosen = torch::tensor({-1.0f, -2.0f}), rejected = torch::tensor({-3.0f, -1.0f});
const auto ref_chosen = torch::tensor({-2.0f, -2.0f}), ref_rejected = torch::tensor({-2.0f, -2.0f});
}  // namespace

TEST_CASE("dpo: each loss type gives TRL's per-pair losses for log-ratio differences 2 and -1 at beta 0.1", "[dpo]") {
  // sigmoid: -log σ(0.2) = log(1 + e^-0.2), -log σ(-0.1) = log(1 + e^0.1); with ε 0.1: 0.9 · that + 0.1 · (that + βh);
  // ipo: (h - 1/(2β))² = (2 - 5)², (-1 - 5)²; hinge: max(0, 1 - βh) = 0.8, 1.1.
  using T = hl::DpoLossType;
  auto [type, smoothing, first, second] = GENERATE(table<T, double, double, double>({
      {T::sigmoid, 0.0, 0.5981388693, 0.7443966600},
      {T::sigmoid, 0.1, 0.6181388693, 0.7343966600},
      {T::ipo, 0.0, 9.0, 36.0},
      {T::hinge, 0.0, 0.8, 1.1},
  }));
  CAPTURE(static_cast<int>(type), smoothing);
  const auto out = hl::dpo_loss(chosen, rejected, ref_chosen, ref_rejected, {0.1, smoothing, type});
  CHECK(out.losses[0].item<double>() == Approx(first).epsilon(1e-6));
  CHECK(out.losses[1].item<double>() == Approx(second).epsilon(1e-6));
  CHECK(out.chosen_rewards[0].item<double>() == Approx(0.1));
  CHECK(out.chosen_rewards[1].item<double>() == Approx(0.0).margin(1e-7));
  CHECK(out.rejected_rewards[0].item<double>() == Approx(-0.1));
  CHECK(out.rejected_rewards[1].item<double>() == Approx(0.1));
}

TEST_CASE("dpo: the completions' log-probabilities sum the counted tokens' and the metrics take TRL's means", "[dpo]") {
  // Row 0: position 0 predicts token 0 from logits (0, ln 3): log 1/4; position 1 takes no loss; position 2 predicts
  // token 1 from (1, 1): log 1/2. Row 1 counts position 1 alone: token 0 from (2, 0).
  const auto logits = torch::tensor({0.0, std::log(3.0), 5.0, 7.0, 1.0, 1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0})
                          .to(torch::kFloat32)
                          .view({2, 3, 2});
  const auto targets = torch::tensor({0L, hl::ignore_index, 1L, hl::ignore_index, 0L, hl::ignore_index}).view({2, 3});
  const auto out = hl::completion_logps(logits, targets);
  CHECK(out.logps[0].item<double>() == Approx(std::log(0.125)));
  CHECK(out.logps[1].item<double>() == Approx(-std::log1p(std::exp(-2.0))));
  CHECK(out.tokens[0].item<double>() == 2);
  CHECK(out.logit_sums[0].item<double>() == Approx(std::log(3.0) + 2));

  const auto losses = hl::dpo_loss(chosen, rejected, ref_chosen, ref_rejected, {});
  const hl::CompletionLogps side{chosen, torch::tensor({2.0f, 2.0f}), torch::tensor({4.0f, 8.0f})};
  const auto metrics = hl::dpo_batch_metrics(losses, side, side, chosen, rejected, 2);
  REQUIRE(metrics.size() == 8);
  const double expected[] = {0.05, 0.0, 0.5, 0.05, -1.5, -2.0, 12.0 / 8, 12.0 / 8};
  for (int i = 0; i < 8; ++i) {
    CAPTURE(hl::dpo_metric_names[i]);
    CHECK(metrics[static_cast<std::size_t>(i)].item<double>() == Approx(expected[i]).margin(1e-7));
  }
}

TEST_CASE(
    "dpo: rows in TRL's shapes render as maybe_extract_prompt and maybe_apply_chat_template do, and bad rows name "
    "their line",
    "[dpo]") {
  const auto chat = hpctrain::text::ChatTemplate::parse(
      "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<assistant>"
      "{% endif %}",
      "test");
  const hpctrain::text::ChatRenderOptions options;
  const auto row = [](const std::string& text) { return nlohmann::ordered_json::parse(text); };
  const auto implicit = hl::render_preference(
      row(R"({"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "yes"}],
              "rejected": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "no"}]})"),
      &chat, options, "pairs.jsonl", 1);
  CHECK(implicit.prompt == "<user>q<assistant>");
  CHECK(implicit.chosen == "yes");
  CHECK(implicit.rejected == "no");
  const auto text = hl::render_preference(row(R"({"prompt": "The sky is", "chosen": " blue", "rejected": " green"})"),
                                          nullptr, options, "pairs.jsonl", 2);
  CHECK(text.prompt == "The sky is");
  CHECK(text.chosen == " blue");
  CHECK(text.rejected == " green");

  auto [json, why] = GENERATE(table<std::string, std::string>({
      {R"({"prompt": "p", "chosen": "a", "rejected": "a"})", "prefers nothing"},
      {R"({"prompt": "p", "chosen": "", "rejected": "a"})", "an empty completion"},
      {R"({"prompt": "p", "chosen": "a"})", "no \"rejected\" field"},
      {R"({"chosen": "a", "rejected": "b"})", "no \"prompt\" text"},
      {R"({"chosen": [{"role": "user", "content": "q"}], "rejected": [{"role": "user", "content": "r"}]})",
       "no prompt"},
  }));
  CAPTURE(json);
  try {
    hl::render_preference(row(json), &chat, options, "pairs.jsonl", 7);
    FAIL("accepted");
  } catch (const hpctrain::SpecError& error) {
    CHECK_THAT(error.what(), Catch::Contains("pairs.jsonl:7") && Catch::Contains(why));
  }
}
