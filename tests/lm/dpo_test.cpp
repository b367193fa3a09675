// DPO's loss variants and metrics (lm/dpo_loss.hpp) on fixed log-probabilities against values derived by hand from
// TRL's DPOTrainer.dpo_loss (trl 0.24) and against that function itself (tests/lm/dpo_oracle.py losses), the
// completions' log-probabilities from hand-made logits, and the preference rows (lm/preference_data.hpp): the
// implicit prompt of two conversations, and the rows that exit 2.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/lm/chunked_logps.hpp>
#include <hpctrain/lm/dpo_loss.hpp>
#include <hpctrain/lm/preference_data.hpp>

#include "../models/models_test_support.hpp"

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
  hl::DpoOptions options;
  options.label_smoothing = smoothing;
  options.terms = {{type, 1.0}};
  const auto out = hl::dpo_loss(chosen, rejected, ref_chosen, ref_rejected, options);
  CHECK(out.losses[0].item<double>() == Approx(first).epsilon(1e-6));
  CHECK(out.losses[1].item<double>() == Approx(second).epsilon(1e-6));
  CHECK(out.chosen_rewards[0].item<double>() == Approx(0.1));
  CHECK(out.chosen_rewards[1].item<double>() == Approx(0.0).margin(1e-7));
  CHECK(out.rejected_rewards[0].item<double>() == Approx(-0.1));
  CHECK(out.rejected_rewards[1].item<double>() == Approx(0.1));
}

TEST_CASE("dpo: every loss type, weighted sums of them, reference-free and rpo_alpha give TRL's dpo_loss itself",
          "[dpo][oracle]") {
  // 16 pairs of log-probabilities in float64 (both sides compute in float64, so the bound is rounding: 1e-9 relative);
  // spread so that the sigmoid's and the hinge's both sides and aot's sorting are reached.
  torch::manual_seed(7);
  const auto options64 = torch::TensorOptions(torch::kFloat64);
  const auto logps = [&] { return -torch::rand({16}, options64) * 30; };
  const auto chosen = logps(), rejected = logps(), ref_chosen = chosen + torch::randn({16}, options64) * 4,
             ref_rejected = rejected + torch::randn({16}, options64) * 4;
  const auto nll = torch::scalar_tensor(1.7, options64);
  struct Case {
    std::string loss_type;
    double beta, smoothing;
    bool reference_free;
    double rpo_alpha;
  };
  std::vector<Case> cases;
  for (const auto& [name, type] : hl::dpo_loss_type_names) {
    cases.push_back({std::string(name), 0.1, 0.0, false, 0.0});
    cases.push_back({std::string(name), 0.5, 0.2, true, 0.0});
  }
  cases.push_back({"sigmoid:0.8,sft:0.2", 0.1, 0.0, false, 0.0});            // MPO's shape
  cases.push_back({"exo_pair:0.5,sigmoid:2,robust", 0.1, 0.0, false, 0.3});  // exo_pair's ε of 1e-3 for all
  cases.push_back({"ipo,hinge:3", 0.25, 0.1, true, 1.0});
  const auto list = [](const torch::Tensor& t) {
    return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  };
  nlohmann::json given{{"chosen", list(chosen)},         {"rejected", list(rejected)},
                       {"ref_chosen", list(ref_chosen)}, {"ref_rejected", list(ref_rejected)},
                       {"nll", nll.item<double>()},      {"cases", nlohmann::json::array()}};
  std::vector<hl::DpoOptions> ours;
  for (const auto& c : cases) {
    hl::DpoOptions options;
    options.beta = c.beta;
    options.label_smoothing = c.smoothing;
    options.reference_free = c.reference_free;
    options.rpo_alpha = c.rpo_alpha;
    const auto terms = hl::parse_dpo_loss_terms(c.loss_type);
    REQUIRE(terms.has_value());
    options.terms = *terms;
    nlohmann::json types = nlohmann::json::array(), weights = nlohmann::json::array();
    for (const auto& term : *terms) {
      for (const auto& [name, type] : hl::dpo_loss_type_names)
        if (type == term.type) types.push_back(std::string(name));
      weights.push_back(term.weight);
    }
    given["cases"].push_back({{"beta", c.beta},
                              {"label_smoothing", c.smoothing},
                              {"loss_type", types},
                              {"loss_weights", weights},
                              {"reference_free", c.reference_free},
                              {"rpo_alpha", c.rpo_alpha > 0 ? nlohmann::json(c.rpo_alpha) : nlohmann::json()},
                              {"discopop_tau", options.discopop_tau}});
    ours.push_back(options);
  }
  const auto dir = models_test::scratch("dpo-loss-oracle");
  std::ofstream(dir / "in.json") << given.dump();
  models_test::run_python("../lm/dpo_oracle.py",
                          fmt::format("losses '{}' '{}'", (dir / "in.json").string(), (dir / "out.json").string()),
                          dir / "oracle.log");
  const auto theirs = nlohmann::json::parse(std::ifstream(dir / "out.json"));
  REQUIRE(theirs.size() == cases.size());
  double worst = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(cases[i].loss_type, cases[i].beta, cases[i].smoothing, cases[i].reference_free, cases[i].rpo_alpha);
    const auto out = hl::dpo_loss(chosen, rejected, ref_chosen, ref_rejected, ours[i], nll);
    for (const auto& [key, tensor] : {std::pair{"losses", out.losses}, std::pair{"chosen_rewards", out.chosen_rewards},
                                      std::pair{"rejected_rewards", out.rejected_rewards}}) {
      const auto expected = torch::tensor(theirs[i][key].get<std::vector<double>>(), options64);
      const double difference = (tensor - expected).abs().max().item<double>();
      const double scale = std::max(1.0, expected.abs().max().item<double>());
      CAPTURE(key, difference, scale);
      CHECK(difference <= 1e-9 * scale);
      worst = std::max(worst, difference / scale);
    }
  }
  WARN(fmt::format("{} cases: TRL's dpo_loss and ours {:.1e} apart at most, relative", cases.size(), worst));
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
  const hl::CompletionLogps side{chosen, torch::tensor({2.0f, 2.0f}), torch::tensor({4.0f, 8.0f}), {}};
  const auto metrics = hl::dpo_batch_metrics(losses, side, side, chosen, rejected, 2);
  REQUIRE(metrics.size() == 8);
  const double expected[] = {0.05, 0.0, 0.5, 0.05, -1.5, -2.0, 12.0 / 8, 12.0 / 8};
  for (int i = 0; i < 8; ++i) {
    CAPTURE(hl::dpo_metric_names[i]);
    CHECK(metrics[static_cast<std::size_t>(i)].item<double>() == Approx(expected[i]).margin(1e-7));
  }
}

