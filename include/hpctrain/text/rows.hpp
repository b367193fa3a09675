#pragma once
// A dataset's rows, one at a time, each a JSON object (column → value, in the dataset's column order): what the
// SFT reader (text/sft_jsonl.hpp) reads, whatever the format on disk. JSONL is built in: a line is a row.
// Hugging Face datasets on disk — a Parquet file, a directory of Parquet shards, a `save_to_disk` folder of Arrow
// files — are read through Apache Arrow's libraries by hpctrain/datasets/, which registers those formats here
// when a program links the `hpctrain::datasets` target (docs/datasets.md): a program that reads no Parquet does
// not link Arrow, and says so when given a dataset. Torch-free and Arrow-free.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>

namespace hpctrain::text {

/// A dataset read a row at a time.
class RowSource {
 public:
  virtual ~RowSource() = default;
  /// The next row, a JSON object; false at the end. SpecError naming the file and the place for a malformed one.
  virtual bool next(nlohmann::ordered_json& row) = 0;
  /// The row next() gave last: a JSONL file's 1-based line; a dataset's 1-based row, counted across its files.
  virtual std::int64_t row() const = 0;
  /// Where that row is, for messages: `FILE:LINE`, `FILE: row group G, row R`.
  virtual std::string where() const = 0;
  /// The error the format's mistakes are reported under.
  virtual const ErrorId& error_id() const = 0;
};

/// A JSONL file's rows: a line each, blank lines skipped.
class JsonlRows final : public RowSource {
 public:
  explicit JsonlRows(std::filesystem::path file) : file_(std::move(file)), in_(file_) {
    if (!in_) throw SpecError(errors::spec_data_jsonl, file_.string(), "cannot open");
  }
  bool next(nlohmann::ordered_json& row) override {
    std::string text;
    while (std::getline(in_, text)) {
      ++line_;
      if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
      try {
        row = nlohmann::ordered_json::parse(text);
      } catch (const nlohmann::json::exception& error) {  // parse_error, or out_of_range for a number too large
        throw SpecError(errors::spec_data_jsonl, where(), fmt::format("not JSON ({})", error.what()));
      }
      if (!row.is_object())
        throw SpecError(errors::spec_data_jsonl, where(),
                        fmt::format("a line must be a JSON object, not {}", row.type_name()));
      return true;
    }
    if (in_.bad()) throw SpecError(errors::spec_data_jsonl, where(), "cannot read further");
    return false;
  }
  std::int64_t row() const override { return line_; }
  std::string where() const override { return fmt::format("{}:{}", file_.string(), line_); }
  const ErrorId& error_id() const override { return errors::spec_data_jsonl; }

 private:
  std::filesystem::path file_;
  std::ifstream in_;
  std::int64_t line_ = 0;
};

/// A format of dataset on disk that a linked component reads (hpctrain/datasets/ registers Parquet and Arrow).
struct RowFormat {
  /// Whether `path` is a dataset of this format (a file by its name, a directory by what it holds).
  std::function<bool(const std::filesystem::path&)> claims;
  /// Its rows, restricted to `columns` (those the dataset has, in the dataset's order; empty: all of them).
  std::function<std::unique_ptr<RowSource>(const std::filesystem::path&, const std::vector<std::string>& columns)> open;
};

/// The formats linked into this program besides JSONL.
inline std::vector<RowFormat>& row_formats() {
  static std::vector<RowFormat> formats;
  return formats;
}

/// Whether `path` names a Hugging Face dataset on disk rather than a JSONL file: a `.parquet` or `.arrow` file, or
/// a directory (of shards, or written by `save_to_disk`).
inline bool looks_like_dataset(const std::filesystem::path& path) {
  const auto extension = path.extension();
  return extension == ".parquet" || extension == ".arrow" || std::filesystem::is_directory(path);
}

/// The files `path` is made of, to fingerprint and to size it: itself, or a directory's regular files below it in
/// path order.
inline std::vector<std::filesystem::path> files_on_disk(const std::filesystem::path& path) {
  if (!std::filesystem::is_directory(path)) return {path};
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(path))
    if (entry.is_regular_file()) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

/// The rows of `path`: a registered format's when one claims it, else a JSONL file's. SpecError
/// `[hpctrain.spec.data.dataset]` for a dataset this program cannot read (hpctrain::datasets not linked).
inline std::unique_ptr<RowSource> open_rows(const std::filesystem::path& path,
                                            const std::vector<std::string>& columns = {}) {
  for (const auto& format : row_formats())
    if (format.claims(path)) return format.open(path, columns);
  if (looks_like_dataset(path))
    throw SpecError(errors::spec_data_dataset, path.string(),
                    "is a Parquet or Arrow dataset, and this program was built without Apache Arrow: link the "
                    "hpctrain::datasets target (hpctrain_add_program(NAME FILE DATASETS); docs/datasets.md)");
  return std::make_unique<JsonlRows>(path);
}

}  // namespace hpctrain::text
