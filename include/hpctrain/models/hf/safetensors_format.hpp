#pragma once
// The safetensors format without LibTorch: parsing and validating a file's header, and rendering one.
// A file is: 8 bytes little-endian u64 N, N bytes of JSON header, then the data buffer. The header maps
// each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data
// buffer) plus an optional "__metadata__" object of strings. hpctrain accepts a file only when the
// tensors tile the data buffer exactly: sorted by offset they start at 0, each begins where the previous
// ended (no overlap, no gap), the last ends at the end of the file, and each one's size is shape × dtype.
// Kept torch-free so the parser can be fuzzed on its own (tests/fuzz) and read on a login node.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/error.hpp>

namespace hpctrain::models::safetensors {

/// The element types of the format hpctrain reads and writes.
enum class Dtype { F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL };

/// The format's name of a dtype ("F32", "BF16", ...).
inline std::string_view dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::F64: return "F64";
    case Dtype::F32: return "F32";
    case Dtype::F16: return "F16";
    case Dtype::BF16: return "BF16";
    case Dtype::I64: return "I64";
    case Dtype::I32: return "I32";
    case Dtype::I16: return "I16";
    case Dtype::I8: return "I8";
    case Dtype::U64: return "U64";
    case Dtype::U32: return "U32";
    case Dtype::U16: return "U16";
    case Dtype::U8: return "U8";
    case Dtype::BOOL: return "BOOL";
  }
  return "?";
}

/// Bytes per element.
inline std::uint64_t dtype_size(Dtype dtype) {
  switch (dtype) {
    case Dtype::F64:
    case Dtype::I64:
    case Dtype::U64: return 8;
    case Dtype::F32:
    case Dtype::I32:
    case Dtype::U32: return 4;
    case Dtype::F16:
    case Dtype::BF16:
    case Dtype::I16:
    case Dtype::U16: return 2;
    case Dtype::I8:
    case Dtype::U8:
    case Dtype::BOOL: return 1;
  }
  return 0;
}

/// The dtype a format name denotes, or nullopt for one hpctrain does not know.
inline std::optional<Dtype> parse_dtype(std::string_view name) {
  for (auto dtype : {Dtype::F64, Dtype::F32, Dtype::F16, Dtype::BF16, Dtype::I64, Dtype::I32, Dtype::I16, Dtype::I8,
                     Dtype::U64, Dtype::U32, Dtype::U16, Dtype::U8, Dtype::BOOL}) {
    if (dtype_name(dtype) == name) return dtype;
  }
  return std::nullopt;
}

/// One tensor of a file: where its bytes lie in the data buffer.
struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  ///< offset of the first byte in the data buffer
  std::uint64_t end = 0;    ///< one past the last byte
  std::uint64_t size() const { return end - begin; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

/// A validated header: the tensors sorted by offset, the metadata, where the data buffer starts.
struct Header {
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
  std::uint64_t data_start = 0;  ///< 8 + header length
  std::uint64_t data_size = 0;

  /// The tensor named `name`, or nullptr.
  const TensorInfo* find(std::string_view name) const {
    for (const auto& tensor : tensors) {
      if (tensor.name == name) return &tensor;
    }
    return nullptr;
  }
};

/// The largest header accepted (the reference implementation's limit): a bigger one is not a model.
inline constexpr std::uint64_t max_header_size = 100'000'000;

/// `[hpctrain.runtime.safetensors] <file>: [tensor <name>: ]<reason>`
inline RuntimeError format_error(std::string_view file, std::string_view tensor, std::string_view reason) {
  if (tensor.empty()) return RuntimeError(errors::runtime_safetensors, fmt::format("{}: {}", file, reason));
  return RuntimeError(errors::runtime_safetensors, fmt::format("{}: tensor {}: {}", file, tensor, reason));
}

namespace detail {

inline std::uint64_t read_u64_le(const char* p) {
  std::uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(p[i]);
  return value;
}

inline void write_u64_le(std::string& out, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

/// Reads one header entry; every failure names the tensor.
inline TensorInfo parse_entry(std::string_view file, const std::string& name, const nlohmann::json& entry) {
  auto fail = [&](const std::string& reason) { return format_error(file, name, reason); };
  if (!entry.is_object()) throw fail("the header entry is not an object");
  for (const auto& [key, value] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      throw fail(fmt::format("unknown header field \"{}\"", key));
  }
  if (!entry.contains("dtype") || !entry["dtype"].is_string()) throw fail("\"dtype\" is missing or not a string");
  if (!entry.contains("shape") || !entry["shape"].is_array()) throw fail("\"shape\" is missing or not an array");
  if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2)
    throw fail("\"data_offsets\" is missing or not [begin, end]");
  TensorInfo info;
  info.name = name;
  const auto dtype_text = entry["dtype"].get<std::string>();
  const auto dtype = parse_dtype(dtype_text);
  if (!dtype) throw fail(fmt::format("unknown dtype \"{}\"", dtype_text));
  info.dtype = *dtype;
  // The product of the dimensions must not overflow: a hostile shape would otherwise "match" its size.
  std::uint64_t elements = 1;
  for (const auto& dim : entry["shape"]) {
    if (!dim.is_number_unsigned())
      throw fail(fmt::format("shape {} has a dimension that is not a non-negative integer", entry["shape"].dump()));
    const auto d = dim.get<std::uint64_t>();
    if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
        (d != 0 && elements > std::numeric_limits<std::uint64_t>::max() / 8 / d))
      throw fail(fmt::format("shape {} is too large", entry["shape"].dump()));
    elements *= d;
    info.shape.push_back(static_cast<std::int64_t>(d));
  }
  const auto& offsets = entry["data_offsets"];
  if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
    throw fail(fmt::format("data_offsets {} are not non-negative integers", offsets.dump()));
  info.begin = offsets[0].get<std::uint64_t>();
  info.end = offsets[1].get<std::uint64_t>();
  if (info.end < info.begin)
    throw fail(fmt::format("data_offsets [{}, {}] end before they begin", info.begin, info.end));
  const auto expected = elements * dtype_size(info.dtype);
  if (info.size() != expected)
    throw fail(fmt::format("data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {}", info.begin, info.end,
                           info.size(), entry["shape"].dump(), dtype_text, expected));
  return info;
}

/// The tensors, sorted by offset, must tile [0, data_size) exactly.
inline void check_tiling(std::string_view file, const std::vector<TensorInfo>& tensors, std::uint64_t data_size) {
  std::uint64_t position = 0;
  const TensorInfo* previous = nullptr;
  for (const auto& tensor : tensors) {
    if (tensor.begin < position)
      throw format_error(file, tensor.name,
                         fmt::format("data_offsets [{}, {}] overlap tensor {} (which ends at {})", tensor.begin,
                                     tensor.end, previous->name, position));
    if (tensor.begin > position)
      throw format_error(file, tensor.name,
                         fmt::format("data_offsets [{}, {}] leave a gap of {} bytes after {}", tensor.begin, tensor.end,
                                     tensor.begin - position, previous ? "tensor " + previous->name : "the header"));
    if (tensor.end > data_size)
      throw format_error(file, tensor.name,
                         fmt::format("data_offsets [{}, {}] run past the end of the data ({} bytes)", tensor.begin,
                                     tensor.end, data_size));
    position = tensor.end;
    previous = &tensor;
  }
  if (position != data_size)
    throw format_error(
        file, previous ? previous->name : "",
        fmt::format("the data holds {} bytes after the last tensor ends at {}", data_size - position, position));
}

}  // namespace detail

