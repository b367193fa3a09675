#pragma once
// The logger interface of the Trainer (seam 3, docs/seams.md): what a logger learns when the run starts, the
// records it receives on rank 0, the factory the Training keeps, and FileLogger, the base of a logger that writes
// a file of the run directory. Torch-free, so that a logger that only writes files (TensorBoard, W&B) builds and is
// tested without LibTorch; the built-in loggers are in train/loggers/loggers.hpp.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>

namespace hpctrain {

/// What a logger learns when the run starts.
struct RunInfo {
  std::filesystem::path run_dir;             ///< where checkpoints and metrics go
  int world_size = 1;                        ///< ranks
  std::string device;                        ///< "cpu", "cuda:0", ...
  std::int64_t total_steps = 0;              ///< optimizer steps the run is meant to take
  std::int64_t steps_per_epoch = 0;          ///< optimizer steps per pass over the training data
  std::optional<std::int64_t> resumed_from;  ///< step of the checkpoint the run resumed from
};

/// One record: the values of a log interval ("train") or of an evaluation ("eval") at `step`.
struct LogRecord {
  std::int64_t step = 0;
  std::string phase;  ///< "train" or "eval"
  /// Named values in a stable order. Train: epoch, loss, lr, samples_per_s, and when known tokens_per_s,
  /// grad_norm, mfu. Eval: loss, examples, then one per metric.
  std::vector<std::pair<std::string, double>> values;

  /// The value `name`, if the record has it.
  std::optional<double> get(std::string_view name) const {
    for (const auto& [key, value] : values)
      if (key == name) return value;
    return std::nullopt;
  }
};

/// Receives the run's records on rank 0.
class Logger {
 public:
  virtual ~Logger() = default;
  /// Once, before the first step.
  virtual void start(const RunInfo&) {}
  /// A train record every log interval, an eval record after every evaluation.
  virtual void log(const LogRecord& record) = 0;
  /// A message: "resumed from ...", "preempted ...", the final test metrics.
  virtual void note(std::string_view) {}
  /// Once, after the last record (not after a preemption: the run goes on after the requeue).
  virtual void finish() {}
};

/// A logger that writes one file of the run directory, `<run dir>/<name>`: opened for appending when the run starts,
/// so that a requeued or resumed run continues it, with `header` as its first line when the file is new. A subclass
/// writes its records to `file()` in `log`. RuntimeError `[hpctrain.runtime.io]` naming the file that cannot be opened.
class FileLogger : public Logger {
 public:
  explicit FileLogger(std::filesystem::path name, std::string header = "")
      : name_(std::move(name)), header_(std::move(header)) {}
  void start(const RunInfo& info) override {
    path_ = info.run_dir / name_;
    std::error_code error;
    const bool fresh = !std::filesystem::exists(path_, error) || std::filesystem::file_size(path_, error) == 0;
    file_.open(path_, std::ios::app);
    if (!file_) throw RuntimeError(errors::runtime_io, fmt::format("cannot open {} for appending", path_.string()));
    if (fresh && !header_.empty()) file_ << header_ << std::endl;
  }
  void finish() override { file_.flush(); }

 protected:
  /// The open file.
  std::ostream& file() { return file_; }
  /// Where it is: `<run dir>/<name>`.
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path name_, path_;
  std::string header_;
  std::ofstream file_;
};

/// Makes a logger on rank 0 (the Training keeps factories: loggers own files and are made in the worker).
using LoggerFactory = std::function<std::unique_ptr<Logger>()>;

}  // namespace hpctrain
