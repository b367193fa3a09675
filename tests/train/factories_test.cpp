// Issue 17, item 1: factories that take the run's knobs or its RunContext, hooks at the end with the whole
// model, login checks, a schedule made from knobs, and the built-in knobs --precision --log-every
// --eval-every --checkpoint-every — so that a program is one hpctrain::run.
#include <catch2/catch.hpp>

#include "train_test_support.hpp"

#include <filesystem>
#include <string>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include <hpctrain/models/llama.hpp>
#include <hpctrain/train/trainer.hpp>
#include <hpctrain/train/worker.hpp>

namespace fs = std::filesystem;

namespace {
/// y = 3x + 1 with a little noise: a run of a few steps visibly learns it.
hpctrain::data::Source line_data(std::int64_t n) {
  torch::manual_seed(5);
  auto x = torch::randn({n, 1});
  return hpctrain::data::tensors(x, 3 * x + 1 + 0.01 * torch::randn({n, 1}));
}
}  // namespace

TEST_CASE("Factories take the knobs or the RunContext, and a hook at the end sees the trained model and the result",
          "[worker]") {
  const auto run_dir = train_test::scratch("factories");
  struct Seen {
    std::int64_t width = 0, rank = -1, world = 0;
    fs::path run_dir;
    double lr = 0;
    std::int64_t data_rows = 0;
    bool hook_called = false;
    double hook_loss = 0;
    std::int64_t hook_parameters = 0;
  };
  auto seen = std::make_shared<Seen>();
  auto training =
      hpctrain::Training()
          .model([seen](const hpctrain::RunContext& run) {
            seen->width = run.knobs.get<std::int64_t>("width");
            seen->rank = run.rank;
            seen->world = run.world_size;
            seen->run_dir = run.run_dir;
            return torch::nn::Sequential(torch::nn::Linear(1, seen->width), torch::nn::Linear(seen->width, 1));
          })
          .optimizer([seen](std::vector<torch::Tensor> parameters, const hpctrain::Knobs& knobs) {
            seen->lr = knobs.get<double>("base_lr");
            return torch::optim::SGD(parameters, torch::optim::SGDOptions(seen->lr));
          })
          .train_data([seen](const hpctrain::Knobs& knobs) {
            seen->data_rows = knobs.get<std::int64_t>("rows");
            return line_data(seen->data_rows);
          })
          .eval_data(line_data(32))
          .loss(
              [](const torch::Tensor& output, const torch::Tensor& target) { return torch::mse_loss(output, target); })
          .batch_size(hpctrain::per_rank(16))
          .max_steps(30)
          .eval_batch_size(32)
          .threads(1)
          .run_dir(run_dir)
          .schedule([](const hpctrain::Knobs& knobs) {
            return hpctrain::LrSchedule::warmup_cosine(knobs.get<std::int64_t>("warmup"), 0.5);
          })
          .knob<std::int64_t>("width", 4, "hidden width")
          .knob<double>("base_lr", 0.05, "SGD rate")
          .knob<std::int64_t>("rows", 64, "rows of data")
          .knob<std::int64_t>("warmup", 2, "warmup steps")
          .at_end([seen](const hpctrain::FinishContext& at_end) {
            seen->hook_called = true;
            seen->hook_loss = at_end.result.eval_loss.value_or(-1);
            for (const auto& parameter : at_end.module.parameters()) seen->hook_parameters += parameter.numel();
            CHECK_FALSE(at_end.module.is_training());
          });
  const auto knobs =
      hpctrain::parse_training_knobs(training, {"--width=6", "--base-lr=0.1", "--rows=48", "--warmup=3"});
  const auto configured = hpctrain::with_knobs(training, knobs);
  CHECK(configured.schedule().factor(0, 30) == Approx(1.0 / 3.0));  // warmup_cosine(3, ...) from the knob
  const auto result = hpctrain::train(configured, hpctrain::slurm::World{});
  CHECK(result.exit_code == hpctrain::exit_ok);
  CHECK(seen->width == 6);
  CHECK(seen->rank == 0);
  CHECK(seen->world == 1);
  CHECK(seen->run_dir == run_dir);
  CHECK(seen->lr == 0.1);
  CHECK(seen->data_rows == 48);
  REQUIRE(seen->hook_called);
  CHECK(seen->hook_loss == Approx(*result.eval_loss));
  CHECK(seen->hook_parameters == (1 * 6 + 6) + (6 * 1 + 1));
  CHECK(*result.eval_loss < 1.0);  // it learned the line
}

