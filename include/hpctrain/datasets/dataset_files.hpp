#pragma once
// Which files a Hugging Face dataset on disk is made of, in the order `datasets` reads them:
//   FILE.parquet / FILE.arrow         the file
//   a `save_to_disk` directory        its state.json's `_data_files` (Arrow stream files), in that order; a saved
//                                     DatasetDict (dataset_dict.json) its `train` split's
//   any other directory               its Parquet (or Arrow) files below it, the train split's where file names
//                                     say splits: a hub download's `data/train-00000-of-00002.parquet`, as
//                                     `datasets.load_dataset` infers them (a name or folder with `train`/`training`,
//                                     `validation`/`valid`/`val`/`dev`, `test`/`testing`/`eval`/`evaluation` between
//                                     separators); without any, every file is the train split
// Hidden files and folders (`.cache/`, names starting `.` or `__`) are skipped, as `datasets` skips them.
// Arrow-free: only names and JSON; the readers are in datasets/arrow_rows.hpp.
#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>

namespace hpctrain::datasets {

/// One file of a dataset.
struct DataFile {
  enum class Kind { parquet, arrow };  ///< arrow: an Arrow IPC file or stream (what save_to_disk writes)
  std::filesystem::path path;
  Kind kind = Kind::parquet;
};

namespace detail {
[[noreturn]] inline void fail(const std::string& where, const std::string& reason) {
  throw SpecError(errors::spec_data_dataset, where, reason);
}

inline std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

/// `datasets`' separators around a split's keyword (NON_WORDS_CHARS, "-._ 0-9").
inline bool separator(char c) { return c == '-' || c == '.' || c == '_' || c == ' ' || (c >= '0' && c <= '9'); }

/// Whether `name` holds `keyword` after its start or a separator, and (in a file name) before a separator.
inline bool names_keyword(std::string_view name, std::string_view keyword, bool file_name) {
  for (auto at = name.find(keyword); at != std::string_view::npos; at = name.find(keyword, at + 1)) {
    const auto end = at + keyword.size();
    if (at > 0 && !separator(name[at - 1])) continue;
    if (file_name ? end < name.size() && separator(name[end]) : end == name.size()) return true;
  }
  return false;
}

inline const std::array<std::pair<const char*, std::vector<std::string_view>>, 3>& split_keywords() {
  static const std::array<std::pair<const char*, std::vector<std::string_view>>, 3> splits{{
      {"train", {"train", "training"}},
      {"validation", {"validation", "valid", "dev", "val"}},
      {"test", {"test", "testing", "eval", "evaluation"}},
  }};
  return splits;
}

inline bool hidden(const std::filesystem::path& relative) {
  for (const auto& part : relative) {
    const auto name = part.string();
    if (name.starts_with('.') || name.starts_with("__")) return true;
  }
  return false;
}

inline std::vector<DataFile> save_to_disk_files(const std::filesystem::path& directory) {
  const auto state_file = directory / "state.json";
  std::ifstream in(state_file);
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    fail(state_file.string(), fmt::format("not JSON ({})", error.what()));
  }
  const auto files = state.find("_data_files");
  if (files == state.end() || !files->is_array() || files->empty())
    fail(state_file.string(), "has no \"_data_files\" list (not written by datasets' save_to_disk?)");
  std::vector<DataFile> data;
  for (const auto& file : *files) {
    if (!file.is_object() || !file.contains("filename") || !file["filename"].is_string())
      fail(state_file.string(), fmt::format("\"_data_files\" holds {}, not {{\"filename\": ...}}", file.dump()));
    data.push_back({directory / file["filename"].get<std::string>(), DataFile::Kind::arrow});
  }
  return data;
}
}  // namespace detail

/// The split `relative` (a data file's path below the dataset's directory) belongs to by its name, "" for none.
inline std::string split_of(const std::filesystem::path& relative) {
  const auto file_name = detail::lower(relative.filename().string());
  std::vector<std::string> folders;
  for (const auto& part : relative.parent_path()) folders.push_back(detail::lower(part.string()));
  for (const auto& [split, keywords] : detail::split_keywords())
    for (const auto keyword : keywords) {
      if (detail::names_keyword(file_name, keyword, true)) return split;
      for (const auto& folder : folders)
        if (detail::names_keyword(folder, keyword, false)) return split;
    }
  return "";
}

/// The train split's files of the dataset at `path` (the rules above); SpecError `[hpctrain.spec.data.dataset]`
/// naming the path when there are none.
inline std::vector<DataFile> dataset_files(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) detail::fail(path.string(), "no such file or directory");
  if (!std::filesystem::is_directory(path))
    return {{path, path.extension() == ".arrow" ? DataFile::Kind::arrow : DataFile::Kind::parquet}};
  if (std::filesystem::is_regular_file(path / "dataset_dict.json")) {
    if (!std::filesystem::is_directory(path / "train"))
      detail::fail(path.string(), "is a saved DatasetDict without a train split");
    return dataset_files(path / "train");
  }
  if (std::filesystem::is_regular_file(path / "state.json")) return detail::save_to_disk_files(path);

  std::vector<std::filesystem::path> parquet, arrow;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(path)) {
    const auto relative = std::filesystem::relative(entry.path(), path);
    if (!entry.is_regular_file() || detail::hidden(relative)) continue;
    if (entry.path().extension() == ".parquet") parquet.push_back(relative);
    else if (entry.path().extension() == ".arrow") arrow.push_back(relative);
  }
  // `datasets` reads the format most of the files have; a download holds Parquet, a cache Arrow.
  const bool is_parquet = parquet.size() >= arrow.size();
  auto& found = is_parquet ? parquet : arrow;
  if (found.empty()) detail::fail(path.string(), "holds no .parquet nor .arrow file");
  std::sort(found.begin(), found.end());
  std::vector<std::string> splits;
  for (const auto& file : found) splits.push_back(split_of(file));
  const bool named = std::any_of(splits.begin(), splits.end(), [](const auto& split) { return !split.empty(); });
  std::vector<DataFile> data;
  for (std::size_t i = 0; i < found.size(); ++i)
    if (!named || splits[i] == "train")
      data.push_back({path / found[i], is_parquet ? DataFile::Kind::parquet : DataFile::Kind::arrow});
  if (data.empty())
    detail::fail(path.string(), fmt::format("has no train split: its files are named for other splits ({}, ...)",
                                            found.front().string()));
  return data;
}

}  // namespace hpctrain::datasets
