#pragma once
// IDX files (the MNIST family's format), gzipped or plain: validated magic number, dimensions and size,
// and errors that name the file and what is wrong with it.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join for the dimensions in messages
#include <torch/types.h>
#include <zlib.h>  // gzread reads gzipped and plain files alike

#include <hpctrain/error.hpp>
#include <hpctrain/train/data/idx_format.hpp>
#include <hpctrain/train/data/source.hpp>

namespace hpctrain::data {

namespace detail {
inline std::string read_possibly_gzipped(const std::filesystem::path& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) throw RuntimeError(errors::runtime_data_idx, fmt::format("{}: cannot open", path.string()));
  std::string bytes;
  char buffer[1 << 16];
  int got = 0;
  while ((got = gzread(file, buffer, sizeof buffer)) > 0) bytes.append(buffer, static_cast<std::size_t>(got));
  int status = Z_OK;
  const std::string error = got < 0 ? gzerror(file, &status) : "";
  gzclose(file);
  if (got < 0)
    throw RuntimeError(errors::runtime_data_idx, fmt::format("{}: corrupt gzip stream ({})", path.string(), error));
  return bytes;
}
}  // namespace detail

/// An IDX file's unsigned-byte contents and dimensions.
struct IdxArray {
  std::vector<std::int64_t> dims;
  torch::Tensor values;  ///< uint8, shaped `dims`
};

/// Reads an IDX file of unsigned bytes (type 0x08) with `expected_rank` dimensions; throws
/// `[hpctrain.runtime.data.idx] <file>: <why>` if the magic number, rank or size is wrong.
inline IdxArray read_idx(const std::filesystem::path& path, int expected_rank) {
  const std::string bytes = detail::read_possibly_gzipped(path);
  const IdxLayout layout = parse_idx_layout(bytes, expected_rank, path);  // idx_format.hpp: torch-free, fuzzed
  IdxArray array;
  array.dims = layout.dims;
  array.values = torch::empty(array.dims, torch::kUInt8);
  std::memcpy(array.values.data_ptr(), bytes.data() + layout.data_offset, layout.count);
  return array;
}

/// Images `[N, 1, rows, cols]` as floats in [0, 1] and labels `[N]` as int64 from a pair of IDX files.
inline TensorDataset load_idx(const std::filesystem::path& images, const std::filesystem::path& labels) {
  IdxArray image_array = read_idx(images, 3);
  IdxArray label_array = read_idx(labels, 1);
  if (image_array.dims[0] != label_array.dims[0])
    throw RuntimeError(errors::runtime_data_idx,
                       fmt::format("{} holds {} images but {} holds {} labels", images.string(), image_array.dims[0],
                                   labels.string(), label_array.dims[0]));
  TensorDataset dataset;
  dataset.inputs = image_array.values.to(torch::kFloat32).div_(255.0).unsqueeze(1).contiguous();
  dataset.targets = label_array.values.to(torch::kInt64);
  return dataset;
}

/// A data source over an IDX image/label pair (MNIST, Fashion-MNIST, ...), read when the worker starts.
inline Source idx(std::filesystem::path images, std::filesystem::path labels) {
  return Source([images, labels] { return load_idx(images, labels); },
                fmt::format("idx({}, {})", images.string(), labels.string()));
}

}  // namespace hpctrain::data