TEST_CASE("evaluate_at_start evaluates the model as it starts, before the first step", "[worker]") {
  const auto run_dir = train_test::scratch("evaluate-at-start");
  auto training = hpctrain::Training()
                      .model([] { return torch::nn::Linear(1, 1); })
                      .optimizer([](std::vector<torch::Tensor> parameters) {
                        return torch::optim::SGD(parameters, torch::optim::SGDOptions(0.1));
                      })
                      .train_data(line_data(64))
                      .eval_data(line_data(32))
                      .loss([](const torch::Tensor& output, const torch::Tensor& target) {
                        return torch::mse_loss(output, target);
                      })
                      .batch_size(hpctrain::per_rank(16))
                      .max_steps(20)
                      .threads(1)
                      .run_dir(run_dir)
                      .evaluate_at_start(true);
  const auto result = hpctrain::train(training, hpctrain::slurm::World{});
  REQUIRE(result.eval_loss_at_start);
  REQUIRE(result.eval_loss);
  CHECK(*result.eval_loss < *result.eval_loss_at_start);
}

TEST_CASE("Login checks of the data factories and of login_check see the parsed knobs", "[worker]") {
  struct CheckedData {
    hpctrain::data::Source operator()(const hpctrain::Knobs&) const { return line_data(8); }
    void check_at_login(const hpctrain::Knobs& knobs) const {
      if (knobs.get<std::string>("file") == "missing.jsonl")
        throw hpctrain::SpecError(hpctrain::errors::spec_knob, "--file = missing.jsonl", "no such file");
    }
  };
  std::vector<std::string> checked;
  auto training =
      hpctrain::Training()
          .model([] { return torch::nn::Linear(1, 1); })
          .optimizer([](std::vector<torch::Tensor> parameters) {
            return torch::optim::SGD(parameters, torch::optim::SGDOptions(0.1));
          })
          .train_data(CheckedData{})
          .batch_size(hpctrain::per_rank(4))
          .max_steps(1)
          .knob<std::string>("file", "data.jsonl", "a data file")
          .login_check([&checked](const hpctrain::Knobs& knobs) { checked.push_back(knobs.get<std::string>("file")); });
  training.check_at_login(hpctrain::parse_training_knobs(training, {"--file=data.jsonl"}));
  CHECK(checked == std::vector<std::string>{"data.jsonl"});
  CHECK_THROWS_WITH(training.check_at_login(hpctrain::parse_training_knobs(training, {"--file=missing.jsonl"})),
                    "[hpctrain.spec.knob] --file = missing.jsonl: no such file");
}

TEST_CASE(
    "The built-in knobs --precision --log-every --eval-every --max-eval-examples --checkpoint-every replace the "
    "description's values",
    "[worker]") {
  auto training = hpctrain::Training()
                      .model([] { return torch::nn::Linear(1, 1); })
                      .optimizer([](std::vector<torch::Tensor> parameters) {
                        return torch::optim::SGD(parameters, torch::optim::SGDOptions(0.1));
                      })
                      .train_data(line_data(8))
                      .batch_size(hpctrain::per_rank(4))
                      .max_steps(1)
                      .precision(hpctrain::auto_precision);
  const auto defaults = hpctrain::with_knobs(training, hpctrain::parse_training_knobs(training, {}));
  CHECK(defaults.precision() == hpctrain::auto_precision);
  CHECK(defaults.log_every() == 50);
  const auto given = hpctrain::with_knobs(
      training, hpctrain::parse_training_knobs(training, {"--precision=bf16", "--log-every=3", "--eval-every=7",
                                                          "--max-eval-examples=500", "--checkpoint-every=11"}));
  CHECK(given.precision() == hpctrain::bf16);
  CHECK(given.log_every() == 3);
  CHECK(given.eval_every() == 7);
  CHECK(given.max_eval_examples() == 500);
  CHECK(defaults.max_eval_examples() == 0);
  CHECK(given.checkpoint_every() == 11);
  CHECK_THROWS_WITH(hpctrain::parse_training_knobs(training, {"--max-eval-examples=-1"}),
                    Catch::Contains("--max-eval-examples") && Catch::Contains("must not be negative"));
  CHECK_THROWS_WITH(hpctrain::parse_training_knobs(training, {"--precision=fp16"}),
                    Catch::Contains("--precision") && Catch::Contains("must be fp32, bf16 or auto"));
  CHECK(hpctrain::resolve_precision(hpctrain::auto_precision, torch::Device(torch::kCUDA)) == hpctrain::bf16);
}

