#pragma once
// Hugging Face datasets on disk, read through Apache Arrow's libraries: including this header (or linking the
// `hpctrain::datasets` CMake target, whose one source includes it) registers the Parquet and Arrow formats with
// text/rows.hpp, so that `--data` takes a `.parquet` file, a directory of shards or a `save_to_disk` folder
// wherever it takes a JSONL file (docs/datasets.md). A program without it does not link Arrow.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <hpctrain/datasets/arrow_rows.hpp>
#include <hpctrain/datasets/dataset_files.hpp>
#include <hpctrain/text/rows.hpp>

namespace hpctrain::datasets {

/// The rows of the dataset at `path` (datasets/dataset_files.hpp says which files), its `columns` only (all: empty).
inline std::unique_ptr<text::RowSource> open_dataset(const std::filesystem::path& path,
                                                     const std::vector<std::string>& columns = {}) {
  return std::make_unique<DatasetRows>(dataset_files(path), columns);
}

namespace detail {
inline const bool formats_registered = [] {
  text::row_formats().push_back({text::looks_like_dataset, open_dataset});
  return true;
}();
}  // namespace detail

}  // namespace hpctrain::datasets
