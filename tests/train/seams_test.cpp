// The Trainer's seams in isolation: Batch fields, the metrics as reducible accumulators (against values
// worked out by hand and against torch's own top-k), the weight-decay groups, both optimizer factory
// forms, and a user's step, metric and logger in a real run at world size 1.
#include <catch2/catch.hpp>

#include "train_test_support.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <hpctrain/train/metrics.hpp>
#include <hpctrain/train/trainer.hpp>
#include <hpctrain/train/training.hpp>

namespace {
std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "no error";
}

hpctrain::metrics::Sums sums_of(const hpctrain::metrics::Metric& metric, const torch::Tensor& output,
                                const hpctrain::data::Batch& batch, const torch::Tensor& loss,
                                const torch::Tensor& weight) {
  return metric.update({output, batch, loss, weight});
}
}  // namespace

TEST_CASE("A batch carries named fields that narrow and move with it, and a missing field is named", "[batch]") {
  hpctrain::data::Batch batch{torch::arange(6).reshape({3, 2}), torch::arange(3)};
  CHECK(batch.fields.empty());
  batch.fields["loss_mask"] = torch::tensor({1, 0, 1});
  CHECK(batch.has("loss_mask"));
  CHECK(batch.size() == 3);
  const auto part = batch.narrow(1, 2).to(torch::kCPU);
  CHECK(torch::equal(part.inputs, torch::tensor({{2, 3}, {4, 5}})));
  CHECK(torch::equal(part.field("loss_mask"), torch::tensor({0, 1})));
  CHECK(error_of([&] { batch.field("lengths"); }) ==
        "[hpctrain.runtime.batch.field] the batch has no field 'lengths' (fields: loss_mask)");
}

TEST_CASE("Accuracy, top-k accuracy and perplexity reduce to sums and counts", "[metrics]") {
  // Three rows, four classes: row 0's best is class 2 (target 2: hit), row 1's best is 0 (target 1: its
  // second best), row 2's best is 3 (target 0: its worst).
  const auto output = torch::tensor({{0.1, 0.2, 0.9, 0.3}, {0.8, 0.5, 0.1, 0.0}, {0.0, 0.2, 0.3, 0.7}});
  hpctrain::data::Batch batch{torch::zeros({3, 1}), torch::tensor({2, 1, 0})};
  const auto loss = torch::tensor(0.5), weight = torch::tensor(3.0, torch::kFloat64);
  const auto top1 = sums_of(hpctrain::metrics::accuracy, output, batch, loss, weight);
  CHECK(top1.sum.item<double>() == 1);
  CHECK(top1.count.item<double>() == 3);
  const auto top2 = sums_of(hpctrain::metrics::top_k_accuracy(2), output, batch, loss, weight);
  CHECK(top2.sum.item<double>() == 2);
  CHECK(hpctrain::metrics::top_k_accuracy(2).name() == "top2_accuracy");
  // torch's own top-k as the oracle for every k.
  for (int k = 1; k <= 4; ++k) {
    const auto expected = std::get<1>(output.topk(k, -1)).eq(batch.targets.unsqueeze(-1)).any(-1).sum().item<double>();
    CHECK(sums_of(hpctrain::metrics::top_k_accuracy(k), output, batch, loss, weight).sum.item<double>() == expected);
  }
  const auto& perplexity = hpctrain::metrics::perplexity;
  const auto p = sums_of(perplexity, output, batch, loss, weight);
  CHECK(perplexity.finish(p.sum.item<double>(), p.count.item<double>()) == Approx(std::exp(0.5)));
  CHECK(error_of([] { hpctrain::metrics::top_k_accuracy(0); }) ==
        "[hpctrain.spec.metrics.top_k_accuracy] metrics.top_k_accuracy = 0: k must be at least 1");
}

TEST_CASE("Token-sequence outputs count every position for accuracy", "[metrics]") {
  // batch 1 × 3 positions × 2 classes; targets 1, 0, 0: positions 0 and 1 right.
  const auto output = torch::tensor({{{0.0, 1.0}, {1.0, 0.0}, {0.0, 1.0}}});
  hpctrain::data::Batch batch{torch::zeros({1, 3}, torch::kInt64), torch::tensor({{1, 0, 0}})};
  const auto sums = sums_of(hpctrain::metrics::accuracy, output, batch, torch::tensor(0.0), torch::tensor(3.0));
  CHECK(sums.sum.item<double>() == 2);
  CHECK(sums.count.item<double>() == 3);
}