TEST_CASE("LoRA trains the same adapters under Replicated and ZeRO-1/2/3, and leaves the base weights untouched",
          "[worker][lora]") {
  // A tiny Llama on random next-token data: every strategy must skip the frozen base in buckets and shards. At one
  // rank Training::sharding trains as Replicated (ShardedAtOneRank): the stages' own strategies are made as given,
  // with Training::strategy, and the stage chosen by sharding() runs too.
  const auto data = [] {
    torch::manual_seed(21);
    const auto tokens = torch::randint(0, 50, {64, 9}, torch::kInt64);
    return hpctrain::data::tensors(tokens.narrow(1, 0, 8).contiguous(), tokens.narrow(1, 1, 8).contiguous());
  };
  const auto llama = [] {
    hpctrain::models::LlamaConfig config;
    config.vocab_size = 50, config.hidden_size = 16, config.intermediate_size = 32, config.num_hidden_layers = 2;
    config.num_attention_heads = 2;
    return hpctrain::models::Llama(config);
  };
  // The base as the run's seed builds it whole: under ZeRO-3 the run builds its blocks empty and each rank
  // initialises its slices to these values (models/deferred_initialization.hpp).
  auto initial = std::make_shared<std::map<std::string, torch::Tensor>>();
  {
    torch::manual_seed(4);
    const auto whole = llama();
    for (const auto& item : whole->named_parameters()) (*initial)[item.key()] = item.value().detach().clone();
  }
  const auto run = [&](std::optional<hpctrain::ZeroStage> stage, const std::string& name) {
    auto kept = std::make_shared<std::shared_ptr<torch::nn::Module>>();
    auto training =
        hpctrain::Training()
            .model([kept, llama] {
              auto model = llama();
              *kept = model.ptr();
              return model;
            })
            .optimizer([](std::vector<torch::Tensor> parameters) {
              return torch::optim::AdamW(parameters, torch::optim::AdamWOptions(1e-2));
            })
            .train_data(data())
            .loss([](const torch::Tensor& logits, const torch::Tensor& targets) {
              return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
            })
            .lora(hpctrain::models::LoraConfig{4, 8, 0.0, {"q_proj", "v_proj", "up_proj"}, false})
            .precision(hpctrain::fp32)  // the same sums under every strategy (bf16 holds ZeRO-3's base in bf16)
            .batch_size(hpctrain::per_rank(8))
            .max_steps(6)
            .threads(1)
            .seed(4)  // as `initial`
            .clip_grad_norm(1.0)
            .run_dir(train_test::scratch("lora-" + name));
    if (stage && name == "zero3 at one rank") training.sharding(*stage);
    else if (stage) training.strategy(hpctrain::sharded(*stage));
    auto final_parameters = std::make_shared<std::map<std::string, torch::Tensor>>();
    training.at_end(
        [final_parameters](const hpctrain::FinishContext& at_end) {  // the whole model, gathered under ZeRO-3
          for (const auto& item : at_end.module.named_parameters())
            (*final_parameters)[item.key()] = item.value().detach().clone();
        });
    const auto result = hpctrain::train(training, hpctrain::slurm::World{});
    REQUIRE(result.exit_code == hpctrain::exit_ok);
    std::map<std::string, torch::Tensor> parameters;
    for (const auto& item : (*kept)->named_parameters()) {
      parameters[item.key()] = final_parameters->at(item.key());
      CAPTURE(item.key());
      if (!hpctrain::models::is_lora_parameter(item.key()))  // untouched, in the dtype it is held in
        CHECK(parameters[item.key()].equal(initial->at(item.key()).to(parameters[item.key()].scalar_type())));
    }
    return parameters;
  };
  const auto replicated = run(std::nullopt, "replicated");
  for (const auto& [stage, name] :
       std::vector<std::pair<hpctrain::ZeroStage, std::string>>{{hpctrain::zero1, "zero1"},
                                                                {hpctrain::zero2, "zero2"},
                                                                {hpctrain::zero3, "zero3"},
                                                                {hpctrain::zero3, "zero3 at one rank"}}) {
    CAPTURE(name);
    const auto sharded = run(stage, name);
    REQUIRE(sharded.size() == replicated.size());
    for (const auto& [key, value] : replicated) {
      CAPTURE(key);
      CHECK((sharded.at(key) - value).abs().max().item<double>() < 1e-6);
    }
  }
  const auto moved = (replicated.at("layers.0.self_attn.q_proj.lora_B.weight")).abs().max().item<double>();
  CHECK(moved > 0);  // the adapters trained (B starts at zero)
}
