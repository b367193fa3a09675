#pragma once
// safetensors files as LibTorch tensors: a memory-mapped reader (tensors are views of the mapping, copied
// only when a dtype conversion is asked for or the bytes are misaligned), a writer (atomic: a crash
// leaves the old file or the new one; sharded directories: safetensors_shards.hpp), and a checkpoint directory that is
// either one `model.safetensors` or shards listed by `model.safetensors.index.json`. The format itself is parsed in
// safetensors_format.hpp.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fcntl.h>     // open
#include <sys/mman.h>  // mmap: weights are read in place, not copied into a buffer first
#include <sys/stat.h>
#include <unistd.h>

#include <torch/torch.h>

#include <hpctrain/files.hpp>
#include <hpctrain/models/hf/safetensors_format.hpp>

namespace hpctrain::models::safetensors {

/// The LibTorch scalar type of a format dtype.
inline torch::Dtype to_torch(Dtype dtype) {
  switch (dtype) {
    case Dtype::F64: return torch::kFloat64;
    case Dtype::F32: return torch::kFloat32;
    case Dtype::F16: return torch::kFloat16;
    case Dtype::BF16: return torch::kBFloat16;
    case Dtype::I64: return torch::kInt64;
    case Dtype::I32: return torch::kInt32;
    case Dtype::I16: return torch::kInt16;
    case Dtype::I8: return torch::kInt8;
    case Dtype::U64: return torch::kUInt64;
    case Dtype::U32: return torch::kUInt32;
    case Dtype::U16: return torch::kUInt16;
    case Dtype::U8: return torch::kUInt8;
    case Dtype::BOOL: return torch::kBool;
  }
  return torch::kFloat32;
}

/// The format dtype of a LibTorch scalar type; RuntimeError for one the format lacks.
inline Dtype from_torch(torch::Dtype dtype, std::string_view tensor_name) {
  for (auto d : {Dtype::F64, Dtype::F32, Dtype::F16, Dtype::BF16, Dtype::I64, Dtype::I32, Dtype::I16, Dtype::I8,
                 Dtype::U64, Dtype::U32, Dtype::U16, Dtype::U8, Dtype::BOOL}) {
    if (to_torch(d) == dtype) return d;
  }
  throw RuntimeError(errors::runtime_safetensors, fmt::format("tensor {}: dtype {} has no safetensors equivalent",
                                                              tensor_name, c10::toString(dtype)));
}

namespace detail {

/// A read-only view of a whole file, unmapped when the last tensor viewing it is gone.
class Mapping {
 public:
  explicit Mapping(const std::filesystem::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      throw RuntimeError(errors::runtime_safetensors,
                         fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      ::close(fd);
      throw RuntimeError(errors::runtime_safetensors, fmt::format("{}: cannot stat", path.string()));
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      // MAP_PRIVATE + PROT_WRITE: a tensor viewing the mapping may be written in place without touching
      // the file (copy on write), so a view behaves like any other tensor.
      data_ = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
      if (data_ == MAP_FAILED) {
        ::close(fd);
        throw RuntimeError(errors::runtime_safetensors,
                           fmt::format("{}: cannot mmap: {}", path.string(), std::strerror(errno)));
      }
    }
    ::close(fd);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (data_ != nullptr && data_ != MAP_FAILED) ::munmap(data_, size_);
  }
  std::string_view bytes() const { return {static_cast<const char*>(data_), size_}; }
  char* data() const { return static_cast<char*>(data_); }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace detail

/// One safetensors file, memory-mapped; its header is validated on opening (parse_header).
class File {
 public:
  explicit File(std::filesystem::path path)
      : path_(std::move(path)),
        mapping_(std::make_shared<detail::Mapping>(path_)),
        header_(parse_header(mapping_->bytes(), path_.string())) {}

