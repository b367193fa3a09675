#pragma once
// A checkpoint directory written as transformers writes it — one `model.safetensors`, or shards
// `model-0000i-of-0000n.safetensors` and `model.safetensors.index.json` — planned from the tensors' names, shapes
// and dtypes alone, then filled one tensor at a time: a shard's header is written before its data (its offsets
// follow from the plan), each tensor is appended as it arrives and may be freed at once. The writer holds no
// tensor: an export streamed from a sharded model needs no more than the tensor being appended.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <hpctrain/files.hpp>
#include <hpctrain/models/hf/safetensors.hpp>

namespace hpctrain::models::safetensors {

/// The bytes a tensor of `spec` takes in a file.
inline std::uint64_t spec_bytes(const TensorSpec& spec) {
  std::uint64_t elements = 1;
  for (auto d : spec.shape) elements *= static_cast<std::uint64_t>(d);
  return elements * dtype_size(spec.dtype);
}

/// The files of a planned checkpoint: each one's name and tensors, in the order they are written.
struct ShardPlan {
  struct Shard {
    std::string file;
    std::vector<TensorSpec> tensors;
  };
  std::vector<Shard> shards;
  std::uint64_t total_bytes = 0;
};

/// Splits `tensors` (in this order) into shards of at most `max_shard_bytes` as transformers'
/// split_torch_state_dict_into_shards does: a tensor opens a new shard when the current one is not empty and would grow
/// past the limit (a tensor larger than the limit gets a shard of its own). One shard is `model.safetensors`.
inline ShardPlan plan_shards(const std::vector<TensorSpec>& tensors, std::uint64_t max_shard_bytes) {
  ShardPlan plan;
  plan.shards.emplace_back();
  std::uint64_t in_shard = 0;
  for (const auto& spec : tensors) {
    const auto bytes = spec_bytes(spec);
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
      plan.shards.emplace_back();
      in_shard = 0;
    }
    plan.shards.back().tensors.push_back(spec);
    in_shard += bytes;
    plan.total_bytes += bytes;
  }
  for (std::size_t i = 0; i < plan.shards.size(); ++i)
    plan.shards[i].file = plan.shards.size() == 1
                              ? std::string(single_file_name)
                              : fmt::format("model-{:05}-of-{:05}.safetensors", i + 1, plan.shards.size());
  return plan;
}

/// Which shards of a plan this writer writes: shard i when i % writers == writer (the ranks of a run that all see
/// every tensor, each writing its share of the files in parallel); writer 0 writes the index. Default: all of them.
struct ShardShare {
  std::size_t writer = 0;
  std::size_t writers = 1;
  bool writes(std::size_t shard) const { return shard % writers == writer; }
};

/// Writes a planned checkpoint into `directory`, one tensor at a time in the plan's order: append() writes the
/// tensor (converted to its planned dtype) into the current shard, finish() the index. Each shard is written under
/// a temporary name, fsynced and renamed when its last tensor is in; the index last, so a reader never sees an
/// index of missing shards. A tensor out of order, or of another shape, is a RuntimeError naming both. With a
/// share, the tensors of the shards another writer writes are checked and passed over (not converted, not written).
class ShardWriter {
 public:
  ShardWriter(std::filesystem::path directory, ShardPlan plan, ShardShare share = {})
      : directory_(std::move(directory)), plan_(std::move(plan)), share_(share) {
    std::filesystem::create_directories(directory_);
  }

  /// Appends the next tensor of the plan, named `name`.
  void append(const std::string& name, const torch::Tensor& tensor) {
    if (shard_ >= plan_.shards.size()) throw mismatch(name, "the plan has no more tensors");
    const bool writes = share_.writes(shard_);
    if (writes && !file_) open_shard();
    const auto& spec = plan_.shards[shard_].tensors[next_];
    if (spec.name != name) throw mismatch(name, fmt::format("the plan's next tensor is {}", spec.name));
    if (tensor.sizes().vec() != spec.shape)
      throw mismatch(name, fmt::format("shape {} but the plan says {}", fmt::join(tensor.sizes(), "x"),
                                       fmt::join(spec.shape, "x")));
    if (writes) {
      const auto host = tensor.detach().to(torch::kCPU, to_torch(spec.dtype)).contiguous();
      file_->write(host.data_ptr(), host.nbytes());
    }
    if (++next_ == plan_.shards[shard_].tensors.size()) close_shard();
  }

  /// After the last tensor: writes the index (sharded checkpoints). RuntimeError when tensors are missing.
  void finish() {
    if (shard_ == 0 && plan_.shards.front().tensors.empty()) {  // a model without weights: a file without tensors
      if (share_.writes(0)) open_shard();
      close_shard();
    }
    if (shard_ < plan_.shards.size())
      throw mismatch(plan_.shards[shard_].tensors[next_].name, "not written: the export ended before it");
    if (plan_.shards.size() == 1 || share_.writer != 0) return;
    nlohmann::json weight_map = nlohmann::json::object();  // sorted by name, as transformers writes it
    for (const auto& shard : plan_.shards)
      for (const auto& spec : shard.tensors) weight_map[spec.name] = shard.file;
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", plan_.total_bytes}};
    index["weight_map"] = weight_map;
    hpctrain::detail::write_file_atomically(directory_ / index_file_name, index.dump(2) + "\n",
                                            errors::runtime_safetensors);
  }

  /// The shards this writer wrote, by file name.
  const std::vector<std::string>& written_files() const { return written_files_; }

 private:
  RuntimeError mismatch(const std::string& name, const std::string& why) const {
    return RuntimeError(errors::runtime_safetensors, fmt::format("{}: tensor {}: {}", directory_.string(), name, why));
  }

  void open_shard() {
    const auto& shard = plan_.shards[shard_];
    file_.emplace(directory_ / shard.file, errors::runtime_safetensors);
    file_->write(render_header(shard.tensors, {{"format", "pt"}}));
  }

  void close_shard() {
    if (file_) {
      file_->commit();
      file_.reset();
      written_files_.push_back(plan_.shards[shard_].file);
    }
    ++shard_;
    next_ = 0;
  }

  std::filesystem::path directory_;
  ShardPlan plan_;
  ShardShare share_;
  std::vector<std::string> written_files_;
  std::size_t shard_ = 0, next_ = 0;
  std::optional<hpctrain::detail::StagedFile> file_;  // the shard being written
};

/// Writes `tensors` into `directory` as `model.safetensors`, or, when they exceed `max_shard_bytes`, as
/// `model-0000i-of-0000n.safetensors` shards and `model.safetensors.index.json` (transformers' layout), each in
/// its own dtype.
inline void save_checkpoint(const std::filesystem::path& directory, const NamedTensors& tensors,
                            std::uint64_t max_shard_bytes = std::numeric_limits<std::uint64_t>::max()) {
  std::vector<TensorSpec> specs;
  for (const auto& [name, tensor] : tensors)
    specs.push_back({name, from_torch(tensor.scalar_type(), name), tensor.sizes().vec()});
  ShardWriter writer(directory, plan_shards(specs, max_shard_bytes));
  for (const auto& [name, tensor] : tensors) writer.append(name, tensor);
  writer.finish();
}

}  // namespace hpctrain::models::safetensors
