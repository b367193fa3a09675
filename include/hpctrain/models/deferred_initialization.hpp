#pragma once
// A model built from scratch without ever being whole (ZeRO-3's counterpart of DeepSpeed's zero.Init): while a
// DeferredInitialization is alive, each block a family of models/ builds is emptied as soon as it is built
// (BlockConstruction), and every initialising write to its parameters (initialize_normal, the families' own
// touches) is recorded instead of made: a fill as its value, a random draw as the generator's state before it.
// The draw itself is still made, into a scratch tensor of the parameter's full shape, so the generator moves
// exactly as it would have and everything drawn after (the next block, the embedding, the head) is unchanged.
// A rank then rebuilds one parameter at a time from its records (DeferredBlocks::read) and keeps its slice:
// the values equal, bit for bit, those of the same model built whole with the same seed.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <hpctrain/models/blocks.hpp>
#include <hpctrain/models/weights_from_checkpoint.hpp>

namespace hpctrain::models {

class DeferredInitialization {
 public:
  DeferredInitialization()
      : records_(std::make_shared<Records>()),
        scope_([records = records_](torch::nn::Module& block) { records->add_block(block); }),
        previous_(current()) {
    current() = this;
  }
  ~DeferredInitialization() { current() = previous_; }
  DeferredInitialization(const DeferredInitialization&) = delete;
  DeferredInitialization& operator=(const DeferredInitialization&) = delete;

  /// The innermost live scope of this thread, or null.
  static DeferredInitialization*& current() {
    thread_local DeferredInitialization* scope = nullptr;
    return scope;
  }

  /// Whether `parameter` belongs to a block this scope emptied (its writes are recorded, not made).
  bool records(const torch::Tensor& parameter) const {
    return records_->places.count(parameter.unsafeGetTensorImpl()) != 0;
  }

  /// Records `parameter ~ N(mean, std)` at the generator's current state, and advances the generator as the draw would.
  void record_normal(const torch::Tensor& parameter, double mean, double std) {
    auto& record = records_->of(parameter);
    auto generator = at::detail::getDefaultCPUGenerator();
    record.writes.push_back({Write::normal, mean, std, generator.get_state()});
    torch::empty(record.shape.sizes(), torch::TensorOptions(record.shape.dtype())).normal_(mean, std);
  }
  /// Records `parameter = value` (every element).
  void record_fill(const torch::Tensor& parameter, double value) {
    records_->of(parameter).writes.push_back({Write::fill, value, 0.0, {}});
  }

  /// The blocks built empty so far, with where their values come from; null when no block was built under this
  /// scope. Every parameter of them must have been written whole (a parameter left at LibTorch's default
  /// initialisation cannot be rebuilt): std::logic_error naming it.
  std::shared_ptr<DeferredBlocks> blocks() const {
    if (records_->blocks.empty()) return nullptr;
    auto deferred = std::make_shared<DeferredBlocks>();
    for (std::size_t b = 0; b < records_->blocks.size(); ++b) {
      std::vector<torch::Tensor> shapes;
      for (std::size_t k = 0; k < records_->blocks[b].size(); ++k) {
        const auto& record = records_->blocks[b][k];
        if (record.writes.empty())
          throw std::logic_error("block " + std::to_string(b) + "'s parameter " + std::to_string(k) +
                                 " was never initialised: a block built empty must have every parameter written by "
                                 "initialize_normal or init_fill");
        shapes.push_back(record.shape);
      }
      deferred->shapes.push_back(std::move(shapes));
    }
    deferred->read = [records = records_](std::size_t block, std::size_t parameter, std::int64_t offset,
                                          torch::Tensor out) {
      const auto full = records->rebuild(records->blocks.at(block).at(parameter));
      out.copy_(full.view({-1}).narrow(0, offset, out.numel()));
    };
    return deferred;
  }

 private:
  struct Write {
    enum Kind { normal, fill } kind;
    double first = 0, second = 0;   // normal: mean, std; fill: value
    torch::Tensor generator_state;  // normal: the CPU generator's state just before the draw
  };
  struct Record {
    torch::Tensor shape;  // meta, the full shape and dtype
    std::vector<Write> writes;
  };
  /// Shared with DeferredBlocks::read, which outlives the scope.
  struct Records {
    std::vector<std::vector<Record>> blocks;
    std::unordered_map<const void*, std::pair<std::size_t, std::size_t>> places;  // TensorImpl -> (block, parameter)

    void add_block(torch::nn::Module& block) {
      const auto parameters = block.parameters();
      for (std::size_t k = 0; k < parameters.size(); ++k)
        places[parameters[k].unsafeGetTensorImpl()] = {blocks.size(), k};
      std::vector<Record> records;
      for (auto& shape : empty_block_parameters(block)) records.push_back({std::move(shape), {}});
      blocks.push_back(std::move(records));
    }
    Record& of(const torch::Tensor& parameter) {
      const auto& place = places.at(parameter.unsafeGetTensorImpl());
      return blocks[place.first][place.second];
    }
    /// The parameter's whole value, its writes replayed in order; the generator is left as it was.
    static torch::Tensor rebuild(const Record& record) {
      torch::NoGradGuard no_grad;
      auto full = torch::empty(record.shape.sizes(), torch::TensorOptions(record.shape.dtype()));
      auto generator = at::detail::getDefaultCPUGenerator();
      const auto saved = generator.get_state();
      for (const auto& write : record.writes) {
        if (write.kind == Write::fill) {
          full.fill_(write.first);
          continue;
        }
        generator.set_state(write.generator_state);
        full.normal_(write.first, write.second);
      }
      generator.set_state(saved);
      return full;
    }
  };

  std::shared_ptr<Records> records_;
  BlockConstruction scope_;
  DeferredInitialization* previous_;
};

/// `parameter ~ N(mean, std)`; recorded instead when a DeferredInitialization built its block empty.
inline void init_normal(const torch::Tensor& parameter, double mean, double std) {
  if (WeightsFromCheckpoint::active()) return;  // a checkpoint writes it
  torch::NoGradGuard no_grad;
  if (auto* scope = DeferredInitialization::current(); scope != nullptr && scope->records(parameter))
    return scope->record_normal(parameter, mean, std);
  auto target = parameter;
  target.normal_(mean, std);
}

/// `parameter = value`; recorded instead when a DeferredInitialization built its block empty.
inline void init_fill(const torch::Tensor& parameter, double value) {
  if (WeightsFromCheckpoint::active()) return;  // a checkpoint writes it
  torch::NoGradGuard no_grad;
  if (auto* scope = DeferredInitialization::current(); scope != nullptr && scope->records(parameter))
    return scope->record_fill(parameter, value);
  auto target = parameter;
  target.fill_(value);
}

}  // namespace hpctrain::models
