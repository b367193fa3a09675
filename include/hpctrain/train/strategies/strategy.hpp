#pragma once
// Seam 2 of the Trainer (docs/seams.md): the data-parallel strategy. It owns everything that differs
// between replicated and sharded training — making the replicas consistent at start, gradient
// communication (with `no_sync` for accumulation), global gradient-norm clipping, the optimizer step,
// and its part of the checkpoint — so the Trainer's step reads the same for all of them:
//
//   strategy.zero_grad();
//   for each micro-batch: strategy.set_sync(last); loss = step_fn(...); (loss / accumulation).backward();
//   strategy.finish_gradients();
//   if (clip) strategy.clip_grad_norm(max_norm);
//   strategy.step();
//
// Implementations: `Replicated` (our bucketed DDP, dist/gradient_sync.hpp) and the sharded ones (ZeRO-1/2,
// fully sharded). Every call is collective: all ranks make it, in the same order.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <hpctrain/dist/process_group.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/models/model_units.hpp>
#include <hpctrain/train/checkpoint/checkpoint_pieces.hpp>  // PieceWriter
#include <hpctrain/train/optim/optimizer_factory.hpp>
#include <hpctrain/train/precision.hpp>

namespace hpctrain {

/// What a strategy is set up with, once per run, on every rank.
struct StrategyContext {
  std::shared_ptr<dist::ProcessGroup> group;  ///< the run's process group
  std::shared_ptr<torch::nn::Module> model;   ///< the user's module, already on group->device(), built after seeding
  OptimizerFactory make_optimizer;            ///< the Training's optimizer factory
  Precision precision = Precision::fp32;      ///< forward precision (bf16: strategies keep fp32 master state)
  /// The dtype gradients are reduced in; a strategy that reduces only in fp32 refuses bf16 (require_fp32_reduce).
  ReduceDtype reduce_dtype = ReduceDtype::fp32;
};

/// A checkpoint as a strategy reads it back: written by `world_size` ranks with strategy `strategy`.
struct SavedStrategyState {
  int world_size = 1;    ///< ranks of the run that wrote it
  std::string strategy;  ///< name() of the strategy that wrote it
  /// Rank `r`'s archive (0 <= r < world_size; only rank 0's when the writer did not save per rank).
  /// Verified (size, CRC) before it is returned; throws RuntimeError(errors::runtime_checkpoint) naming the file.
  std::function<torch::serialize::InputArchive(int rank)> open;
  /// Elements [begin, begin + length) of piece `piece` (PieceWriter::add's id) of rank `r`'s file, read by byte
  /// range: only the chunks they overlap, each checked against its CRC-32C; throws
  /// RuntimeError(errors::runtime_checkpoint) naming the file and the piece. Unset for a checkpoint without pieces.
  std::function<torch::Tensor(int rank, std::int64_t piece, std::int64_t begin, std::int64_t length)> read_piece;
  /// Rank `r`'s file as messages name it (its path). Unset: messages name the archive (`rank-<r>`).
  std::function<std::string(int rank)> file;
};

/// Thrown by a strategy's `load` on every rank, before anything is restored, when some rank found a part of the
/// checkpoint that it read invalid (a corrupt or truncated piece): the Trainer moves on to the next older
/// checkpoint, as when a rank refuses its share of the files. The rank that found the defect carries its message.
class CheckpointRefused : public RuntimeError {
 public:
  /// `cause`: this rank's own error (found_here), or why the ranks agreed to refuse.
  CheckpointRefused(const RuntimeError& cause, bool found_here)
      : RuntimeError(cause, std::string(std::string_view(cause.what()).substr(cause.id().size() + 3))),
        found_here_(found_here) {}
  /// Whether this rank found the defect itself (and its message names it).
  bool found_here() const { return found_here_; }

 private:
  bool found_here_;
};

/// The data-parallel strategy seam. All calls are collective and made in the same order on every rank.
class DataParallelStrategy {
 public:
  virtual ~DataParallelStrategy() = default;

  /// Short name, in logs and checkpoint metadata: "replicated", "zero1", "zero2", "zero3".
  virtual std::string name() const = 0;

