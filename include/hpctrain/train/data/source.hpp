#pragma once
// What the loop needs from a data set: its size and a batch for a list of indices. A `Source` is the
// description (cheap, copied into the Training); it loads the data only when a worker starts, never on
// the login node.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/types.h>  // not torch/torch.h: a torch::data dataset is only a template parameter here (from_torch)

#include <hpctrain/error.hpp>

namespace hpctrain::data {

/// A batch: model inputs and targets, and any named extra tensors ("loss_mask", "attention_mask",
/// "lengths", ...), first dimension = batch. Datasets that only fill inputs and targets (`return {x, y};`)
/// leave `fields` empty.
struct Batch {
  torch::Tensor inputs;
  torch::Tensor targets;
  /// Named extra tensors, first dimension = batch.
  std::map<std::string, torch::Tensor, std::less<>> fields;

  Batch() = default;
  Batch(torch::Tensor inputs_, torch::Tensor targets_, std::map<std::string, torch::Tensor, std::less<>> fields_ = {})
      : inputs(std::move(inputs_)), targets(std::move(targets_)), fields(std::move(fields_)) {}

  /// The field `name`; throws RuntimeError(errors::runtime_batch_field) naming it and the fields present.
  const torch::Tensor& field(std::string_view name) const {
    if (const auto found = fields.find(name); found != fields.end()) return found->second;
    std::string present;
    for (const auto& [key, value] : fields) present += (present.empty() ? "" : ", ") + key;
    throw RuntimeError(errors::runtime_batch_field, fmt::format("the batch has no field '{}' (fields: {})", name,
                                                                present.empty() ? "none" : present));
  }
  /// Whether the batch carries field `name`.
  bool has(std::string_view name) const { return fields.find(name) != fields.end(); }
  /// Number of examples (`inputs.size(0)`).
  std::int64_t size() const { return inputs.size(0); }
  /// Examples `[begin, begin + n)` of every tensor, along dimension 0 (views, no copy).
  Batch narrow(std::int64_t begin, std::int64_t n) const {
    auto part = [&](const torch::Tensor& t) { return t.defined() ? t.narrow(0, begin, n) : t; };
    Batch out(part(inputs), part(targets));
    for (const auto& [key, value] : fields) out.fields.emplace(key, part(value));
    return out;
  }
  /// Every tensor copied into page-locked host memory (needs a CUDA device): a later `to(cuda, true)` from it
  /// does not wait for the copy.
  Batch pinned() const {
    auto pin = [](const torch::Tensor& t) { return t.defined() ? t.pin_memory() : t; };
    Batch out(pin(inputs), pin(targets));
    for (const auto& [key, value] : fields) out.fields.emplace(key, pin(value));
    return out;
  }
  /// Every tensor on `device`.
  Batch to(torch::Device device, bool non_blocking = false) const {
    auto move = [&](const torch::Tensor& t) { return t.defined() ? t.to(device, non_blocking) : t; };
    Batch out(move(inputs), move(targets));
    for (const auto& [key, value] : fields) out.fields.emplace(key, move(value));
    return out;
  }
};

/// What a batch of variable-length rows carries: its tokens, and its token slots (rows × the padded length).
struct BatchFill {
  std::int64_t tokens = 0;
  std::int64_t slots = 0;
  /// The share of the slots that are padding (0 for no slot).
  double padding() const { return slots > 0 ? 1.0 - static_cast<double>(tokens) / static_cast<double>(slots) : 0.0; }
  BatchFill& operator+=(const BatchFill& other) {
    tokens += other.tokens;
    slots += other.slots;
    return *this;
  }
};

class MixedDataset;  // train/data/mix.hpp

/// Random access to examples by index; `batch` must be a pure function of the indices (exact resume).
class Dataset {
 public:
  virtual ~Dataset() = default;
  /// Number of examples.
  virtual std::int64_t size() const = 0;
  /// The examples at `indices`, stacked.
  virtual Batch batch(const std::vector<std::int64_t>& indices) const = 0;
  /// The examples at `indices` as training epoch `epoch` sees them: the Trainer asks this way, so a dataset
  /// whose examples change per epoch (masked-LM masking) draws from (epoch, index) and resumes exactly.
  /// Default: the same examples every epoch.
  virtual Batch batch_in_epoch(const std::vector<std::int64_t>& indices, std::int64_t /*epoch*/) const {
    return batch(indices);
  }
  /// The tokens and slots `batch(indices)` would carry, without making it: a dataset of variable-length rows
  /// answers (the Trainer reports the padding of an epoch's batches); fixed-size examples have none to report.
  virtual std::optional<BatchFill> fill(const std::vector<std::int64_t>& /*indices*/) const { return std::nullopt; }
  /// The mix of sources this dataset is, if it is one (the Trainer reports and checkpoints each source's position).
  virtual const MixedDataset* mixture() const { return nullptr; }
};

/// A dataset held in tensors (first dimension = example): inputs, targets and named fields ("loss_mask", ...).
struct TensorDataset : Dataset {
  torch::Tensor inputs;
  torch::Tensor targets;
  std::map<std::string, torch::Tensor, std::less<>> fields;
  std::int64_t size() const override { return inputs.size(0); }
  Batch batch(const std::vector<std::int64_t>& indices) const override {
    const auto index = torch::tensor(indices, torch::kInt64);
    Batch out(inputs.index_select(0, index), targets.index_select(0, index));
    for (const auto& [name, field] : fields) out.fields.emplace(name, field.index_select(0, index));
    return out;
  }
};

namespace detail {
/// Any `torch::data` dataset whose `get(i)` returns an Example<Tensor, Tensor>.
template <class TorchDataset>
class TorchDatasetAdapter : public Dataset {
 public:
  explicit TorchDatasetAdapter(TorchDataset dataset) : dataset_(std::move(dataset)) {}
  std::int64_t size() const override { return static_cast<std::int64_t>(dataset_.size().value()); }
  Batch batch(const std::vector<std::int64_t>& indices) const override {
    std::vector<torch::Tensor> inputs, targets;
    for (const auto i : indices) {
      auto example = dataset_.get(static_cast<std::size_t>(i));
      inputs.push_back(example.data);
      targets.push_back(example.target);
    }
    return {torch::stack(inputs), torch::stack(targets)};
  }