TEST_CASE("Weight decay groups leave biases, norms and other 1-D parameters undecayed", "[optimizer]") {
  torch::nn::Sequential model{torch::nn::Linear(4, 3), torch::nn::LayerNorm(torch::nn::LayerNormOptions({3})),
                              torch::nn::Linear(3, 2)};
  const auto named = hpctrain::detail::named_parameters_of(*model);
  const auto [decayed, not_decayed] = hpctrain::split_for_weight_decay(named);
  CHECK(decayed.size() == 2);      // 0.weight, 2.weight
  CHECK(not_decayed.size() == 4);  // 0.bias, 1.weight, 1.bias, 2.bias
  const auto options = torch::optim::AdamWOptions(1e-3).weight_decay(0.1);
  torch::optim::AdamW optimizer(hpctrain::weight_decay_groups(named, options), options);
  REQUIRE(optimizer.param_groups().size() == 2);
  CHECK(static_cast<torch::optim::AdamWOptions&>(optimizer.param_groups()[0].options()).weight_decay() == 0.1);
  CHECK(static_cast<torch::optim::AdamWOptions&>(optimizer.param_groups()[1].options()).weight_decay() == 0.0);
  CHECK(optimizer.param_groups()[1].params().size() == 4);
}

TEST_CASE("Weight decay groups decay a sharded strategy's flat pieces of matrices as the matrices", "[optimizer]") {
  // ZeRO hands the factory 1-D pieces of its parameters: before make_optimizer_over_pieces, weight decay by shape
  // decayed none of them, and a ZeRO run left Replicated's loss curve.
  torch::nn::Sequential model{torch::nn::Linear(4, 3), torch::nn::LayerNorm(torch::nn::LayerNormOptions({3}))};
  hpctrain::NamedParameters pieces;
  std::vector<std::int64_t> dimensions;
  for (const auto& [name, parameter] : hpctrain::detail::named_parameters_of(*model)) {
    pieces.emplace_back(name, parameter.detach().reshape({-1}).narrow(0, 0, 2).clone());  // a rank's piece, flat
    dimensions.push_back(parameter.dim());
  }
  std::vector<std::size_t> sizes;
  const auto options = torch::optim::AdamWOptions(1e-3).weight_decay(0.1);
  const hpctrain::OptimizerFactory factory = [&](const hpctrain::NamedParameters& named) {
    auto optimizer = std::make_unique<torch::optim::AdamW>(hpctrain::weight_decay_groups(named, options), options);
    for (const auto& group : optimizer->param_groups()) sizes.push_back(group.params().size());
    return optimizer;
  };
  hpctrain::detail::make_optimizer_over_pieces(factory, pieces, dimensions);
  CHECK(sizes == std::vector<std::size_t>{1, 3});  // 0.weight decays; 0.bias, 1.weight, 1.bias do not
  sizes.clear();
  factory(pieces);  // outside: the pieces' own shape (1-D), nothing decays
  CHECK(sizes == std::vector<std::size_t>{4});
}

TEST_CASE("The optimizer factory takes plain tensors or named parameters", "[optimizer]") {
  torch::nn::Linear model(4, 2);
  const auto named = hpctrain::detail::named_parameters_of(*model);
  const auto plain = hpctrain::Training().optimizer([](auto parameters) { return torch::optim::SGD(parameters, 0.1); });
  CHECK(plain.make_optimizer(named)->param_groups().at(0).params().size() == 2);
  std::vector<std::string> seen;
  const auto by_name = hpctrain::Training().optimizer([&seen](const hpctrain::NamedParameters& parameters) {
    for (const auto& [name, tensor] : parameters) seen.push_back(name);
    return std::make_unique<torch::optim::SGD>(
        hpctrain::weight_decay_groups(parameters, torch::optim::SGDOptions(0.1).weight_decay(0.01)),
        torch::optim::SGDOptions(0.1));
  });
  CHECK(by_name.make_optimizer(named)->param_groups().size() == 2);
  CHECK(seen == std::vector<std::string>{"weight", "bias"});
}

