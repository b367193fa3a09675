// The Trainer's seams on a synthetic task (each token is the previous plus 3, mod 32; the loss ignores the first half,
// a "prompt"): a step, eval step and metric reading a batch's mask (as SFT's), a CSV logger. `--local 2`, `--dry-run`.
#include <hpctrain/hpctrain.hpp>
#include <torch/torch.h>  // the model's layers (torch::nn)
using namespace std::chrono_literals;
namespace ht = hpctrain;
constexpr std::int64_t vocab = 32, length = 16, examples = 4096;
/// The task's sequences with a "loss_mask" field: 0 on the prompt half, 1 on the answer half.
ht::data::Source masked_sequences() {
  const auto tokens = (torch::arange(examples).unsqueeze(1) + 3 * torch::arange(length + 1)).remainder(vocab);
  const auto mask = torch::arange(length).ge(length / 2).to(torch::kFloat32).expand({examples, length});
  return ht::data::tensors(tokens.narrow(1, 0, length), tokens.narrow(1, 1, length), {{"loss_mask", mask}});
}
// [snippet custom_step]
/// The mean cross entropy over the answer tokens only; evaluation weights each batch's mean by their number.
torch::Tensor masked_step(ht::StepContext& context, const ht::data::Batch& batch) {
  return ht::masked_cross_entropy(context.forward(batch.inputs), batch.targets, batch.field("loss_mask"));
}
ht::EvalOutput masked_eval_step(ht::StepContext& context, const ht::data::Batch& batch) {
  const auto logits = context.forward(batch.inputs), mask = batch.field("loss_mask");
  return {ht::masked_cross_entropy(logits, batch.targets, mask), logits, mask.sum().to(torch::kFloat64)};
}
// [end snippet]
// [snippet custom_metric]
/// Accuracy on the answer tokens: the metric reads the batch's loss_mask; sums stay on the device.
const ht::metrics::Metric masked_accuracy("masked_accuracy", [](const ht::metrics::Input& in) {
  const auto mask = in.batch.field("loss_mask").to(torch::kFloat64);
  return ht::metrics::Sums{(in.output.argmax(-1).eq(in.batch.targets) * mask).sum(), mask.sum()};
});
// [end snippet]
// [snippet custom_logger]
/// Writes `<run dir>/loss_curve.csv` (step,loss) on rank 0; a resumed run appends to it.
struct LossCurve : ht::FileLogger {
  LossCurve() : FileLogger("loss_curve.csv", "step,loss") {}
  void log(const ht::LogRecord& record) override {
    if (record.phase == "train") file() << record.step << "," << *record.get("loss") << std::endl;
  }
};
// [end snippet]

int main(int argc, char** argv) {
  auto job = ht::Job("custom_training").nodes(2).cpus_per_task(1).time(10min).partition("debug");
  auto training = ht::Training()
      .model([] { return torch::nn::Sequential(torch::nn::Embedding(vocab, 32), torch::nn::Linear(32, vocab)); })
      .optimizer(ht::adamw(1e-2).weight_decay(0.01)).train_data(masked_sequences).eval_data(masked_sequences)
      .batch_size(ht::global(64)).max_steps(120).log_every(20).step(masked_step).eval_step(masked_eval_step)
      .metric(masked_accuracy).metric(ht::metrics::perplexity).logger([] { return std::make_unique<LossCurve>(); });
  return ht::run(argc, argv, job, training);
}
