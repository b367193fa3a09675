#pragma once
// A module that lists its blocks: the units the fully sharded strategy (ZeRO-3, train/strategies/
// fully_sharded.hpp) gathers one at a time. LibTorch modules have no forward hooks, so the module's forward
// runs each block through `run_block(i, call, input)`: the identity by default; the strategy installs a
// runner that gathers block i's parameters just before the call and frees them after. GPT-2 and Llama
// (models/) list theirs; a user module does the same:
//
//   struct Net : torch::nn::Module, hpctrain::ListsBlocks {
//     std::vector<std::shared_ptr<torch::nn::Module>> blocks() override { return {layer1.ptr(), layer2.ptr()}; }
//     torch::Tensor forward(torch::Tensor x) {
//       x = run_block(0, [&](const torch::Tensor& in) { return layer1(in); }, x);
//       return run_block(1, [&](const torch::Tensor& in) { return layer2(in); }, x);
//     }
//   };
//
// Parameters outside the blocks (embeddings, final norm, head) form one more unit, kept whole (as ZeRO-2).
#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

namespace hpctrain {

/// A block's computation on one input: `output = block(input)`.
using BlockCall = std::function<torch::Tensor(const torch::Tensor&)>;
/// Runs block `index` of a module on `input` (a strategy's wrapper around the call).
using BlockRunner = std::function<torch::Tensor(std::size_t index, const BlockCall& call, const torch::Tensor& input)>;

/// Mixin for a torch::nn::Module whose forward runs a list of blocks, each through run_block().
class ListsBlocks {
 public:
  virtual ~ListsBlocks() = default;
  /// The blocks in the order forward runs them; each is called once per forward, through run_block.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> blocks() = 0;
  /// Installs (or, with an empty runner, removes) the wrapper every block call goes through.
  void set_block_runner(BlockRunner runner) { block_runner_ = std::move(runner); }
  /// Whether a runner is installed.
  bool has_block_runner() const { return static_cast<bool>(block_runner_); }

 protected:
  /// `call(input)`, through the installed runner if any. `index` is the block's place in blocks().
  torch::Tensor run_block(std::size_t index, const BlockCall& call, const torch::Tensor& input) {
    return block_runner_ ? block_runner_(index, call, input) : call(input);
  }

 private:
  BlockRunner block_runner_;
};

}  // namespace hpctrain