 private:
  mutable TorchDataset dataset_;  // torch::data's get() is not const
};
}  // namespace detail

/// A lazily loaded dataset: `load()` runs in the worker.
class Source {
 public:
  Source() = default;
  /// `loader` returns a Dataset (by value or shared_ptr); `description` names it in messages.
  template <class Loader>
  Source(Loader loader, std::string description) : description_(std::move(description)) {
    load_ = [loader = std::move(loader)]() -> std::shared_ptr<const Dataset> {
      auto loaded = loader();
      if constexpr (requires {
                      loaded.get();
                      loaded.use_count();
                    })
        return loaded;
      else return std::make_shared<decltype(loaded)>(std::move(loaded));
    };
  }
  /// Whether a source was given.
  explicit operator bool() const { return static_cast<bool>(load_); }
  /// Reads the data (in the worker).
  std::shared_ptr<const Dataset> load() const { return load_(); }
  /// What the source is, for messages.
  const std::string& description() const { return description_; }

 private:
  std::function<std::shared_ptr<const Dataset>()> load_;
  std::string description_;
};

/// Wraps a user's `torch::data` dataset (e.g. `torch::data::datasets::MNIST`); made in the worker by `factory`.
template <class Factory>
Source from_torch(Factory factory, std::string description = "torch::data dataset") {
  return Source(
      [factory] {
        using TorchDataset = decltype(factory());
        return std::make_shared<detail::TorchDatasetAdapter<TorchDataset>>(factory());
      },
      std::move(description));
}

/// Wraps in-memory tensors: inputs, targets and named fields that each batch carries (`batch.field(name)`); every
/// tensor has one row per example. SpecError `[hpctrain.spec.data.tensors]` naming a tensor with another count.
inline Source tensors(torch::Tensor inputs, torch::Tensor targets,
                      std::map<std::string, torch::Tensor, std::less<>> fields = {}) {
  const auto rows = inputs.size(0);
  hpctrain::detail::require(targets.size(0) == rows, errors::spec_data_tensors,
                            fmt::format("targets [{}]", targets.size(0)),
                            fmt::format("must have one row per example, as the inputs: {}", rows));
  for (const auto& [name, field] : fields)
    hpctrain::detail::require(field.dim() > 0 && field.size(0) == rows, errors::spec_data_tensors,
                              fmt::format("field {} [{}]", name, field.dim() > 0 ? field.size(0) : 0),
                              fmt::format("must have one row per example, as the inputs: {}", rows));
  return Source(
      [inputs, targets, fields] {
        TensorDataset dataset;
        dataset.inputs = inputs;
        dataset.targets = targets;
        dataset.fields = fields;
        return dataset;
      },
      "tensors");
}

}  // namespace hpctrain::data