  const std::filesystem::path& path() const { return path_; }
  const Header& header() const { return header_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  bool contains(std::string_view name) const { return header_.find(name) != nullptr; }

  /// The tensor `name` (a view of the mapping when no conversion is needed), converted to `dtype` when
  /// given. RuntimeError naming the file and the tensor when it is absent.
  torch::Tensor tensor(std::string_view name, std::optional<torch::Dtype> dtype = std::nullopt) const {
    const auto* info = header_.find(name);
    if (info == nullptr) throw format_error(path_.string(), name, "not in the file");
    char* bytes = mapping_->data() + header_.data_start + info->begin;
    const auto element = static_cast<std::uintptr_t>(dtype_size(info->dtype));
    auto options = torch::TensorOptions().dtype(to_torch(info->dtype));
    torch::Tensor view;
    if (info->size() == 0) {
      view = torch::empty(info->shape, options);
    } else {
      auto keep = mapping_;
      view = torch::from_blob(
          bytes, info->shape, [keep](void*) {}, options);
      // Kernels may assume element alignment; the format does not promise it.
      if (reinterpret_cast<std::uintptr_t>(bytes) % element != 0) view = view.clone();
    }
    if (dtype && *dtype != view.scalar_type()) view = view.to(*dtype);
    return view;
  }

 private:
  std::filesystem::path path_;
  std::shared_ptr<detail::Mapping> mapping_;
  Header header_;
};

/// Named tensors in the order they are written.
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// Writes `tensors` (moved to the CPU, contiguous) as one safetensors file, atomically.
inline void save_file(const std::filesystem::path& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {}) {
  std::vector<TensorSpec> specs;
  std::vector<torch::Tensor> host;
  specs.reserve(tensors.size());
  host.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    host.push_back(tensor.detach().to(torch::kCPU).contiguous());
    specs.push_back({name, from_torch(tensor.scalar_type(), name), host.back().sizes().vec()});
  }
  const auto header = render_header(specs, metadata);
  std::vector<std::string_view> parts{header};
  for (const auto& tensor : host) parts.emplace_back(static_cast<const char*>(tensor.data_ptr()), tensor.nbytes());
  hpctrain::detail::write_file_atomically(path, parts, errors::runtime_safetensors);
}

/// The name of a single-file checkpoint and of a sharded one's index (transformers' names).
inline constexpr std::string_view single_file_name = "model.safetensors";
inline constexpr std::string_view index_file_name = "model.safetensors.index.json";

/// The weights of a Hugging Face-style directory: `model.safetensors`, or the shards that
/// `model.safetensors.index.json` names. Every shard is validated on opening; the index must name each
/// shard's tensors exactly.
class Checkpoint {
 public:
  explicit Checkpoint(const std::filesystem::path& directory) {
    const auto single = directory / single_file_name;
    const auto index = directory / index_file_name;
    if (std::filesystem::exists(single)) {
      files_.push_back(std::make_unique<File>(single));
      for (const auto& info : files_.back()->tensors()) where_[info.name] = 0;
      return;
    }
    if (!std::filesystem::exists(index))
      throw RuntimeError(errors::runtime_safetensors, fmt::format("{}: neither {} nor {} is there", directory.string(),
                                                                  single_file_name, index_file_name));
    open_shards(directory, index);
  }

  /// Every tensor name, sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, file] : where_) out.push_back(name);
    return out;
  }
  bool contains(std::string_view name) const { return where_.find(std::string(name)) != where_.end(); }
  /// The file that holds `name` (for error messages).
  const File& file_of(std::string_view name) const {
    const auto it = where_.find(std::string(name));
    if (it == where_.end())
      throw RuntimeError(errors::runtime_safetensors, fmt::format("tensor {} is in no file of the checkpoint", name));
    return *files_[it->second];
  }
  const TensorInfo& info(std::string_view name) const { return *file_of(name).header().find(name); }
  torch::Tensor tensor(std::string_view name, std::optional<torch::Dtype> dtype = std::nullopt) const {
    return file_of(name).tensor(name, dtype);
  }

 private:
  void open_shards(const std::filesystem::path& directory, const std::filesystem::path& index) {
    auto json = nlohmann::json::parse(hpctrain::detail::read_file(index, errors::runtime_safetensors), nullptr, false);
    if (json.is_discarded() || !json.is_object() || !json.contains("weight_map") || !json["weight_map"].is_object())
      throw format_error(index.string(), "", "not a JSON object with a \"weight_map\" object");
    std::map<std::string, std::size_t> shard_number;
    for (const auto& [name, shard] : json["weight_map"].items()) {
      if (!shard.is_string()) throw format_error(index.string(), name, "the weight_map value is not a file name");
      const auto file = shard.get<std::string>();
      if (file.find('/') != std::string::npos)
        throw format_error(index.string(), name, fmt::format("shard \"{}\" is not a plain file name", file));
      auto [it, added] = shard_number.emplace(file, files_.size());
      if (added) files_.push_back(std::make_unique<File>(directory / file));
      if (!files_[it->second]->contains(name))
        throw format_error(files_[it->second]->path().string(), name,
                           fmt::format("listed by {} but not in the shard", index.filename().string()));
      where_[name] = it->second;
    }
    for (const auto& file : files_) {
      for (const auto& info : file->tensors()) {
        const auto it = where_.find(info.name);
        if (it == where_.end() || files_[it->second].get() != file.get())
          throw format_error(file->path().string(), info.name,
                             fmt::format("in the shard but not listed for it by {}", index.filename().string()));
      }
    }
  }

  std::vector<std::unique_ptr<File>> files_;
  std::map<std::string, std::size_t, std::less<>> where_;
};

}  // namespace hpctrain::models::safetensors
