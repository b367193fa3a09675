#pragma once
// A Hugging Face dataset on disk read a row at a time through Apache Arrow's own libraries: Parquet files a row
// group at a time (only the columns asked for, each column read on its own so that a bad page names its column),
// Arrow IPC files and streams (what `save_to_disk` writes) a record batch at a time. Memory holds one row group or
// batch, not the file. Every error is SpecError `[hpctrain.spec.data.dataset]` naming the file and the place
// (`FILE, row group G` or `FILE, record batch B`, counted from 0 as pyarrow counts them) and, where it is one
// column's, the column: a footer that is not Parquet's (a truncated file), a bad page, an unknown compression, a
// column of a type hpctrain does not read, a string that is not UTF-8 (each part is validated whole before a value
// of it is read).
#include <algorithm>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <arrow/ipc/reader.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>

#include <hpctrain/datasets/arrow_json.hpp>
#include <hpctrain/datasets/dataset_files.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/text/rows.hpp>
#include <hpctrain/text/utf8.hpp>

namespace hpctrain::datasets {

namespace detail {
inline std::string reason_of(const std::string& what, const std::string& reason) {
  return what.empty() ? reason : fmt::format("{}: {}", what, reason);
}

/// `step()`'s value, or SpecError at `where` saying `what` failed and why: Arrow reports by Status or Result,
/// Parquet also throws (ParquetException: a footer that is not Parquet's); both become the dataset's error.
template <class Step>
auto checked(const std::string& where, const std::string& what, Step&& step) {
  try {
    if constexpr (std::is_same_v<decltype(step()), arrow::Status>) {
      if (const auto status = step(); !status.ok()) fail(where, reason_of(what, status.message()));
    } else {
      auto result = step();
      if (!result.ok()) fail(where, reason_of(what, result.status().message()));
      return std::move(result).ValueUnsafe();
    }
  } catch (const hpctrain::Error&) {
    throw;
  } catch (const std::exception& error) {
    fail(where, reason_of(what, error.what()));
  }
}

/// The columns of `schema` to read: those named in `wanted` (all when empty), in the schema's order; SpecError
/// naming the file and the column for one of a type json_of does not read.
inline std::vector<int> chosen_columns(const arrow::Schema& schema, const std::vector<std::string>& wanted,
                                       const std::filesystem::path& file) {
  std::vector<int> chosen;
  for (int i = 0; i < schema.num_fields(); ++i) {
    const auto& field = *schema.field(i);
    if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), field.name()) == wanted.end()) continue;
    // Its name and its fields' names become a row's keys, which are UTF-8 as a JSONL line's are.
    if (const auto described = field.ToString(); text::utf8_lossy(described) != described)
      fail(file.string(), fmt::format("column {}: a name that is not UTF-8", i));
    if (const auto type = unreadable_type(*field.type()); !type.empty())
      fail(file.string(), fmt::format("column '{}' is of type {}, which hpctrain does not read (text, numbers, "
                                      "booleans, lists and structs of them)",
                                      field.name(), field.type()->ToString()));
    chosen.push_back(i);
  }
  return chosen;
}
}  // namespace detail

/// One file of a dataset as a sequence of tables: a Parquet row group or an Arrow record batch each.
class FileBatches {
 public:
  virtual ~FileBatches() = default;
  /// The next part, null at the end.
  virtual std::shared_ptr<arrow::Table> next() = 0;
  /// Where the part next() gave last is: `FILE, row group G`.
  virtual std::string where() const = 0;
};

/// A Parquet file a row group at a time. The footer is read (and checked) on opening.
class ParquetBatches final : public FileBatches {
 public:
  ParquetBatches(std::filesystem::path file, const std::vector<std::string>& columns) : file_(std::move(file)) {
    const auto name = file_.string();
    auto input = detail::checked(name, "cannot open", [&] { return arrow::io::ReadableFile::Open(name); });
    reader_ = detail::checked(name, "not a readable Parquet file",
                              [&] { return parquet::arrow::OpenFile(input, arrow::default_memory_pool()); });
    std::shared_ptr<arrow::Schema> schema;
    detail::checked(name, "its schema", [&] { return reader_->GetSchema(&schema); });
    columns_ = detail::chosen_columns(*schema, columns, file_);
    std::vector<std::shared_ptr<arrow::Field>> fields;
    for (const auto column : columns_) fields.push_back(schema->field(column));
    schema_ = arrow::schema(std::move(fields));
  }

  std::shared_ptr<arrow::Table> next() override {
    if (group_ + 1 >= reader_->num_row_groups()) return nullptr;
    ++group_;
    const auto rows = reader_->parquet_reader()->metadata()->RowGroup(group_)->num_rows();
    std::vector<std::shared_ptr<arrow::ChunkedArray>> arrays;
    for (const auto column : columns_) {
      std::shared_ptr<arrow::ChunkedArray> array;
      detail::checked(where(), fmt::format("column '{}'", schema_->field(static_cast<int>(arrays.size()))->name()),
                      [&] { return reader_->RowGroup(group_)->Column(column)->Read(&array); });
      arrays.push_back(std::move(array));
    }
    return arrow::Table::Make(schema_, std::move(arrays), rows);
  }

  std::string where() const override { return fmt::format("{}, row group {}", file_.string(), group_); }

