#pragma once
// Metrics: what an evaluation computes (loss always, accuracy on request), reduced across ranks as sums,
// and the run's `metrics.jsonl` (one JSON object a line, appended across requeues).
#include <cstdio>
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/error.hpp>

namespace hpctrain {

namespace metrics {
/// A metric an evaluation reports besides the loss.
enum class Metric { accuracy };
/// Fraction of examples whose arg-max output equals the target class.
inline constexpr Metric accuracy = Metric::accuracy;
}  // namespace metrics

/// Appends one JSON object per line to a file, flushing each (a requeued run appends to the same file).
class JsonlWriter {
 public:
  /// Opens `path` for appending; creates its directory.
  explicit JsonlWriter(const std::filesystem::path& path) : path_(path) {
    std::filesystem::create_directories(path.parent_path());
    file_ = std::fopen(path.c_str(), "a");
    if (file_ == nullptr) throw RuntimeError("metrics", fmt::format("cannot open {}", path.string()));
  }
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;
  ~JsonlWriter() { std::fclose(file_); }

  /// Writes `record` as one line.
  void write(const nlohmann::json& record) {
    const std::string line = record.dump() + "\n";
    if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
      throw RuntimeError("metrics", fmt::format("cannot write {}", path_.string()));
  }
  /// The file written.
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

}  // namespace hpctrain
