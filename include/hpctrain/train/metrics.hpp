#pragma once
// Seam 3 of the Trainer (docs/seams.md), the metrics: what an evaluation computes besides the loss, as
// reducible accumulators — every batch adds a (sum, count) on the device, the totals are all-reduced once
// per evaluation and finished on the host. Built in: accuracy, top_k_accuracy(k), perplexity. Also the
// run's `metrics.jsonl` writer (one JSON object a line, appended across requeues).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <torch/types.h>

#include <hpctrain/error.hpp>
#include <hpctrain/train/data/source.hpp>

namespace hpctrain {

namespace metrics {

/// What a metric reads from one evaluation batch (all on the device).
struct Input {
  const torch::Tensor& output;  ///< EvalOutput::output (logits for the default evaluation step)
  const data::Batch& batch;     ///< the batch, on the device (targets, fields)
  const torch::Tensor& loss;    ///< EvalOutput::loss, the batch's mean loss (0-dim)
  const torch::Tensor& weight;  ///< EvalOutput::weight, what the mean loss is over (0-dim)
};

/// A metric's contribution of one batch: 0-dim tensors on the device, summed over batches and all-reduced
/// over ranks once per evaluation.
struct Sums {
  torch::Tensor sum;
  torch::Tensor count;
};

/// A reducible metric: `update` turns a batch into (sum, count) without reading the host; after the
/// evaluation the totals over batches and ranks go to `finish` (default: sum / count).
class Metric {
 public:
  using Update = std::function<Sums(const Input&)>;
  using Finish = std::function<double(double sum, double count)>;

  Metric(std::string name, Update update, Finish finish = mean)
      : name_(std::move(name)), update_(std::move(update)), finish_(std::move(finish)) {}

  /// The name in logs, metrics.jsonl (`eval_<name>`), TensorBoard (`eval/<name>`) and `test_<name>=`.
  const std::string& name() const { return name_; }
  /// One batch's (sum, count).
  Sums update(const Input& input) const { return update_(input); }
  /// The value from the totals.
  double finish(double sum, double count) const { return finish_(sum, count); }
  /// Metrics are known by their names.
  bool operator==(const Metric& other) const { return name_ == other.name_; }

  /// sum / count (0 for an empty evaluation).
  static double mean(double sum, double count) { return count > 0 ? sum / count : 0.0; }

 private:
  std::string name_;
  Update update_;
  Finish finish_;
};

namespace detail {
inline torch::Tensor count_of(const torch::Tensor& like, std::int64_t n) {
  return torch::scalar_tensor(static_cast<double>(n), torch::TensorOptions(torch::kFloat64).device(like.device()));
}
/// Fraction of targets among the top `k` outputs (argmax for k = 1), over every target position.
inline Sums top_k_hits(const Input& in, int k) {
  const auto& targets = in.batch.targets;
  const auto logits = in.output.reshape({-1, in.output.size(-1)});
  const auto flat = targets.reshape({-1}).to(torch::kInt64);
  const auto hits =
      k == 1 ? logits.argmax(-1).eq(flat) : std::get<1>(logits.topk(k, -1)).eq(flat.unsqueeze(-1)).any(-1);
  return {hits.sum().to(torch::kFloat64), count_of(logits, flat.numel())};
}
}  // namespace detail

/// Fraction of targets equal to the arg-max of the output (over the last dimension).
inline const Metric accuracy{"accuracy", [](const Input& in) { return detail::top_k_hits(in, 1); }};

/// Fraction of targets among the `k` largest outputs; named `top<k>_accuracy`.
inline Metric top_k_accuracy(int k) {
  hpctrain::detail::require(k >= 1, "metrics.top_k_accuracy", k, "k must be at least 1");
  return Metric(fmt::format("top{}_accuracy", k), [k](const Input& in) { return detail::top_k_hits(in, k); });
}

/// exp of the weighted mean loss: perplexity of a language model whose loss is a mean cross entropy
/// per target token (with the eval step's weight = target tokens).
inline const Metric perplexity{
    "perplexity",
    [](const Input& in) {
      return Sums{in.loss.detach().to(torch::kFloat64) * in.weight.to(torch::kFloat64), in.weight.to(torch::kFloat64)};
    },
    [](double sum, double count) { return std::exp(Metric::mean(sum, count)); }};

}  // namespace metrics

/// Appends one JSON object per line to a file, flushing each (a requeued run appends to the same file).
class JsonlWriter {
 public:
  /// Opens `path` for appending; creates its directory.
  explicit JsonlWriter(const std::filesystem::path& path) : path_(path) {
    std::filesystem::create_directories(path.parent_path());
    file_ = std::fopen(path.c_str(), "a");
    if (file_ == nullptr) throw RuntimeError(errors::runtime_metrics, fmt::format("cannot open {}", path.string()));
  }
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;
  ~JsonlWriter() { std::fclose(file_); }

  /// Writes `record` as one line.
  void write(const nlohmann::json& record) {
    const std::string line = record.dump() + "\n";
    if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
      throw RuntimeError(errors::runtime_metrics, fmt::format("cannot write {}", path_.string()));
  }
  /// The file written.
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

}  // namespace hpctrain
