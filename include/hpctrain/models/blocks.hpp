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
// Parameters outside the blocks (embeddings, final norm, head) are kept whole (as ZeRO-2), except the two
// "edges" a model may name: its token embedding and its head, when they share no weight (untied). A model runs
// each through `run_edge(edge, call, input)`, and the fully sharded strategy shards them like blocks, gathering
// each only around its call (FSDP2 and torchtitan wrap `tok_embeddings` and `output` the same way): at Llama 3's
// vocabulary they are an eighth of an 8B model.
//
// Deferred blocks: a model can be built with its blocks' parameters left empty (DeepSpeed's zero.Init, FSDP's
// meta-device model). A loader builds each block under a BlockConstruction scope, which empties it as soon as
// it is built, so that the whole model never exists at once, and attaches DeferredBlocks: the full shapes and
// where the values come from. A loader defers the model's edges too (their values are in the checkpoint): at Llama
// 3's vocabulary they are 1 of 8 billion parameters, 4 GiB a rank in fp32. The fully sharded strategy then reads only
// its own slices of each block and edge; anything else calls materialize_blocks first.
#if defined(__GLIBC__)
#include <malloc.h>  // malloc_trim
#endif

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <hpctrain/models/recompute/recompute.hpp>

namespace hpctrain {

/// A block's computation on one input: `output = block(input)`.
using BlockCall = std::function<torch::Tensor(const torch::Tensor&)>;
/// Runs block `index` of a module on `input` (a strategy's wrapper around the call).
using BlockRunner = std::function<torch::Tensor(std::size_t index, const BlockCall& call, const torch::Tensor& input)>;

/// The two modules outside the blocks a model may run through ListsBlocks::run_edge: the token embedding (run
/// first, on the ids) and the head (run last, on the final hidden states).
enum class Edge { embedding, head };
/// Runs `edge` of a module on `input` (a strategy's wrapper around the call).
using EdgeRunner = std::function<torch::Tensor(Edge edge, const BlockCall& call, const torch::Tensor& input)>;

/// Where a parameter of the deferred blocks sits: its block and its place in the block's parameters() (the indices
/// of DeferredBlocks::shapes and ::read).
struct DeferredPlace {
  std::size_t block = 0, parameter = 0;
};

/// The blocks of a model whose parameters are still empty, and where their values come from.
struct DeferredBlocks {
  /// For each block, in blocks() order, then (where the loader deferred them too: edges_deferred) each edge the model
  /// names, the embedding before the head: its parameters in registration order (parameters()), each as a meta
  /// tensor with the full shape and dtype.
  std::vector<std::vector<torch::Tensor>> shapes;
  /// Whether shapes lists the model's edges after its blocks (a model loaded from a checkpoint; one initialised from
  /// scratch, models/deferred_initialization.hpp, builds its edges whole).
  bool edges_deferred = false;
  /// Writes elements [offset, offset + out.numel()) of block `block`'s parameter `parameter`, flattened in
  /// row-major order, into `out` (converted to out's dtype and device).
  std::function<void(std::size_t block, std::size_t parameter, std::int64_t offset, torch::Tensor out)> read;
  /// Each deferred parameter's place, by its TensorImpl, recorded when the blocks are handed to their model
  /// (ListsBlocks::set_deferred_blocks): a parameter added to a block later (LoRA's adapters, built whole) has none,
  /// and the blocks' parameters() may then list it among the deferred ones without moving their places.
  std::unordered_map<const void*, DeferredPlace> places;
};

/// While alive on this thread, every block a family of models/ builds is handed to `on_block` as soon as it is
/// built, before the next one is (the families call BlockConstruction::built). Scopes do not nest.
class BlockConstruction {
 public:
  explicit BlockConstruction(std::function<void(torch::nn::Module&)> on_block) : previous_(current()) {
    current() = std::move(on_block);
  }
  ~BlockConstruction() { current() = std::move(previous_); }
  BlockConstruction(const BlockConstruction&) = delete;
  BlockConstruction& operator=(const BlockConstruction&) = delete;