 private:
  std::filesystem::path file_;
  std::unique_ptr<parquet::arrow::FileReader> reader_;
  std::vector<int> columns_;
  std::shared_ptr<arrow::Schema> schema_;
  int group_ = -1;
};

/// An Arrow IPC file (it starts "ARROW1") or stream (what save_to_disk writes) a record batch at a time.
class ArrowBatches final : public FileBatches {
 public:
  ArrowBatches(std::filesystem::path file, const std::vector<std::string>& columns) : file_(std::move(file)) {
    const auto name = file_.string();
    auto input = detail::checked(name, "cannot open", [&] { return arrow::io::ReadableFile::Open(name); });
    const auto magic = detail::checked(name, "cannot read", [&] { return input->ReadAt(0, 6); });
    std::shared_ptr<arrow::Schema> schema;
    if (magic->ToString() == "ARROW1") {
      file_reader_ = detail::checked(name, "not a readable Arrow file",
                                     [&] { return arrow::ipc::RecordBatchFileReader::Open(input); });
      schema = file_reader_->schema();
    } else {
      detail::checked(name, "cannot read", [&] { return input->Seek(0); });  // ReadAt left the position unset
      stream_reader_ = detail::checked(name, "not a readable Arrow stream",
                                       [&] { return arrow::ipc::RecordBatchStreamReader::Open(input); });
      schema = stream_reader_->schema();
    }
    columns_ = detail::chosen_columns(*schema, columns, file_);
  }

  std::shared_ptr<arrow::Table> next() override {
    ++batch_;
    std::shared_ptr<arrow::RecordBatch> batch;
    if (file_reader_) {
      if (batch_ >= file_reader_->num_record_batches()) return nullptr;
      batch = detail::checked(where(), "", [&] { return file_reader_->ReadRecordBatch(batch_); });
    } else {
      detail::checked(where(), "", [&] { return stream_reader_->ReadNext(&batch); });
      if (!batch) return nullptr;
    }
    batch = detail::checked(where(), "", [&] { return batch->SelectColumns(columns_); });
    return detail::checked(where(), "", [&] { return arrow::Table::FromRecordBatches({batch}); });
  }

  std::string where() const override { return fmt::format("{}, record batch {}", file_.string(), batch_); }

 private:
  std::filesystem::path file_;
  std::shared_ptr<arrow::ipc::RecordBatchFileReader> file_reader_;
  std::shared_ptr<arrow::ipc::RecordBatchStreamReader> stream_reader_;
  std::vector<int> columns_;
  int batch_ = -1;
};

/// A dataset's rows across its files (datasets/dataset_files.hpp), each a JSON object of the chosen columns.
class DatasetRows final : public text::RowSource {
 public:
  DatasetRows(std::vector<DataFile> files, std::vector<std::string> columns)
      : files_(std::move(files)), columns_(std::move(columns)) {}

  bool next(nlohmann::ordered_json& row) override {
    while (!batch_ || batch_row_ >= batch_->num_rows()) {
      if (!next_batch()) return false;
    }
    row = nlohmann::ordered_json::object();
    for (int c = 0; c < batch_->num_columns(); ++c)
      row[batch_->schema()->field(c)->name()] = json_of(*batch_->column(c), batch_row_);
    ++batch_row_;
    ++part_row_;
    ++row_;
    return true;
  }
  std::int64_t row() const override { return row_; }
  std::string where() const override { return fmt::format("{}, row {}", file_->where(), part_row_ - 1); }
  const ErrorId& error_id() const override { return errors::spec_data_dataset; }

 private:
  /// The next record batch of the part being read, else of the next part, else of the next file.
  bool next_batch() {
    batch_row_ = 0;
    for (;;) {
      if (part_) {
        detail::checked(file_->where(), "", [&] { return part_->ReadNext(&batch_); });
        if (batch_) return true;
        part_.reset();
      }
      if (file_) {
        if (auto table = file_->next()) {
          // Whole before any value is read: offsets within their buffers, strings UTF-8 (a JSONL line's are).
          for (int c = 0; c < table->num_columns(); ++c)
            detail::checked(file_->where(), fmt::format("column '{}'", table->field(c)->name()),
                            [&] { return table->column(c)->ValidateFull(); });
          detail::checked(file_->where(), "", [&] { return table->ValidateFull(); });  // columns as long as the table
          table_ = std::move(table);
          part_ = std::make_unique<arrow::TableBatchReader>(*table_);
          part_row_ = 0;
          continue;
        }
        file_.reset();
      }
      if (next_file_ == files_.size()) return false;
      const auto& file = files_[next_file_++];
      if (file.kind == DataFile::Kind::parquet) file_ = std::make_unique<ParquetBatches>(file.path, columns_);
      else file_ = std::make_unique<ArrowBatches>(file.path, columns_);
    }
  }

  std::vector<DataFile> files_;
  std::vector<std::string> columns_;
  std::size_t next_file_ = 0;
  std::unique_ptr<FileBatches> file_;
  std::shared_ptr<arrow::Table> table_;
  std::unique_ptr<arrow::TableBatchReader> part_;
  std::shared_ptr<arrow::RecordBatch> batch_;
  std::int64_t batch_row_ = 0, part_row_ = 0, row_ = 0;
};

}  // namespace hpctrain::datasets