TEST_CASE("dpo: the head a chunk of tokens at a time gives the whole logits' log-probabilities, sums and gradients",
          "[dpo]") {
  // fp32 both ways: the chunked path computes each logit as the same dot product, and its logsumexp, softmax and the
  // gradients' products over the same terms, so only the blocking of the products and the order of the sums differ:
  // a few float ulps of values of order 10 (log-probabilities, logit sums) and 1 (gradients). Bound 1e-5 relative to
  // each tensor's largest entry; a wrong row, a missing mask or a gradient not scaled per token is off by far more.
  torch::manual_seed(3);
  const std::int64_t rows = 3, length = 7, width = 16, vocabulary = 40;
  auto targets = torch::randint(vocabulary, {rows, length}, torch::kLong);
  targets.index_put_({0, torch::indexing::Slice(0, 3)}, hl::ignore_index);  // a prompt: no log-probability
  targets.index_put_({2, torch::indexing::Slice(5, 7)}, hl::ignore_index);  // padding
  const auto upstream = torch::randn({rows, length});                       // a gradient per token, as DPO's
  const auto relative = [](const torch::Tensor& a, const torch::Tensor& b) {
    return ((a - b).abs().max() / b.abs().max()).item<double>();
  };
  double worst = 0;
  for (const double softcap : {0.0, 3.0}) {
    const auto hidden0 = torch::randn({rows, length, width}), weight0 = torch::randn({vocabulary, width}) * 0.5;
    auto hidden = hidden0.clone().requires_grad_(), weight = weight0.clone().requires_grad_();
    auto logits = torch::matmul(hidden, weight.t());
    if (softcap > 0) logits = torch::tanh(logits / softcap) * softcap;
    const auto whole = hl::completion_logps(logits, targets);
    (whole.token_logps * upstream).sum().backward();
    for (const std::int64_t chunk : {1L, 5L, rows * length}) {
      CAPTURE(softcap, chunk);
      auto h = hidden0.clone().requires_grad_(), w = weight0.clone().requires_grad_();
      const auto [token_logps, logit_sums] = hl::chunked_token_logps(h, w, targets, chunk, hl::ignore_index, softcap);
      (token_logps * upstream).sum().backward();
      for (const double difference :
           {relative(token_logps, whole.token_logps), relative(logit_sums.sum(-1), whole.logit_sums),
            relative(h.grad(), hidden.grad()), relative(w.grad(), weight.grad())}) {
        CHECK(difference < 1e-5);
        worst = std::max(worst, difference);
      }
      CHECK(logit_sums.requires_grad() == false);
    }
  }
  WARN(fmt::format("chunked head against the whole logits: {:.1e} apart at most, relative", worst));
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

TEST_CASE("dpo: prepared pairs read back as written, and a damaged file is refused naming it", "[dpo]") {
  std::vector<hl::PreferenceExample> examples{{{1, 2, 3, 4}, {1, 2, 5}, 2, 2}, {{7, 8, 9}, {7, 8, 10, 11, 12}, 1, 2}};
  hl::PreferenceDataset dataset(examples, 0);
  dataset.set_reference(torch::tensor({-1.5f, -2.5f, -3.0f, -4.0f}).view({2, 2}));
  const auto bytes = dataset.serialized();
  const auto back = hl::PreferenceDataset::deserialized(bytes, "pairs.pt");
  REQUIRE(back->size() == 2);
  CHECK(back->has_reference());
  const auto ours = dataset.batch({0, 1}), theirs = back->batch({0, 1});
  CHECK(torch::equal(ours.inputs, theirs.inputs));
  CHECK(torch::equal(ours.targets, theirs.targets));
  CHECK(torch::equal(ours.field("reference_logps"), theirs.field("reference_logps")));
  for (const auto& damaged : {bytes.substr(0, bytes.size() / 2), std::string("not an archive")}) {
    std::string message;
    try {
      hl::PreferenceDataset::deserialized(damaged, "pairs.pt");
    } catch (const hpctrain::SpecError& error) {
      message = error.what();
    }
    CHECK(message.find("pairs.pt") != std::string::npos);
    CHECK(message.find("not prepared preference pairs") != std::string::npos);
  }
}