  /// Once, before the first step: makes the model equal on every rank (one broadcast from rank 0),
  /// installs gradient hooks, and builds the optimizer by calling `context.make_optimizer` with the
  /// tensors this rank updates (named after their parameters).
  virtual void setup(StrategyContext context) = 0;

  /// The optimizer; the Trainer writes each param group's learning rate here before every step.
  virtual torch::optim::Optimizer& optimizer() = 0;

  /// Clears gradients before the first micro-batch of a step.
  virtual void zero_grad() = 0;

  /// Called before each micro-batch's backward: whether its gradients are communicated. The Trainer passes
  /// false for all but the last micro-batch of an accumulation (`no_sync`).
  virtual void set_sync(bool sync) = 0;

  /// After the last micro-batch's backward: waits for gradient communication; afterwards each rank's
  /// gradients (its shard, for sharded strategies) hold the average over all ranks.
  virtual void finish_gradients() = 0;

  /// Scales the gradients so that their global L2 norm (over every parameter of the whole model, all
  /// shards) is at most `max_norm`; returns the norm before clipping as a 0-dim fp32 tensor on the device,
  /// without reading it on the host. Equal to torch::nn::utils::clip_grad_norm_ on the replicated model.
  virtual torch::Tensor clip_grad_norm(double max_norm) = 0;

  /// The optimizer step on this rank's part, then whatever makes parameters whole again for the next
  /// forward (all-gather for ZeRO-1/2).
  virtual void step() = 0;

  /// Whether every rank writes its own checkpoint file (sharded state), or rank 0 alone (replicated).
  virtual bool saves_per_rank() const = 0;

  /// Writes this rank's model and optimizer state (on the ranks that save): small values into `archive`, which a
  /// load deserialises whole, and flat tensors into `pieces`, which a load reads by element ranges
  /// (SavedStrategyState::read_piece: what a sharded strategy resharding at another world size needs).
  virtual void save(torch::serialize::OutputArchive& archive, PieceWriter& pieces) = 0;

  /// Restores model and optimizer state from a checkpoint. A checkpoint written at another world size
  /// must be resharded, or refused with a SpecError naming the field; one written by another strategy
  /// likewise. A strategy that finds what it read invalid before restoring anything throws CheckpointRefused on
  /// every rank (the Trainer then tries the next older checkpoint).
  virtual void load(const SavedStrategyState& saved) = 0;

  /// Makes the user's module hold the full parameters on every rank (for the finish hooks that read `module`);
  /// a no-op where they always do (replicated, ZeRO-1/2).
  virtual void gather_full_model() {}

  /// The model's parameters by name with their whole shapes, in the order visit_units hands them out; nothing is
  /// gathered. Default: the module's parameters as they are.
  virtual std::vector<models::ParameterShape> unit_shapes(torch::nn::Module& module) {
    return models::shapes_of(models::whole_unit(module));
  }

  /// Calls `visit` with the model's parameters one unit at a time, each whole on every rank during the call and
  /// freed after it (ZeRO-3: a block, an edge, then the parameters it keeps whole), so that a rank never holds more
  /// of the model than it trains with and one unit: what the export reads (lm::hf_export). Default (the parameters
  /// are whole on every rank: replicated, ZeRO-1/2): one unit of the module's parameters as they are, nothing copied.
  virtual void visit_units(torch::nn::Module& module, const models::UnitVisitor& visit) {
    visit(models::whole_unit(module));
  }

  /// Whether the model's forward issues collectives (ZeRO-3 gathers each unit as it runs): the evaluation then
  /// runs on the sharded model as training does, the same number of forwards on every rank, rather than on a
  /// model gathered whole on every rank (at 70B, 280 GB of fp32 per GPU).
  virtual bool forward_is_collective() const { return false; }

  /// Whether setup takes a model whose blocks are still empty (ListsBlocks::deferred_blocks, models/blocks.hpp)
  /// and reads its own slices of them (ZeRO-3); the Trainer materializes them for any other strategy.
  virtual bool reads_deferred_blocks() const { return false; }
};

}  // namespace hpctrain
