// The Trainer's seams from a user's side: a custom step (a loss mask carried in the batch, as in SFT), a
// custom evaluation step and metric (accuracy on the masked-in tokens only) and a custom logger (a CSV
// loss curve in the run directory). Synthetic data, so it runs anywhere:
//   ./custom_training --local 2              2 ranks on this machine
//   ./custom_training --dry-run              the sbatch script it would submit
// The task: token sequences where each token is the previous one plus 3 (mod 32); the first half of each
// sequence is a "prompt" that the loss ignores. docs/training.md shows the marked snippets; a test checks
// that they are the same text as here and runs this program under --local 2.
#include <hpctrain/hpctrain.hpp>
#include <torch/torch.h>  // the model's layers (torch::nn)

#include <cstdio>
#include <fstream>
#include <memory>

using namespace std::chrono_literals;
namespace ht = hpctrain;

constexpr std::int64_t vocabulary = 32, length = 16;

/// Sequences with a "loss_mask" field: 0 on the prompt half, 1 on the answer half.
struct MaskedSequences : ht::data::Dataset {
  std::int64_t size() const override { return 4096; }
  ht::data::Batch batch(const std::vector<std::int64_t>& indices) const override {
    const auto n = static_cast<std::int64_t>(indices.size());
    const auto start = torch::tensor(indices, torch::kInt64).remainder(vocabulary).unsqueeze(1);
    const auto tokens = (start + 3 * torch::arange(length + 1, torch::kInt64).unsqueeze(0)).remainder(vocabulary);
    auto mask = torch::zeros({n, length});
    mask.narrow(1, length / 2, length / 2).fill_(1);
    return {tokens.narrow(1, 0, length), tokens.narrow(1, 1, length), {{"loss_mask", mask}}};
  }
};

/// A bigram model: the next token from the current one.
struct BigramImpl : torch::nn::Module {
  torch::nn::Embedding embed = register_module("embed", torch::nn::Embedding(vocabulary, 32));
  torch::nn::Linear head = register_module("head", torch::nn::Linear(32, vocabulary));
  torch::Tensor forward(torch::Tensor tokens) { return head->forward(embed->forward(tokens)); }
};
TORCH_MODULE(Bigram);

// [snippet custom_step]
/// Cross entropy over the tokens whose loss_mask is 1: the mean over the answer tokens only.
torch::Tensor masked_loss(const torch::Tensor& logits, const ht::data::Batch& batch) {
  const auto per_token = torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32), batch.targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  const auto mask = batch.field("loss_mask").reshape({-1});
  return (per_token * mask).sum() / mask.sum().clamp_min(1);
}

torch::Tensor masked_step(ht::StepContext& context, const ht::data::Batch& batch) {
  return masked_loss(context.forward(batch.inputs), batch);
}

ht::EvalOutput masked_eval_step(ht::StepContext& context, const ht::data::Batch& batch) {
  auto logits = context.forward(batch.inputs);
  auto loss = masked_loss(logits, batch);
  return {loss, logits, batch.field("loss_mask").sum().to(torch::kFloat64)};  // the mean is over answer tokens
}
// [end snippet]

// [snippet custom_metric]
/// Accuracy on the answer tokens: the metric reads the batch's loss_mask; sums stay on the device.
const ht::metrics::Metric masked_accuracy("masked_accuracy", [](const ht::metrics::Input& in) {
  const auto mask = in.batch.field("loss_mask");
  const auto hits = in.output.argmax(-1).eq(in.batch.targets).to(torch::kFloat64) * mask;
  return ht::metrics::Sums{hits.sum(), mask.sum().to(torch::kFloat64)};
});
// [end snippet]

// [snippet custom_logger]
/// Writes `<run dir>/loss_curve.csv` (step,loss) on rank 0.
class LossCurve : public ht::Logger {
 public:
  void start(const ht::RunInfo& info) override {
    file_.open(info.run_dir / "loss_curve.csv", std::ios::app);
    if (!info.resumed_from) file_ << "step,loss\n";
  }
  void log(const ht::LogRecord& record) override {
    if (record.phase == "train") file_ << record.step << "," << *record.get("loss") << std::endl;
  }

 private:
  std::ofstream file_;
};
// [end snippet]

int main(int argc, char** argv) {
  auto job = ht::Job("custom_training").nodes(2).tasks_per_node(1).cpus_per_task(1).time(10min).partition("debug");
  auto training = ht::Training()
      .model([] { return Bigram(); })
      .optimizer(ht::adamw(1e-2).weight_decay(0.01))
      .train_data(ht::data::Source([] { return MaskedSequences(); }, "masked sequences"))
      .eval_data(ht::data::Source([] { return MaskedSequences(); }, "masked sequences"))
      .batch_size(ht::global(64)).max_steps(120).log_every(20)
      .step(masked_step).eval_step(masked_eval_step)
      .metric(masked_accuracy).metric(ht::metrics::perplexity)
      .logger([] { return std::make_unique<LossCurve>(); });
  return ht::run(argc, argv, job, training);
}