  /// Called by a model's constructor right after it builds each block.
  static void built(torch::nn::Module& block) {
    if (current()) current()(block);
  }

 private:
  static std::function<void(torch::nn::Module&)>& current() {
    thread_local std::function<void(torch::nn::Module&)> on_block;
    return on_block;
  }
  std::function<void(torch::nn::Module&)> previous_;
};

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
  /// The module of `edge` when forward runs it, once, through run_edge and it shares no parameter with the rest
  /// of the model (a head tied to the embedding is used at both ends: neither is an edge then). The fully
  /// sharded strategy shards it like a block. Default: none (the parameters outside the blocks stay whole).
  virtual std::shared_ptr<torch::nn::Module> edge(Edge) { return nullptr; }
  /// The token embedding's table when a tied head shares it (so neither is an edge), else an undefined tensor.
  virtual torch::Tensor tied_embedding() { return {}; }
  /// Installs (or, with an empty runner, removes) the wrapper every edge call goes through.
  void set_edge_runner(EdgeRunner runner) { edge_runner_ = std::move(runner); }
  /// Whether the token embedding's rows enter the blocks in fp32 though its table is held in a narrower dtype: LoRA's
  /// frozen table held in bf16 under bf16 autocast (the strategies' hold_frozen_in_compute_dtype). Widening a bf16
  /// value is exact, so the residual stream starts as it did from the fp32 table, and the blocks compute as they did.
  void set_embedding_widened(bool widened) { embedding_widened_ = widened; }
  bool embedding_widened() const { return embedding_widened_; }
  /// Recompute each block in backward instead of keeping its activations (training only): the model's own
  /// forward checkpoints its blocks, and the fully sharded strategy gathers a block again for its recomputation.
  /// Selective keeps the outputs of the blocks' matrix products and recomputes only the rest
  /// (models/recompute/recompute.hpp).
  void set_activation_checkpointing(models::Recompute recompute) { activation_checkpointing_ = recompute; }
  /// `true`: every block recomputed whole (Recompute::full); `false`: none.
  void set_activation_checkpointing(bool on) {
    activation_checkpointing_ = on ? models::Recompute::full : models::Recompute::none;
  }
  models::Recompute activation_checkpointing() const { return activation_checkpointing_; }
  /// The blocks' deferred values, when the blocks were built empty (null once they are materialized or sharded).
  const std::shared_ptr<DeferredBlocks>& deferred_blocks() const { return deferred_blocks_; }
  /// Records where each of the deferred parameters sits (DeferredBlocks::places) when not recorded yet.
  void set_deferred_blocks(std::shared_ptr<DeferredBlocks> deferred) {
    deferred_blocks_ = std::move(deferred);
    if (!deferred_blocks_ || !deferred_blocks_->places.empty()) return;
    const auto listed = deferred_modules(deferred_blocks_->edges_deferred);
    for (std::size_t b = 0; b < listed.size(); ++b) {
      const auto parameters = listed[b]->parameters();
      for (std::size_t k = 0; k < parameters.size(); ++k)
        deferred_blocks_->places[parameters[k].unsafeGetTensorImpl()] = {b, k};
    }
  }
  /// The modules DeferredBlocks::shapes lists, in its order: the blocks, then with `edges` each edge the model names.
  std::vector<std::shared_ptr<torch::nn::Module>> deferred_modules(bool edges) {
    auto modules = blocks();
    if (!edges) return modules;
    for (const auto which : {Edge::embedding, Edge::head})
      if (auto module = edge(which)) modules.push_back(std::move(module));
    return modules;
  }