namespace {
/// A logger that keeps what it got.
struct RecordingLogger : hpctrain::Logger {
  std::vector<hpctrain::LogRecord>* records;
  std::vector<std::string>* notes;
  RecordingLogger(std::vector<hpctrain::LogRecord>* r, std::vector<std::string>* n) : records(r), notes(n) {}
  void log(const hpctrain::LogRecord& record) override { records->push_back(record); }
  void note(std::string_view text) override { notes->emplace_back(text); }
};
}  // namespace

TEST_CASE("A user's step, metric and logger run in the Trainer, clipping and token inputs add grad_norm and tokens/s",
          "[loop]") {
  // A bag-of-tokens classifier on a synthetic task whose class is the first token mod 4: integer token
  // inputs (tokens/s), a step that reads an extra field, a metric of its own, a logger of its own.
  torch::manual_seed(0);
  const auto tokens = torch::randint(0, 16, {256, 8}, torch::kInt64);
  const auto labels = tokens.select(1, 0).remainder(4);
  struct BagImpl : torch::nn::Module {
    torch::nn::Embedding embed = register_module("embed", torch::nn::Embedding(16, 8));
    torch::nn::Linear head = register_module("head", torch::nn::Linear(8, 4));
    torch::Tensor forward(torch::Tensor x) { return head->forward(embed->forward(x).select(1, 0)); }
  };
  std::vector<hpctrain::LogRecord> records;
  std::vector<std::string> notes;
  std::set<std::int64_t> micro_steps;
  const hpctrain::metrics::Metric first_class_rate("first_class_rate", [](const hpctrain::metrics::Input& in) {
    return hpctrain::metrics::Sums{in.output.argmax(-1).eq(0).sum().to(torch::kFloat64),
                                   torch::scalar_tensor(static_cast<double>(in.output.size(0)), torch::kFloat64)};
  });
  auto training =
      hpctrain::Training()
          .model([] { return std::make_shared<BagImpl>(); })
          .optimizer([](auto parameters) { return torch::optim::Adam(parameters, torch::optim::AdamOptions(0.05)); })
          .train_data(hpctrain::data::tensors(tokens, labels))
          .eval_data(hpctrain::data::tensors(tokens.narrow(0, 0, 64), labels.narrow(0, 0, 64)))
          .batch_size(hpctrain::per_rank(32))
          .gradient_accumulation(2)
          .clip_grad_norm(5.0)
          .max_steps(16)
          .log_every(8)
          .threads(1)
          .flops_per_example(1e3)
          .peak_flops(1e12)
          .step([&](hpctrain::StepContext& context, const hpctrain::data::Batch& batch) {
            micro_steps.insert(context.micro_step);
            return context.loss(context.forward(batch.inputs), batch.targets);
          })
          .metric(hpctrain::metrics::accuracy)
          .metric(first_class_rate)
          .logger([&] { return std::make_unique<RecordingLogger>(&records, &notes); })
          .run_dir(train_test::scratch("user-seams"));
  const auto result = hpctrain::train(training, hpctrain::slurm::World{});
  CHECK(result.exit_code == hpctrain::exit_ok);
  CHECK(micro_steps == std::set<std::int64_t>{0, 1});
  REQUIRE(records.size() == 3);  // train at 8 and 16, the final eval
  CHECK(records[0].phase == "train");
  CHECK(records[0].step == 8);
  for (const char* name : {"loss", "lr", "samples_per_s", "tokens_per_s", "grad_norm", "mfu"}) {
    CAPTURE(name);
    CHECK(records[1].get(name));
  }
  CHECK(*records[1].get("tokens_per_s") == Approx(*records[1].get("samples_per_s") * 8));
  CHECK(*records[1].get("mfu") == Approx(*records[1].get("samples_per_s") * 1e3 / 1e12));
  CHECK(records[2].phase == "eval");
  CHECK(*records[2].get("examples") == 64);
  REQUIRE(records[2].get("first_class_rate"));
  CHECK(result.eval_metrics.at("first_class_rate") == *records[2].get("first_class_rate"));
  CHECK(*result.eval_accuracy > 0.5);  // chance is 0.25: the task is being learnt
  CHECK(std::find(notes.begin(), notes.end(), fmt::format("test_accuracy={:.4f}", *result.eval_accuracy)) !=
        notes.end());
}