/// Parses and validates the header of a safetensors file whose whole content is `bytes` (memory-mapped
/// by the caller); `file` names it in errors. Throws RuntimeError `hpctrain.runtime.safetensors` naming
/// the file, the tensor and the reason; returns only when every tensor's bytes are in bounds and sized.
inline Header parse_header(std::string_view bytes, std::string_view file) {
  if (bytes.size() < 8)
    throw format_error(file, "",
                       fmt::format("the file is {} bytes, shorter than the 8-byte header length", bytes.size()));
  const auto header_size = detail::read_u64_le(bytes.data());
  if (header_size > bytes.size() - 8)
    throw format_error(
        file, "", fmt::format("header length {} runs past the end of the file ({} bytes)", header_size, bytes.size()));
  if (header_size > max_header_size)
    throw format_error(file, "",
                       fmt::format("header length {} exceeds the limit of {} bytes", header_size, max_header_size));
  const auto text = bytes.substr(8, header_size);
  nlohmann::json json = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) throw format_error(file, "", "the header is not valid JSON");
  if (!json.is_object()) throw format_error(file, "", "the header is not a JSON object");

  Header header;
  header.data_start = 8 + header_size;
  header.data_size = bytes.size() - header.data_start;
  for (const auto& [name, entry] : json.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) throw format_error(file, "", "__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string())
          throw format_error(file, "", fmt::format("__metadata__ value of \"{}\" is not a string", key));
        header.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    header.tensors.push_back(detail::parse_entry(file, name, entry));
  }
  std::stable_sort(header.tensors.begin(), header.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  detail::check_tiling(file, header.tensors, header.data_size);
  return header;
}

/// One tensor to write: its name, dtype and shape (the bytes are the caller's).
struct TensorSpec {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<std::int64_t> shape;
};

/// The bytes that precede the data buffer (length prefix + JSON header, space-padded to a multiple of 8
/// as the reference writer does so the data stays aligned), with the tensors laid out in the given order.
inline std::string render_header(const std::vector<TensorSpec>& tensors,
                                 const std::map<std::string, std::string>& metadata = {}) {
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  if (!metadata.empty()) json["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& tensor : tensors) {
    std::uint64_t elements = 1;
    for (auto d : tensor.shape) elements *= static_cast<std::uint64_t>(d);
    const auto size = elements * dtype_size(tensor.dtype);
    json[tensor.name] = {
        {"dtype", dtype_name(tensor.dtype)}, {"shape", tensor.shape}, {"data_offsets", {offset, offset + size}}};
    offset += size;
  }
  std::string text = json.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + text.size());
  detail::write_u64_le(out, text.size());
  out += text;
  return out;
}

}  // namespace hpctrain::models::safetensors
