#pragma once
// Seam 3 of the Trainer (docs/seams.md), the loggers: where train and eval records go. Made on rank 0 only,
// after the run directory is known. Built in: progress lines (stdout), metrics.jsonl and TensorBoard, and W&B
// offline runs when asked (train/loggers/wandb.hpp); a user adds more with `Training::logger(...)`. The interface
// itself is torch-free, in train/loggers/logger.hpp.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/train/loggers/logger.hpp>
#include <hpctrain/train/loggers/tensorboard.hpp>
#include <hpctrain/train/metrics.hpp>
#include <hpctrain/train/progress.hpp>

namespace hpctrain {

/// Progress lines on stdout: `step 40/400 epoch 0 loss 0.5123 lr 2.000e-03 1234 samples/s eta 1m02s`, and
/// `eval step 400: loss 0.3123 accuracy 0.8870 (10000 examples)`; notes as plain lines.
class ProgressLogger : public Logger {
 public:
  /// `allow_bar` false forces plain lines (as under Slurm, where stdout ends up in a log file).
  explicit ProgressLogger(bool allow_bar = true) : progress_(stdout, allow_bar) {}

  void start(const RunInfo& info) override {
    total_steps_ = info.total_steps;
    last_step_ = info.resumed_from.value_or(0);
    last_time_ = clock::now();
  }
  void log(const LogRecord& r) override {
    if (r.phase == "eval") {
      std::string text = fmt::format("eval step {}: loss {:.4f}", r.step, r.get("loss").value_or(0));
      for (const auto& [key, value] : r.values)
        if (key != "loss" && key != "examples") text += fmt::format(" {} {:.4f}", key, value);
      progress_.line(text + fmt::format(" ({} examples)", static_cast<std::int64_t>(r.get("examples").value_or(0))));
      return;
    }
    // ETA from the wall time since the previous record (evaluations and checkpoints included: they recur).
    const auto now = clock::now();
    const double seconds_per_step = r.step > last_step_ ? std::chrono::duration<double>(now - last_time_).count() /
                                                              static_cast<double>(r.step - last_step_)
                                                        : 0;
    last_step_ = r.step;
    last_time_ = now;
    ProgressReport report{r.step,
                          total_steps_,
                          static_cast<std::int64_t>(r.get("epoch").value_or(0)),
                          r.get("loss").value_or(0),
                          r.get("lr").value_or(0),
                          r.get("samples_per_s").value_or(0),
                          seconds_per_step * static_cast<double>(total_steps_ - r.step)};
    std::string extra;
    if (auto tokens = r.get("tokens_per_s")) extra += fmt::format(" {:.0f} tokens/s", *tokens);
    if (auto norm = r.get("grad_norm")) extra += fmt::format(" grad_norm {:.3f}", *norm);
    if (auto mfu = r.get("mfu")) extra += fmt::format(" mfu {:.1f}%", 100 * *mfu);
    progress_.report(report, extra);
  }
  void note(std::string_view text) override { progress_.line(std::string(text)); }

 private:
  using clock = std::chrono::steady_clock;
  Progress progress_;
  std::int64_t total_steps_ = 0, last_step_ = 0;
  clock::time_point last_time_ = clock::now();
};

/// `<run_dir>/metrics.jsonl`: one JSON object per record, appended across requeues. Train records:
/// `{"step", "epoch", "loss", "lr", "samples_per_s", ...}`; eval records: `{"step", "eval_loss",
/// "eval_examples", "eval_<metric>", ...}`.
class JsonlLogger : public Logger {
 public:
  void start(const RunInfo& info) override { writer_.emplace(info.run_dir / "metrics.jsonl"); }
  void log(const LogRecord& r) override {
    nlohmann::json record{{"step", r.step}};
    const std::string prefix = r.phase == "eval" ? "eval_" : "";
    for (const auto& [key, value] : r.values) {
      if (key == "epoch" || key == "examples") record[prefix + key] = static_cast<std::int64_t>(value);
      else record[prefix + key] = value;
    }
    writer_->write(record);
  }

 private:
  std::optional<JsonlWriter> writer_;
};

/// `<run_dir>/tensorboard/events.out.tfevents.*`: scalars `train/<name>` and `eval/<name>`.
class TensorBoardLogger : public Logger {
 public:
  void start(const RunInfo& info) override { writer_.emplace(info.run_dir / "tensorboard"); }
  void log(const LogRecord& r) override {
    for (const auto& [key, value] : r.values)
      if (key != "epoch" && key != "examples") writer_->add_scalar(r.phase + "/" + key, value, r.step);
  }

 private:
  std::optional<TensorBoardWriter> writer_;
};

}  // namespace hpctrain
