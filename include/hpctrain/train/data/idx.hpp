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
#include <torch/torch.h>
#include <zlib.h>  // gzread reads gzipped and plain files alike

#include <hpctrain/error.hpp>
#include <hpctrain/train/data/source.hpp>

namespace hpctrain::data {

namespace detail {
inline std::string read_possibly_gzipped(const std::filesystem::path& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) throw RuntimeError("data.idx", fmt::format("{}: cannot open", path.string()));
  std::string bytes;
  char buffer[1 << 16];
  int got = 0;
  while ((got = gzread(file, buffer, sizeof buffer)) > 0) bytes.append(buffer, static_cast<std::size_t>(got));
  int status = Z_OK;
  const std::string error = got < 0 ? gzerror(file, &status) : "";
  gzclose(file);
  if (got < 0) throw RuntimeError("data.idx", fmt::format("{}: corrupt gzip stream ({})", path.string(), error));
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
  auto fail = [&](const std::string& why) { return RuntimeError("data.idx", fmt::format("{}: {}", path.string(), why)); };
  if (bytes.size() < 4) throw fail(fmt::format("{} bytes is too short for an IDX header", bytes.size()));
  const auto* raw = reinterpret_cast<const unsigned char*>(bytes.data());
  if (raw[0] != 0 || raw[1] != 0)
    throw fail(fmt::format("bad magic number 0x{:02x}{:02x}{:02x}{:02x} (an IDX file starts with two zero bytes)",
                           raw[0], raw[1], raw[2], raw[3]));
  if (raw[2] != 0x08) throw fail(fmt::format("element type 0x{:02x} is not 0x08 (unsigned byte)", raw[2]));
  if (raw[3] != expected_rank) throw fail(fmt::format("{} dimensions, expected {}", raw[3], expected_rank));
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(expected_rank);
  if (bytes.size() < header) throw fail(fmt::format("{} bytes is too short for a {}-dimension header", bytes.size(), expected_rank));
  IdxArray array;
  std::size_t count = 1;
  for (int d = 0; d < expected_rank; ++d) {
    const unsigned char* p = raw + 4 + 4 * d;  // dimensions are big-endian uint32
    const std::uint32_t dim = (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
    array.dims.push_back(dim);
    count *= dim;
  }
  if (bytes.size() - header != count)
    throw fail(fmt::format("holds {} data bytes, but its dimensions {} need {}", bytes.size() - header,
                           fmt::join(array.dims, "x"), count));
  array.values = torch::empty(array.dims, torch::kUInt8);
  std::memcpy(array.values.data_ptr(), raw + header, count);
  return array;
}

/// Images `[N, 1, rows, cols]` as floats in [0, 1] and labels `[N]` as int64 from a pair of IDX files.
inline TensorDataset load_idx(const std::filesystem::path& images, const std::filesystem::path& labels) {
  IdxArray image_array = read_idx(images, 3);
  IdxArray label_array = read_idx(labels, 1);
  if (image_array.dims[0] != label_array.dims[0])
    throw RuntimeError("data.idx", fmt::format("{} holds {} images but {} holds {} labels", images.string(),
                                               image_array.dims[0], labels.string(), label_array.dims[0]));
  TensorDataset dataset;
  dataset.inputs = image_array.values.to(torch::kFloat32).div_(255.0).unsqueeze(1).contiguous();
  dataset.targets = label_array.values.to(torch::kInt64);
  return dataset;
}

/// A data source over an IDX image/label pair (MNIST, Fashion-MNIST, ...), read when the worker starts.
inline Source idx(std::filesystem::path images, std::filesystem::path labels) {
  return Source([images, labels] { return load_idx(images, labels); }, fmt::format("idx({}, {})", images.string(), labels.string()));
}

}  // namespace hpctrain::data