 protected:
  /// `call(input)`, through the installed runner if any. `index` is the block's place in blocks().
  torch::Tensor run_block(std::size_t index, const BlockCall& call, const torch::Tensor& input) {
    return block_runner_ ? block_runner_(index, call, input) : call(input);
  }
  /// `call(input)` for the module edge(edge) names, through the installed runner if any. `call` must be that module's
  /// forward and nothing else: where the embedding is a torch::nn::Embedding, the fully sharded strategy looks its rows
  /// up itself.
  /// An embedding held narrower than fp32 while its rows are widened (set_embedding_widened) gives them in fp32.
  torch::Tensor run_edge(Edge edge, const BlockCall& call, const torch::Tensor& input) {
    auto output = edge_runner_ ? edge_runner_(edge, call, input) : call(input);
    if (edge == Edge::embedding && embedding_widened_ && output.is_floating_point() &&
        output.scalar_type() != torch::kFloat32)
      return output.to(torch::kFloat32);
    return output;
  }

 private:
  BlockRunner block_runner_;
  EdgeRunner edge_runner_;
  bool embedding_widened_ = false;
  models::Recompute activation_checkpointing_ = models::Recompute::none;
  std::shared_ptr<DeferredBlocks> deferred_blocks_;
};

/// Where each parameter of the deferred blocks sits, by its TensorImpl (DeferredBlocks::places). Empty when the blocks
/// are not deferred.
inline std::unordered_map<const void*, DeferredPlace> deferred_places(const ListsBlocks& lists) {
  return lists.deferred_blocks() ? lists.deferred_blocks()->places : std::unordered_map<const void*, DeferredPlace>{};
}

/// Elements of `module`'s parameters, those of its deferred blocks (still empty) at their full shapes.
inline std::int64_t parameter_count(torch::nn::Module& module) {
  const auto* lists = dynamic_cast<const ListsBlocks*>(&module);
  const auto deferred = lists != nullptr ? lists->deferred_blocks() : nullptr;
  std::int64_t count = 0;
  for (const auto& parameter : module.parameters()) {
    count += parameter.numel();  // 0 while empty
    if (!deferred) continue;
    const auto found = deferred->places.find(parameter.unsafeGetTensorImpl());
    if (found != deferred->places.end())
      count += deferred->shapes[found->second.block][found->second.parameter].numel();
  }
  return count;
}

/// Empties every parameter of a block just built (its storage goes back to the allocator, its options stay) and
/// returns their full shapes as meta tensors, in parameters() order: DeferredBlocks::shapes' entry for the block.
inline std::vector<torch::Tensor> empty_block_parameters(torch::nn::Module& block) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> shapes;
  for (auto& parameter : block.parameters()) {
    shapes.push_back(torch::empty(parameter.sizes(), torch::TensorOptions(torch::kMeta).dtype(parameter.dtype())));
    parameter.set_data(torch::empty({0}, parameter.options()));
  }
#if defined(__GLIBC__)
  // The block's memory goes back now: small allocations made meanwhile split the freed chunks, so the next
  // block would not fit them and the heap would grow by most of a block each time (measured: 34 MB a block
  // of 45 MB under the Trainer's keep_freed_memory).
  malloc_trim(0);
#endif
  return shapes;
}

/// Gives every deferred block (and edge) its whole values (each parameter read in full, in its own dtype and device).
inline void materialize_blocks(ListsBlocks& lists) {
  const auto deferred = lists.deferred_blocks();
  if (!deferred) return;
  const auto modules = lists.deferred_modules(deferred->edges_deferred);
  torch::NoGradGuard no_grad;
  for (const auto& block : modules)
    for (auto& parameter : block->parameters()) {
      const auto found = deferred->places.find(parameter.unsafeGetTensorImpl());
      if (found == deferred->places.end()) continue;  // added after loading (an adapter): whole already
      const auto [b, k] = found->second;
      auto full = torch::empty(deferred->shapes[b][k].sizes(), parameter.options().requires_grad(false));
      deferred->read(b, k, 0, full.view({-1}));
      parameter.set_data(full);
    }
  lists.set_deferred_blocks(nullptr);
}

}  // namespace hpctrain
