#pragma once
// ZeRO-3 / fully sharded parameters (FSDP-style) as an implementation of the data-parallel strategy seam
// (train/strategies/strategy.hpp). The model lists its blocks (hpctrain::ListsBlocks, models/blocks.hpp); each block is
// a *unit*: one flat bucket of its trainable parameters, padded and split evenly over the ranks, of which a rank keeps
// only its shard between uses. A model's edges (its untied token embedding and head, ListsBlocks::edge) are units too,
// gathered around their calls like blocks (as torchtitan wraps `tok_embeddings` and `output`). The other parameters
// (position embeddings, final norm, a tied head) are kept whole and handled as ZeRO-2 handles every parameter (sharded
// gradients and optimizer state, all-gather after the step).
//
// LibTorch modules have no forward hooks: the strategy installs a block runner (ListsBlocks::set_block_runner)
// that wraps every block call. By default activations are kept, as FSDP2 keeps them:
//
//   forward      gather the unit (wait for its prefetched all-gather), start the next unit's all-gather
//                (prefetch), run the block recording its graph, free the gathered buffer's memory (its storage
//                shrinks to 0 bytes; the views autograd saved keep referring to it, as FSDP2's storage resize)
//   backward     a hook on the block output's gradient gathers the unit again into that same storage and
//                starts the previous unit's all-gather; the block's own backward runs on its saved tensors;
//                a hook on its input's gradient (after the parameters' gradients) reduce-scatters the unit's
//                gradients into its gradient shard (async) and frees the buffer
//
// With activation checkpointing (ListsBlocks::set_activation_checkpointing, --activation-checkpointing) each
// block is instead a checkpointed call (models/recompute/activation_checkpoint.hpp): run without a graph and freed in
// forward, gathered again and recomputed with grad in backward (a third more compute for the activations'
// memory; selective keeps the block's matrix products from the forward and recomputes only the elementwise
// work, models/recompute/selective_recompute.hpp). On the non-final micro-batches of an accumulation (set_sync(false))
// the full gradients accumulate locally, as FSDP's no_sync. Clipping, the optimizer step on fp32 masters and the
// checkpoint format are ZeRO-2's (zero.hpp, zero_checkpoint.hpp): ZeRO-2 and ZeRO-3 checkpoints reshard into each
// other, at any world size.
//
// Frozen parameters (LoRA's base weights, FSDP2 shards them like any other): a unit's frozen parameters are a second
// flat bucket of it, sharded, gathered and freed with its trainable one (their own all-gather, same group), never
// reduced, stepped or checkpointed (the checkpoint holds what trains; the base is read again from its source). A
// unit's are held in bf16 under Precision::bf16, the dtype it computes in (a bf16 checkpoint's own: no fp32 copy,
// no master), the edges' (embedding, head) too: a frozen embedding's rows are widened to fp32 as they are looked up
// (ListsBlocks::set_embedding_widened), so the residual stream starts as from an fp32 table. An edge with nothing that
// trains is a unit for its frozen weights alone; a frozen embedding (its input the ids) is gathered, run and freed in
// forward only, as nothing in backward reads it.
//
// Loading: a model whose blocks were built empty (models/blocks.hpp's DeferredBlocks: lm::from_pretrained under
// ZeRO-3, DeepSpeed's zero.Init and FSDP's meta-device model do the same) is never whole on any rank: setup
// reads each block's shard slice by slice from its source (each rank only its own part of the checkpoint), and the
// edges' too where the loader deferred them (a checkpoint's), and broadcasts nothing of them, since every rank reads
// the same bytes.
//
// Mixed precision as FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32 or bf16) does it: under
// Precision::bf16 a block's fp32 shard is converted to bf16 as it is copied into the all-gather's buffer (no bf16
// copy kept), the blocks are all-gathered and computed in bf16 (half the bytes gathered and held; autocast keeps no
// cast copy of them) on a bf16 residual stream (the last block gives back the dtype the first took), their bf16
// gradients are
// reduce-scattered in the reduce dtype (StrategyContext::reduce_dtype, --reduce-dtype: fp32 by default, bf16 for
// half the bytes) into the fp32 gradient shard, once per micro-batch (summed there: gradients never accumulate in
// bf16), and the fp32 shard stays what the optimizer steps. The export's and the finish hooks'
// gathers (visit_units, gather_full_model) stay fp32. Parameters outside the blocks run under autocast as before.
//
// Memory per rank, in bytes per trainable parameter of the blocks, over N ranks, fp32 parameters and Adam:
//   4/N  the parameter shard, which is itself the optimizer's parameter (FSDP2's sharded parameter: no copy)
//   4/N  the gradient shard, kept between steps
//   8/N  Adam's two moments
// plus, while blocks run, 4 bytes (bf16: 2) per parameter of the block computing and of the one prefetched (their
// gathered flat buckets), and in fp32 under accumulation the full gradients of the blocks between micro-batches.
// The edges count as blocks (gathered in bf16 under Precision::bf16; an nn::Embedding once a micro-batch, in forward
// only: look_up_embedding, its gradient whole in fp32 at the end of backward). The other parameters
// outside the blocks stay whole on every rank (4, and their whole gradient while backward runs), their
// gradient and optimizer state sharded as ZeRO-2 keeps them (4/N + 8/N).
// bf16 or fp16 parameters keep an fp32 master (4/N) beside their 2/N shard.
//
// Hybrid sharding (hybrid(), `--sharding hsdp`; FSDP's HYBRID_SHARD, torchtitan's dp_replicate x dp_shard): the
// world is split into shard groups of S consecutive ranks (a node's, by default) and everything above happens
// within the rank's shard group, N = S: the layout, the gathers, the reduce-scatters, clipping's sum of squares
// (replicas hold equal shards), the step and the all-gather of the parameters outside the units. The replica group
// (the ranks with this rank's index in every shard group, W/S of them) adds one collective per unit and step: as
// a unit's last reduce-scatter of the step finishes (during backward), its gradient shard starts being all-reduced
// across it (in the reduce dtype), overlapping the rest of backward as FSDP2's HSDP does; finish_gradients waits.
// The reduce-scatter's input is pre-scaled by 1/W, so that sum is the average over all W ranks. Setup's broadcast of
// the module goes over the whole world. Checkpoints are the format above at world size W: the ranks of the first shard
// group write the pieces, the others archives without pieces, so zero1/2/3 and hsdp at any world size reshard from and
// into them.
#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/embedding.h>
#include <torch/types.h>

#include <hpctrain/dist/collectives.hpp>
#include <hpctrain/dist/flat_shards.hpp>
#include <hpctrain/dist/gradient_sync.hpp>
#include <hpctrain/dist/host_buffer_pool.hpp>
#include <hpctrain/dist/shard_collectives.hpp>
#include <hpctrain/dist/sharded_gradients.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/models/blocks.hpp>
#include <hpctrain/models/recompute/activation_checkpoint.hpp>
#include <hpctrain/train/host_memory.hpp>
#include <hpctrain/train/precision.hpp>
#include <hpctrain/train/strategies/replicated.hpp>  // hold_frozen_tied_embedding_in_compute_dtype
#include <hpctrain/train/strategies/sharding.hpp>
#include <hpctrain/train/strategies/strategy.hpp>
#include <hpctrain/train/strategies/zero.hpp>
#include <hpctrain/train/strategies/zero_checkpoint.hpp>

namespace hpctrain {

/// ZeRO-3: parameters, gradients and optimizer state sharded; each listed block gathered only while it runs.
class FullyShardedStrategy : public DataParallelStrategy {
 public:
  /// `buckets`: sizes of the buckets of the parameters outside the blocks (each block is one bucket).
  explicit FullyShardedStrategy(dist::GradientSyncOptions buckets = {}) : buckets_(buckets) {}
  /// While a block runs (forward, or its recomputation in backward), start gathering the next one (in
  /// backward: the previous one), so that its all-gather overlaps this block's compute (on NCCL it runs on
  /// the process group's own stream). false gathers each block when it is reached: the same collectives and
  /// results, at most one block gathered at a time; the GPU suite's dist.zero3.prefetch row times both.
  /// Default: true.
  FullyShardedStrategy& prefetch_next_block(bool on) {
    prefetch_next_block_ = on;
    return *this;
  }
  /// Hybrid sharding: shard within groups of `group_size` consecutive ranks, replicate across the groups (the
  /// header's comment). 0: the ranks of a node (the process group's local world size). Setup refuses a size that
  /// does not divide the world (SpecError `[hpctrain.spec.sharding]`). Default: off (ZeRO-3, one group of all ranks).
  FullyShardedStrategy& hybrid(int group_size) {
    hybrid_ = true;
    hybrid_group_size_ = group_size;
    return *this;
  }
  FullyShardedStrategy(const FullyShardedStrategy&) = delete;
  FullyShardedStrategy& operator=(const FullyShardedStrategy&) = delete;
  ~FullyShardedStrategy() override {
    if (lists_ == nullptr) return;
    lists_->set_block_runner({});
    lists_->set_edge_runner({});
  }

  std::string name() const override { return hybrid_ ? "hsdp" : "zero3"; }
  bool reads_deferred_blocks() const override { return true; }
  bool forward_is_collective() const override { return true; }

  void setup(StrategyContext context) override {
    world_ = std::move(context.group);
    make_groups();
    model_ = std::move(context.model);
    bf16_blocks_ = context.precision == Precision::bf16;
    reduce_dtype_ = scalar_type_of(context.reduce_dtype);
    find_blocks();
    detail::hold_frozen_tied_embedding_in_compute_dtype(*lists_, context.precision);  // outside the units, whole
    take_deferred_blocks();
    dist::broadcast_module(*world_, *model_);  // deferred blocks are empty here: every rank reads the same bytes
    collect_parameters();
    build_layout();
    choose_embedding_lookup();
    build_units();
    build_master_shards();
    build_frozen_parts();
    if (const auto embedding = edge_unit(Edge::embedding);
        embedding != no_unit && units_[embedding].frozen.shard.defined())
      lists_->set_embedding_widened(units_[embedding].frozen.shard.scalar_type() != torch::kFloat32);
    deferred_.reset();  // the checkpoint's mapping goes with it
    deferred_places_.clear();
    optimizer_ = detail::make_optimizer_over_pieces(context.make_optimizer, pieces_, names_,
                                                    [this](std::size_t p) { return full_shapes_[p].dim(); });
    if (!optimizer_) throw SpecError("optimizer", "null", "the optimizer factory returned no optimizer");
    detail::require_elementwise(*optimizer_, hybrid_ ? ZeroStage::hsdp : ZeroStage::zero3);
    lists_->set_block_runner([this](std::size_t index, const BlockCall& call, const torch::Tensor& input) {
      return run_block(index, call, input);
    });
    lists_->set_edge_runner(
        [this](Edge edge, const BlockCall& call, const torch::Tensor& input) { return run_edge(edge, call, input); });
  }

  torch::optim::Optimizer& optimizer() override { return *optimizer_; }

  /// Also starts gathering the embedding the strategy looks up (the step's first unit), so that its all-gather overlaps
  /// what comes before the forward.
  void zero_grad() override {
    release_all_blocks();
    for (auto& unit : units_) unit.gradient_accumulated = unit.sent = false;
    for (auto& parameter : parameters_)
      if (parameter.grad().defined()) parameter.mutable_grad().reset();
    for (auto& piece : pieces_)
      if (piece.master.grad().defined()) piece.master.mutable_grad().reset();
    if (looks_up_embedding_) prefetch(edge_unit(Edge::embedding));
  }

  void set_sync(bool sync) override { sync_ = sync; }

  void finish_gradients() override {
    if (!sync_) return;
    torch::NoGradGuard no_grad;
    // Blocks that ran no backward (unused) and the parameters outside the blocks, in bucket order: the same
    // order on every rank, after the blocks' reduce-scatters launched during backward (finished or not: at most
    // two stay in flight).
    for (std::size_t b = 0; b < units_.size(); ++b)
      if (!units_[b].sent && !(computes_in_bf16(b) && units_[b].gradient_accumulated)) start_gradient_reduce_scatter(b);
    for (auto& unit : units_) unit.sent = false;
    // Hybrid: a unit's all-reduce across the replicas started when its reduce-scatter finished (during backward for
    // the blocks, finish_gradient_reduce_scatter); here the last ones start, then every one is waited for.
    for (std::size_t b = 0; b < units_.size(); ++b) finish_gradient_reduce_scatter(b);
    for (std::size_t b = 0; b < units_.size(); ++b) finish_replica_reduction(b);
    for (auto& piece : pieces_) {
      auto shard = units_[piece.bucket].gradient_shard.narrow(0, piece.place.shard_offset, piece.place.length);
      piece.master.mutable_grad() =
          shard.scalar_type() == piece.master.scalar_type() ? shard : shard.to(piece.master.scalar_type());
    }
  }

  torch::Tensor clip_grad_norm(double max_norm) override {
    return detail::clip_sharded_grad_norm(*group_, detail::masters_of(pieces_), max_norm);
  }

  /// The optimizer step on the masters; each master written into its unit's shard. The parameters outside
  /// the blocks are all-gathered (they stay whole); the blocks stay sharded until their next use.
  void step() override {
    release_all_blocks();
    optimizer_->step();
    torch::NoGradGuard no_grad;
    for (auto& piece : pieces_)  // reduced-precision shards take their master's new values; an fp32 shard is its master
      if (!piece.master.is_alias_of(units_[piece.bucket].shard))
        units_[piece.bucket].shard.narrow(0, piece.place.shard_offset, piece.place.length).copy_(piece.master);
    std::vector<dist::PendingAllGather> gathers;
    for (std::size_t b = sharded_units_; b < units_.size(); ++b)
      gathers.push_back(dist::start_all_gather_in_place(*group_, units_[b].flat));
    for (auto& gather : gathers) dist::wait(*group_, gather);
  }

  bool saves_per_rank() const override { return true; }

  /// ZeRO-2's shard archive; the index records the parameters' full shapes. Hybrid: the first shard group's ranks
  /// write the pieces, the other replicas an archive without pieces (every element saved once).
  void save(torch::serialize::OutputArchive& archive, PieceWriter& pieces) override {
    auto view = shard_view(full_shapes_);
    if (replica_index_ != 0) view.pieces.clear();
    detail::save_zero_shard(archive, pieces, view);
  }

  /// Restores this rank's shards (and optimizer state) from a zero1/zero2/zero3/hsdp checkpoint of any world size,
  /// reading only each saved piece's overlap with them: the blocks and edges are never gathered whole; the other
  /// parameters, whole on every rank, are all-gathered from the ranks' pieces, as after a step.
  void load(const SavedStrategyState& saved) override {
    release_all_blocks();
    auto view = shard_view(full_shapes_);
    view.write_values = [this](std::size_t parameter, std::int64_t begin, const torch::Tensor& values) {
      write_saved_values(parameter, begin, values);
    };
    detail::load_zero_shards(saved, view);
    torch::NoGradGuard no_grad;
    for (auto& piece : pieces_)
      if (!piece.master.is_alias_of(units_[piece.bucket].shard))
        piece.master.copy_(units_[piece.bucket].shard.narrow(0, piece.place.shard_offset, piece.place.length));
    // The parameters kept whole: the other ranks' parts, as after a step.
    std::vector<dist::PendingAllGather> gathers;
    for (std::size_t b = sharded_units_; b < units_.size(); ++b)
      gathers.push_back(dist::start_all_gather_in_place(*group_, units_[b].flat));
    for (auto& gather : gathers) dist::wait(*group_, gather);
  }

  /// All-gathers every block into the module and keeps it whole (pinned) until the next zero_grad/step:
  /// for evaluation, the parameters digest and export (e.g. models::save_safetensors of rank 0's module).
  void gather_full_model() override {
    for (std::size_t b = 0; b < sharded_units_; ++b) {
      // A block gathered (or on its way) in bf16 for compute is gathered again in its shard's precision.
      if (units_[b].flat.defined() && units_[b].flat.scalar_type() != units_[b].shard.scalar_type()) {
        finish_gather(b);
        release(b);
      }
      if (!units_[b].flat.defined()) start_gather(b, /*for_compute=*/false);
    }
    for (std::size_t b = 0; b < sharded_units_; ++b) finish_gather(b);
    pinned_ = true;
  }

  /// The sharded units (blocks, then edges) in layout order, each its trainable then its frozen parameters, then the
  /// parameters every rank keeps whole (the other buckets, frozen parameters outside the units) as one unit.
  std::vector<models::ParameterShape> unit_shapes(torch::nn::Module& module) override {
    std::vector<models::ParameterShape> shapes;
    for (std::size_t b = 0; b < sharded_units_; ++b) {
      for (auto p : layout_.buckets()[b].parameters) shapes.push_back({names_[p], full_shapes_[p].sizes().vec()});
      for (auto p : frozen_layout_.buckets()[b].parameters)
        shapes.push_back({frozen_names_[p], frozen_shapes_[p].sizes().vec()});
    }
    for (auto& shape : models::shapes_of(parameters_kept_whole(module))) shapes.push_back(std::move(shape));
    return shapes;
  }

  /// Each sharded unit gathered in its shard's precision (fp32 masters: exact), visited and freed before the next
  /// is gathered: at most one unit is whole (gathered_bytes() says it); then the parameters kept whole. After
  /// gather_full_model, the units are visited as they are.
  void visit_units(torch::nn::Module& module, const models::UnitVisitor& visit) override {
    const bool whole = pinned_;
    if (!whole) release_all_blocks();  // a prefetch the evaluation left, gathered in bf16 for compute
    for (std::size_t b = 0; b < sharded_units_; ++b) {
      if (!whole) {
        start_gather(b, /*for_compute=*/false);
        finish_gather(b);
      }
      models::NamedUnit unit;
      for (auto p : layout_.buckets()[b].parameters) unit.emplace_back(names_[p], parameters_[p].detach());
      for (auto p : frozen_layout_.buckets()[b].parameters) unit.emplace_back(frozen_names_[p], frozen_[p].detach());
      visit(unit);
      unit.clear();
      if (whole) continue;
      release(b);
      // Its pages go back before the next unit is gathered: under the Trainer's keep_freed_memory the small
      // allocations the writer makes split the freed buffer, and each unit took new pages (measured: +0.31 GiB a
      // rank over the 16 units of a 159M Llama at --local 2, against 0.04 GiB with this).
      if (group_->device().is_cpu()) detail::return_freed_host_memory();
    }
    visit(parameters_kept_whole(module));
  }

  // Instrumentation (benchmarks, tests).
  /// Bytes of gathered units held now.
  std::size_t gathered_bytes() const { return gathered_bytes_; }
  /// Starts peak_gathered_bytes() again from what is gathered now (a test measuring one phase).
  void reset_peak_gathered_bytes() { peak_gathered_bytes_ = gathered_bytes_; }
  /// The layout: one bucket per block, one per edge, then the buckets of the other parameters.
  const dist::FlatShardLayout& layout() const { return layout_; }
  /// Number of units that are blocks (the first buckets of the layout).
  std::size_t block_count() const { return model_blocks_; }
  /// Number of units gathered around their use: the blocks, then the edges (the next buckets of the layout).
  std::size_t sharded_unit_count() const { return sharded_units_; }
  /// Bytes of optimizer state this rank holds.
  std::size_t optimizer_state_bytes() const { return detail::state_and_master_bytes(*optimizer_, pieces_).first; }
  /// Bytes of fp32 masters this rank holds beside its shards (none for fp32 parameters: the shard is the master).
  std::size_t master_bytes() const {
    std::size_t bytes = 0;
    for (const auto& piece : pieces_)
      if (!piece.master.is_alias_of(units_[piece.bucket].shard)) bytes += piece.master.nbytes();
    return bytes;
  }
  /// Bytes of gradient shards kept between steps.
  std::size_t gradient_bytes() const {
    std::size_t bytes = 0;
    for (const auto& unit : units_) bytes += unit.gradient_shard.nbytes();
    return bytes;
  }
  /// Bytes of parameters this rank holds between steps: its block shards and the whole other parameters.
  std::size_t resident_parameter_bytes() const {
    std::size_t bytes = 0;
    for (std::size_t b = 0; b < units_.size(); ++b)
      bytes +=
          b < sharded_units_ ? units_[b].shard.nbytes() + units_[b].frozen.shard.nbytes() : units_[b].flat.nbytes();
    return bytes;
  }
  /// Most bytes of gathered blocks (and edges) held at once since setup (current + prefetched).
  std::size_t peak_gathered_bytes() const { return peak_gathered_bytes_; }
  /// The most bytes of gradients held at once by reduce-scatters in flight (their padded fp32 inputs).
  std::size_t peak_reduce_scatter_bytes() const { return peak_reducing_bytes_; }
  /// Bytes the blocks' (and edges') collectives carried since setup, counted at the collectives: the all-gathers' flat
  /// outputs (each rank receives all but its own slice) and the reduce-scatters' flat inputs (each rank sends
  /// all but the slice it keeps). Per block element and micro-batch: fp32 4 + 4 gathered (forward and the
  /// recomputation in backward) and 4 reduce-scattered; bf16 2 + 2 and 4.
  /// frozen_gathered: the units' frozen parameters' all-gathers (LoRA's base), apart.
  struct BlockTraffic {
    std::size_t gathered = 0, reduce_scattered = 0, frozen_gathered = 0;
  };
  BlockTraffic block_traffic() const { return block_traffic_; }
  /// Hybrid: bytes of gradient shards all-reduced across the replica group since setup (each unit's shard once
  /// per step: 4/S bytes per trainable element). 0 without replicas.
  std::size_t replica_reduced_bytes() const { return replica_reduced_bytes_; }
  /// The group this rank shards within (the world under ZeRO-3), and the one it replicates across (null: none).
  const std::shared_ptr<dist::ProcessGroup>& shard_group() const { return group_; }
  const std::shared_ptr<dist::ProcessGroup>& replica_group() const { return replicas_; }
  /// Blocks whose gathered buffer autograd still refers to for a backward to come (activations kept), and the
  /// bytes those buffers hold meanwhile (none: freed until the block's backward gathers it again).
  std::size_t held_buffers() const {
    return static_cast<std::size_t>(
        std::count_if(units_.begin(), units_.end(), [](const Unit& unit) { return static_cast<bool>(unit.held); }));
  }
  std::size_t held_bytes() const {
    std::size_t bytes = 0;
    for (const auto& unit : units_) {
      if (unit.held) bytes += unit.held.nbytes();
      if (unit.frozen.held) bytes += unit.frozen.held.nbytes();
    }
    return bytes;
  }

 private:
  struct Piece {
    dist::ShardPiece place;
    std::size_t bucket = 0;
    torch::Tensor master;
  };

  /// A unit's frozen parameters as one flat bucket (frozen_layout_'s bucket of the unit), gathered beside its
  /// trainable one: this rank's shard, the whole buffer while gathered, the freed buffer autograd still refers to.
  struct FrozenPart {
    torch::Tensor shard, flat;
    c10::Storage held;
    dist::PendingAllGather gather;
  };

  /// One bucket: a block (b < model_blocks_), an edge (b < sharded_units_) or a group of the other parameters.
  struct Unit {
    torch::Tensor shard;           // this rank's shard (for non-block units a view into `flat`)
    torch::Tensor flat;            // the whole padded bucket: blocks only while gathered; others always
    torch::Tensor gradient_shard;  // this rank's averaged gradient shard
    c10::Storage held;             // kept activations: the freed gathered buffer autograd still refers to (empty)
    dist::PendingAllGather gather;
    dist::PendingReduceScatter reduce_scatter;
    bool reduce_scatter_ends_step = false;   // the reduce-scatter in flight carries the step's last micro-batch
    dist::PendingAllReduce across_replicas;  // hybrid: the gradient shard summed across the replica group
    torch::Tensor replica_buffer;            // a bf16 reduction across replicas: the shard in bf16 while it is summed
    bool gathered = false;
    bool gradient_accumulated = false;  // gradient_shard holds this step's sum so far (reduce-scatters per micro-batch)
    bool sent =
        false;  // its gradients' reduce-scatter started since the last synchronised backward ended (finished or not)
    FrozenPart frozen;  // a sharded unit's frozen parameters (none: shard undefined)
  };

  /// The module's parameters outside the sharded units, whole on every rank, in named_parameters order.
  models::NamedUnit parameters_kept_whole(torch::nn::Module& module) const {
    std::unordered_set<const void*> sharded;
    for (std::size_t b = 0; b < sharded_units_; ++b)
      for (auto p : layout_.buckets()[b].parameters) sharded.insert(parameters_[p].unsafeGetTensorImpl());
    for (const auto& parameter : frozen_) sharded.insert(parameter.unsafeGetTensorImpl());
    models::NamedUnit unit;
    for (const auto& item : module.named_parameters(/*recurse=*/true))
      if (!sharded.count(item.value().unsafeGetTensorImpl())) unit.emplace_back(item.key(), item.value().detach());
    return unit;
  }

  /// ZeRO-3: the world is the shard group, with no replicas. Hybrid: shard groups of S consecutive ranks, replica
  /// groups of the ranks with the same index in each; a group equal to the world is the world's own backend.
  void make_groups() {
    group_ = world_;
    replicas_.reset();
    replica_index_ = 0;
    if (!hybrid_) return;
    const int world = world_->world_size();
    const int size = hsdp_shard_group_size(hybrid_group_size_, world, world_->local_world_size());
    const int rank = world_->rank();
    replica_index_ = rank / size;
    if (size == world) return;
    std::vector<int> shard_ranks, replica_ranks;
    for (int r = replica_index_ * size; r < (replica_index_ + 1) * size; ++r) shard_ranks.push_back(r);
    for (int r = rank % size; r < world; r += size) replica_ranks.push_back(r);
    group_ = world_->subgroup(shard_ranks, fmt::format("hsdp/shard/{}", replica_index_));  // size 1: no backend
    replicas_ = size == 1 ? world_ : world_->subgroup(replica_ranks, fmt::format("hsdp/replica/{}", rank % size));
  }

  void find_blocks() {
    lists_ = dynamic_cast<ListsBlocks*>(model_.get());
    if (lists_ != nullptr) {
      block_modules_ = lists_->blocks();
      for (const auto edge : {Edge::embedding, Edge::head}) edge_modules_.push_back(lists_->edge(edge));
    }
    if (block_modules_.empty()) {
      const auto& module = *model_;
      throw SpecError("sharding", name(),
                      fmt::format("the model ({}) lists no blocks() to shard by: derive it from hpctrain::ListsBlocks, "
                                  "return its blocks from blocks() and run each through run_block() "
                                  "(models/blocks.hpp); or use zero2",
                                  module.name()));
    }
  }

  /// A model built with empty blocks (models/blocks.hpp's DeferredBlocks) has each rank read its own slices of the
  /// blocks' trainable and frozen parameters (build_units, build_frozen_parts).
  void take_deferred_blocks() {
    if (!lists_->deferred_blocks()) return;
    deferred_places_ = deferred_places(*lists_);
    deferred_ = lists_->deferred_blocks();
    lists_->set_deferred_blocks(nullptr);
  }

  /// The full shape of a parameter: its own, or its deferred block's record of it.
  c10::IntArrayRef full_shape(const torch::Tensor& parameter) const {
    const auto found = deferred_places_.find(parameter.unsafeGetTensorImpl());
    return found == deferred_places_.end() ? parameter.sizes()
                                           : deferred_->shapes[found->second.block][found->second.parameter].sizes();
  }

  /// The trainable parameters, in named_parameters order; the frozen ones' names, for those the units take.
  void collect_parameters() {
    for (const auto& item : model_->named_parameters()) {
      if (!item.value().requires_grad()) {
        frozen_name_of_[item.value().unsafeGetTensorImpl()] = item.key();
        continue;
      }
      names_.push_back(item.key());
      parameters_.push_back(item.value());
      full_shapes_.push_back(
          torch::empty(full_shape(item.value()), item.value().options().device(torch::kMeta).requires_grad(false)));
    }
  }

  /// One bucket per block (its trainable parameters in registration order), one per edge that trains, then the
  /// other parameters bucketed as GradientSync buckets them.
  void build_layout() {
    std::unordered_map<const void*, std::size_t> index_of;
    for (std::size_t i = 0; i < parameters_.size(); ++i) index_of[parameters_[i].unsafeGetTensorImpl()] = i;
    std::vector<int> unit_of(parameters_.size(), -1);
    std::vector<std::vector<std::size_t>> groups, frozen_groups;
    auto modules = block_modules_;
    std::vector<std::size_t> edge_of_module(modules.size(), no_unit);
    for (std::size_t e = 0; e < edge_modules_.size(); ++e)
      if (edge_modules_[e]) {
        modules.push_back(edge_modules_[e]);
        edge_of_module.push_back(e);
      }
    for (std::size_t b = 0; b < modules.size(); ++b) {
      std::vector<std::size_t> group, frozen;
      for (const auto& parameter : modules[b]->parameters()) {
        const auto found = index_of.find(parameter.unsafeGetTensorImpl());
        if (found == index_of.end()) {
          if (const auto index = take_frozen(parameter)) frozen.push_back(*index);
          continue;
        }
        if (unit_of[found->second] != -1)
          throw SpecError("sharding", "zero3",
                          fmt::format("parameter '{}' belongs to unit {} and unit {} (the blocks, then the edges): a "
                                      "parameter can live in one unit only",
                                      names_[found->second], unit_of[found->second], b));
        if (!group.empty() && parameters_[group.front()].scalar_type() != parameter.scalar_type())
          throw SpecError(
              "sharding", "zero3",
              fmt::format("block {} mixes parameter dtypes ('{}' is {}, '{}' {}); a block is one flat bucket", b,
                          names_[group.front()], c10::toString(parameters_[group.front()].scalar_type()),
                          names_[found->second], c10::toString(parameter.scalar_type())));
        unit_of[found->second] = static_cast<int>(b);
        group.push_back(found->second);
      }
      std::sort(group.begin(), group.end());
      if (b >= block_modules_.size() && group.empty() && frozen.empty()) continue;  // an edge with no parameter
      if (edge_of_module[b] != no_unit) edge_units_[edge_of_module[b]] = groups.size();
      groups.push_back(std::move(group));
      frozen_groups.push_back(std::move(frozen));
    }
    model_blocks_ = block_modules_.size();
    sharded_units_ = groups.size();
    order_units();
    std::vector<std::int64_t> frozen_numels;
    for (const auto& shape : frozen_shapes_) frozen_numels.push_back(shape.numel());
    frozen_layout_ = dist::FlatShardLayout(frozen_numels, group_->world_size(), frozen_groups);
    std::vector<std::size_t> others;
    std::vector<dist::detail::ParameterShape> shapes;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      if (unit_of[i] != -1) continue;
      others.push_back(i);
      shapes.push_back({static_cast<std::size_t>(parameters_[i].numel()) * parameters_[i].element_size(),
                        static_cast<int>(parameters_[i].scalar_type()), parameters_[i].device().str()});
    }
    for (const auto& planned : dist::detail::plan_buckets(shapes, buckets_)) {
      std::vector<std::size_t> group;
      for (auto k : planned) group.push_back(others[k]);
      groups.push_back(std::move(group));
    }
    std::vector<std::int64_t> numels;
    for (const auto& shape : full_shapes_) numels.push_back(shape.numel());
    layout_ = dist::FlatShardLayout(numels, group_->world_size(), groups);
    bucket_of_.assign(parameters_.size(), {0, 0});
    for (std::size_t b = 0; b < layout_.buckets().size(); ++b)
      for (std::size_t k = 0; k < layout_.buckets()[b].parameters.size(); ++k)
        bucket_of_[layout_.buckets()[b].parameters[k]] = {b, k};
  }

  /// Copies every parameter into its unit's flat bucket; keeps this rank's shard; block parameters are
  /// then freed (empty), the others become views of their (persistent) bucket. Under a deferred model the units
  /// (blocks and edges) are never whole: each shard is read slice by slice (read_own_slices).
  void build_units() {
    torch::NoGradGuard no_grad;
    units_.resize(layout_.buckets().size());
    for (std::size_t b = 0; b < units_.size(); ++b) {
      const auto& bucket = layout_.buckets()[b];
      auto& unit = units_[b];
      const auto options = bucket.parameters.empty()
                               ? torch::TensorOptions(torch::kFloat32).device(group_->device())
                               : parameters_[bucket.parameters.front()].options().requires_grad(false);
      if (b < sharded_units_ && deferred_) {
        unit.gradient_shard = torch::zeros({bucket.shard_numel}, options);
        unit.shard = torch::zeros({bucket.shard_numel}, options);
        read_own_slices(layout_, parameters_, b, unit.shard);
        for (auto p : bucket.parameters) parameters_[p].set_data(torch::empty({0}, options));  // an adapter was whole
        continue;
      }
      auto flat = torch::zeros({bucket.padded_numel}, options);
      for (std::size_t k = 0; k < bucket.parameters.size(); ++k) {
        auto& parameter = parameters_[bucket.parameters[k]];
        flat.narrow(0, bucket.offsets[k], parameter.numel()).copy_(parameter.detach().reshape({-1}));
      }
      unit.gradient_shard = torch::zeros({bucket.shard_numel}, options);
      if (b < sharded_units_) {
        unit.shard = flat.narrow(0, group_->rank() * bucket.shard_numel, bucket.shard_numel).clone();
        unit.flat = flat;
        unit.gathered = true;
        gathered_bytes_ += flat.nbytes();
        release(b);
      } else {
        unit.flat = flat;
        unit.shard = own_slice(b);
        point_parameters_at(b);
      }
    }
  }

  /// Elements [begin, begin + values.numel()) of parameter p from a checkpoint: into this rank's shard of a
  /// block (the part that falls there), or into the whole bucket of a parameter outside the blocks.
  void write_saved_values(std::size_t parameter, std::int64_t begin, const torch::Tensor& values) {
    torch::NoGradGuard no_grad;
    const auto [b, k] = bucket_of_[parameter];
    const auto& bucket = layout_.buckets()[b];
    const auto first = bucket.offsets[k] + begin, last = first + values.numel();
    if (b >= sharded_units_) {
      units_[b].flat.narrow(0, first, values.numel()).copy_(values);
      return;
    }
    const auto shard_begin = static_cast<std::int64_t>(group_->rank()) * bucket.shard_numel;
    const auto lo = std::max(first, shard_begin), hi = std::min(last, shard_begin + bucket.shard_numel);
    if (lo < hi) units_[b].shard.narrow(0, lo - shard_begin, hi - lo).copy_(values.narrow(0, lo - first, hi - lo));
  }

  /// This rank's elements of bucket b of `layout` (over `parameters`), each parameter's overlap with the shard read
  /// from its deferred source, or copied from the parameter itself where it is whole (an adapter added after loading,
  /// a model built whole), converted to the shard's dtype.
  void read_own_slices(const dist::FlatShardLayout& layout, const std::vector<torch::Tensor>& parameters, std::size_t b,
                       const torch::Tensor& shard) const {
    torch::NoGradGuard no_grad;
    const auto& bucket = layout.buckets()[b];
    const auto begin = static_cast<std::int64_t>(group_->rank()) * bucket.shard_numel, end = begin + bucket.shard_numel;
    for (std::size_t k = 0; k < bucket.parameters.size(); ++k) {
      const auto& parameter = parameters[bucket.parameters[k]];
      const auto first = bucket.offsets[k], last = first + layout.numel(bucket.parameters[k]);
      const auto lo = std::max(first, begin), hi = std::min(last, end);
      if (lo >= hi) continue;
      const auto found = deferred_places_.find(parameter.unsafeGetTensorImpl());
      auto out = shard.narrow(0, lo - begin, hi - lo);
      if (found != deferred_places_.end())
        deferred_->read(found->second.block, found->second.parameter, lo - first, out);
      else out.copy_(parameter.detach().reshape({-1}).narrow(0, lo - first, hi - lo));
    }
  }

  /// Frozen parameter `parameter` of the unit to come taken into frozen_ (its index), or nullopt when another unit
  /// took it already (a weight shared between modules is gathered once).
  std::optional<std::size_t> take_frozen(const torch::Tensor& parameter) {
    const auto* impl = parameter.unsafeGetTensorImpl();
    const auto name = frozen_name_of_.find(impl);
    if (name == frozen_name_of_.end() || !frozen_taken_.insert(impl).second) return std::nullopt;
    const auto dtype = frozen_dtype(parameter.scalar_type());
    frozen_names_.push_back(name->second);
    frozen_.push_back(parameter);
    frozen_shapes_.push_back(torch::empty(full_shape(parameter), torch::TensorOptions(torch::kMeta).dtype(dtype)));
    return frozen_.size() - 1;
  }

  /// The dtype a unit (a block or an edge) holds its fp32 frozen parameters in: bf16 under Precision::bf16, what it
  /// computes in (a frozen embedding's rows widened back to fp32 as they are looked up:
  /// ListsBlocks::set_embedding_widened), else their own.
  torch::ScalarType frozen_dtype(torch::ScalarType own) const {
    return bf16_blocks_ && own == torch::kFloat32 ? torch::kBFloat16 : own;
  }

  /// Each sharded unit's frozen parameters: this rank's shard read (from the checkpoint, or the whole parameter,
  /// which is then freed), the parameters left empty until gathered.
  void build_frozen_parts() {
    torch::NoGradGuard no_grad;
    for (std::size_t b = 0; b < sharded_units_; ++b) {
      const auto& bucket = frozen_layout_.buckets()[b];
      if (bucket.parameters.empty()) continue;
      auto& part = units_[b].frozen;
      const auto options =
          torch::TensorOptions(frozen_shapes_[bucket.parameters.front()].scalar_type()).device(group_->device());
      part.shard = torch::zeros({bucket.shard_numel}, options);
      read_own_slices(frozen_layout_, frozen_, b, part.shard);
      for (auto p : bucket.parameters) frozen_[p].set_data(torch::empty({0}, options));
    }
  }

  void build_master_shards() {
    torch::NoGradGuard no_grad;
    for (std::size_t b = 0; b < units_.size(); ++b) {
      for (const auto& place : layout_.pieces(b, group_->rank())) {
        Piece piece{place, b, {}};
        const auto part = units_[b].shard.narrow(0, place.shard_offset, place.length);
        // fp32: the shard's piece itself is what the optimizer steps (no second copy); bf16/fp16: an fp32 master.
        const auto master = detail::master_dtype(part.scalar_type());
        piece.master = master == part.scalar_type() ? part : part.to(master).clone();
        pieces_.push_back(std::move(piece));
      }
    }
  }

  torch::Tensor own_slice(std::size_t b) const {
    const auto n = layout_.buckets()[b].shard_numel;
    return units_[b].flat.narrow(0, group_->rank() * n, n);
  }

  void point_parameters_at(std::size_t b) {
    const auto& bucket = layout_.buckets()[b];
    for (std::size_t k = 0; k < bucket.parameters.size(); ++k) {
      auto& parameter = parameters_[bucket.parameters[k]];
      parameter.set_data(units_[b]
                             .flat.narrow(0, bucket.offsets[k], layout_.numel(bucket.parameters[k]))
                             .view(full_shapes_[bucket.parameters[k]].sizes()));
    }
  }

  // ---- gathering blocks ----------------------------------------------------------------------------------
  /// Whether unit b is gathered in bf16 for compute (Precision::bf16 over fp32 parameters): the blocks, the head, and
  /// an embedding the strategy looks up itself (look_up_embedding: its rows are what block 0 would round to bf16
  /// anyway). An embedding run by its module stays fp32: its backward reads the weight, gathered again.
  bool gathers_in_bf16(std::size_t b) const {
    return bf16_blocks_ && b < sharded_units_ && (b != edge_unit(Edge::embedding) || looks_up_embedding_) &&
           units_[b].shard.scalar_type() == torch::kFloat32;
  }

  /// Whether unit b computes in bf16: gathered so, and its gradients are bf16, reduce-scattered every micro-batch
  /// (their bf16 sums must not accumulate in the parameters' .grad). The embedding's gradient is formed in fp32
  /// (accumulate_embedding_gradient), whatever it was gathered in.
  bool computes_in_bf16(std::size_t b) const { return gathers_in_bf16(b) && b != edge_unit(Edge::embedding); }

  /// Starts gathering unit b: in bf16 for compute where it computes so, converted as this rank's slice is copied in
  /// (FSDP2's cast of the all-gather input: no bf16 copy of the shard is kept between gathers).
  void start_gather(std::size_t b, bool for_compute = true) {
    torch::NoGradGuard no_grad;
    auto& unit = units_[b];
    const auto options =
        unit.shard.options().dtype(for_compute && gathers_in_bf16(b) ? torch::kBFloat16 : unit.shard.scalar_type());
    const auto numel = layout_.buckets()[b].padded_numel;
    // Gathered again for backward, a block whose activations were kept refills the buffer they refer to.
    const bool refill = for_compute && unit.held && unit.held.unsafeGetStorageImpl()->nbytes() == 0 &&
                        torch::elementSize(torch::typeMetaToScalarType(options.dtype())) * numel > 0;
    unit.flat = refill ? refill_storage(unit.held, numel, options) : dist::empty_flat_buffer(numel, options);
    own_slice(b).copy_(unit.shard);
    if (unit.flat.numel() > 0)
      unit.gather = dist::start_all_gather_in_place(*group_, unit.flat);  // nothing trains in it: nothing
    if (for_compute) block_traffic_.gathered += unit.flat.nbytes();
    gathered_bytes_ += unit.flat.nbytes();
    start_frozen_gather(b, for_compute);
    peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
  }

  /// Starts gathering unit b's frozen parameters (as start_gather does its trainable ones, in the dtype they are held
  /// in).
  void start_frozen_gather(std::size_t b, bool for_compute) {
    auto& part = units_[b].frozen;
    if (!part.shard.defined()) return;
    const auto& bucket = frozen_layout_.buckets()[b];
    const bool refill = for_compute && part.held && part.held.unsafeGetStorageImpl()->nbytes() == 0;
    part.flat = refill ? refill_storage(part.held, bucket.padded_numel, part.shard.options())
                       : dist::empty_flat_buffer(bucket.padded_numel, part.shard.options());
    part.flat.narrow(0, group_->rank() * bucket.shard_numel, bucket.shard_numel).copy_(part.shard);
    part.gather = dist::start_all_gather_in_place(*group_, part.flat);
    if (for_compute) block_traffic_.frozen_gathered += part.flat.nbytes();
    gathered_bytes_ += part.flat.nbytes();
  }

  void finish_gather(std::size_t b) {
    auto& unit = units_[b];
    if (unit.gathered) return;
    dist::wait(*group_, unit.gather);
    point_parameters_at(b);
    if (unit.frozen.shard.defined()) {
      dist::wait(*group_, unit.frozen.gather);
      const auto& bucket = frozen_layout_.buckets()[b];
      for (std::size_t k = 0; k < bucket.parameters.size(); ++k) {
        const auto p = bucket.parameters[k];
        frozen_[p].set_data(
            unit.frozen.flat.narrow(0, bucket.offsets[k], frozen_layout_.numel(p)).view(frozen_shapes_[p].sizes()));
      }
    }
    unit.gathered = true;
  }

  /// Block b whole in the module: waits for its prefetched gather, or gathers it now.
  void acquire(std::size_t b) {
    if (!units_[b].flat.defined()) start_gather(b);  // flat: gathered, or its gather on the way
    finish_gather(b);
  }

  /// Starts gathering block b while the current block computes (no-op when it is gathered or on its way).
  void prefetch(std::size_t b) {
    if (!prefetch_next_block_ || pinned_ || b >= sharded_units_ || units_[b].flat.defined()) return;
    start_gather(b);
  }

  /// Frees block b's gathered parameters (they become empty); its shard stays.
  void release(std::size_t b) {
    auto& unit = units_[b];
    if (pinned_ || !unit.gathered) return;
    const auto& bucket = layout_.buckets()[b];
    for (auto p : bucket.parameters) parameters_[p].set_data(torch::empty({0}, unit.shard.options()));
    gathered_bytes_ -= unit.flat.nbytes();
    unit.flat = torch::Tensor();
    if (unit.frozen.flat.defined()) {
      for (auto p : frozen_layout_.buckets()[b].parameters)
        frozen_[p].set_data(torch::empty({0}, unit.frozen.shard.options()));
      gathered_bytes_ -= unit.frozen.flat.nbytes();
      unit.frozen.flat = torch::Tensor();
    }
    unit.gathered = false;
  }

  /// Frees every block (after gather_full_model, or a prefetch nobody used).
  void release_all_blocks() {
    pinned_ = false;
    for (std::size_t b = 0; b < sharded_units_; ++b) {
      if (units_[b].flat.defined()) finish_gather(b);
      release(b);
      forget_held(b);
    }
  }

  /// Frees the memory of block b's gathered buffer while autograd's saved tensors (views of it, kept for the
  /// block's backward) still refer to it: FSDP2's storage resize to 0. Gathered again, the same storage is
  /// refilled (refill_storage), so those saved views see the parameters again.
  void release_keeping_storage(std::size_t b) {
    auto& unit = units_[b];
    if (pinned_ || !unit.gathered) return;
    auto storage = unit.flat.storage();
    auto frozen = unit.frozen.flat.defined() ? unit.frozen.flat.storage() : c10::Storage();
    release(b);
    unit.held = emptied(std::move(storage));
    if (frozen) unit.frozen.held = emptied(std::move(frozen));
  }

  /// `storage` with its memory given back (0 bytes), for refill_storage to allocate again.
  static c10::Storage emptied(c10::Storage storage) {
    auto* impl = storage.unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(impl->allocator()->allocate(0));
    impl->set_nbytes(0);
    return storage;
  }

  /// A flat buffer of `numel` elements over `storage`, its memory allocated again.
  static torch::Tensor refill_storage(const c10::Storage& storage, std::int64_t numel,
                                      const torch::TensorOptions& options) {
    auto* impl = storage.unsafeGetStorageImpl();
    const auto bytes =
        static_cast<std::size_t>(numel) * torch::elementSize(torch::typeMetaToScalarType(options.dtype()));
    impl->set_data_ptr_noswap(impl->allocator()->allocate(bytes));
    impl->set_nbytes(bytes);
    return torch::empty({0}, options).set_(storage, 0, {numel}, {1});
  }

  /// After block b's backward (or at the step): nothing refers to its held buffer any more.
  void forget_held(std::size_t b) { units_[b].held = units_[b].frozen.held = c10::Storage(); }

  // ---- the block and edge runners ----------------------------------------------------------------------
  torch::Tensor run_block(std::size_t index, const BlockCall& call, const torch::Tensor& input) {
    if (index >= model_blocks_)
      throw RuntimeError(errors::runtime_gradient_sync,
                         fmt::format("run_block({}) on a model that lists {} blocks", index, model_blocks_));
    const auto recompute = lists_->activation_checkpointing();
    if (recompute == models::Recompute::none || !torch::GradMode::is_enabled())
      return run_keeping_activations(index, call, input);
    models::CheckpointHooks hooks;
    hooks.before_forward = [this, index] {
      acquire(index);
      prefetch(next_unit(index));
    };
    hooks.after_forward = [this, index] { release(index); };
    hooks.before_recompute = [this, index] {
      acquire(index);
      prefetch(previous_unit(index));
    };
    hooks.after_backward = [this, index] {
      if (sync_ || computes_in_bf16(index)) start_gradient_reduce_scatter(index);
      release(index);
    };
    return models::checkpointed(computing(index, call), input, std::move(hooks), recompute);
  }

  /// An edge that is a unit runs as a block keeping its activations (never recomputed: the head's backward needs
  /// its weight and the logits' gradient at once anyway); an edge that is none (tied, frozen) runs as it is.
  torch::Tensor run_edge(Edge edge, const BlockCall& call, const torch::Tensor& input) {
    const auto unit = edge_unit(edge);
    if (unit == no_unit) return call(input);
    if (edge == Edge::embedding && looks_up_embedding_ && !input.is_floating_point()) return look_up_embedding(input);
    return run_keeping_activations(unit, call, input);
  }

  // ---- the embedding --------------------------------------------------------------------------------------
  /// Whether the strategy looks the embedding's rows up itself: its edge is a torch::nn::Embedding (no max_norm, no
  /// scale_grad_by_freq, dense) whose weight trains and is its unit's one parameter. The weight's gradient needs only
  /// the ids (embedding_dense_backward), so backward never gathers it again, and its rows are gathered in bf16 under
  /// Precision::bf16 (those block 0 rounds its input to).
  void choose_embedding_lookup() {
    looks_up_embedding_ = false;
    const auto unit = edge_unit(Edge::embedding);
    if (unit == no_unit) return;
    auto* embedding =
        dynamic_cast<torch::nn::EmbeddingImpl*>(edge_modules_[static_cast<std::size_t>(Edge::embedding)].get());
    if (embedding == nullptr) return;
    const auto& options = embedding->options;
    const auto& bucket = layout_.buckets()[unit];
    if (options.max_norm() || options.scale_grad_by_freq() || options.sparse() || bucket.parameters.size() != 1 ||
        !frozen_layout_.buckets()[unit].parameters.empty() ||
        parameters_[bucket.parameters.front()].unsafeGetTensorImpl() != embedding->weight.unsafeGetTensorImpl())
      return;
    embedding_padding_ = options.padding_idx().value_or(-1);
    looks_up_embedding_ = true;
  }

  /// The embedding's rows for `ids`, in its shard's dtype: gathered (or its prefetch waited for), looked up, freed at
  /// once. In backward the rows' gradient becomes the weight's (accumulate_embedding_gradient): no gather there.
  torch::Tensor look_up_embedding(const torch::Tensor& ids) {
    const auto unit = edge_unit(Edge::embedding);
    acquire(unit);
    prefetch(next_unit(unit));
    torch::Tensor rows;
    {
      torch::NoGradGuard no_grad;
      const auto& weight = parameters_[layout_.buckets()[unit].parameters.front()];
      rows = at::embedding(weight, ids, embedding_padding_).to(units_[unit].shard.scalar_type());
    }
    release(unit);
    if (!torch::GradMode::is_enabled()) return rows;
    return models::on_gradient(rows,
                               [this, ids](const torch::Tensor& grad) { accumulate_embedding_gradient(ids, grad); });
  }

  /// The embedding weight's gradient from its rows' (`grad`) and the ids, in fp32 (the shard's dtype: repeated ids sum
  /// exactly enough), added to the weight's .grad as autograd would; on the step's last micro-batch its reduce-scatter
  /// starts at once (the last unit backward reaches).
  void accumulate_embedding_gradient(const torch::Tensor& ids, const torch::Tensor& grad) {
    torch::NoGradGuard no_grad;
    const auto unit = edge_unit(Edge::embedding);
    const auto p = layout_.buckets()[unit].parameters.front();
    const auto rows = full_shapes_[p].size(0);
    auto weight_grad = at::embedding_dense_backward(grad.to(units_[unit].gradient_shard.scalar_type()), ids, rows,
                                                    embedding_padding_, /*scale_grad_by_freq=*/false);
    auto& parameter = parameters_[p];
    if (parameter.grad().defined()) parameter.mutable_grad().add_(weight_grad);
    else parameter.mutable_grad() = std::move(weight_grad);
    if (sync_) start_gradient_reduce_scatter(unit);
  }

  /// A block computing in bf16 takes a bf16 input (FSDP2's cast_forward_inputs: the CPU's layer_norm refuses an
  /// fp32 input with bf16 weights) and hands the next block its bf16 output: the residual stream between blocks is
  /// bf16 (2 bytes a token and hidden unit where recomputation keeps block inputs, no casts between blocks; the
  /// values are those an fp32 stream would carry, each block's bf16 output widened and narrowed again). The last block
  /// gives back the dtype the first one took, so what follows the blocks (the final norm) sees the stream it would
  /// without sharding. An edge's call is left to autocast: the head's logits stay in the dtype it computes them in.
  /// A block gathered in its shard's precision (the whole model pinned by gather_full_model) runs as it is: what
  /// was gathered is read when the call runs (a checkpointed block is gathered inside it).
  BlockCall computing(std::size_t unit, const BlockCall& call) {
    if (unit >= model_blocks_ || !computes_in_bf16(unit)) return call;
    return [this, unit, call](const torch::Tensor& x) {
      const auto& flat = units_[unit].flat;
      if (flat.defined() && flat.scalar_type() != torch::kBFloat16) return call(x);
      if (unit == 0) stream_dtype_ = x.scalar_type();
      auto y = call(x.to(torch::kBFloat16));
      return unit + 1 == model_blocks_ ? y.to(stream_dtype_) : y;
    };
  }

  /// Unit `unit` run once, its activations kept for backward (FSDP's default): gathered for the forward and
  /// freed after it (the saved views keep the buffer's storage, not its memory), gathered again into the same
  /// storage just before its backward (a hook on its output's gradient, which also prefetches the previous
  /// unit), its gradients reduce-scattered just after (a hook on its input's gradient, which autograd computes
  /// after the parameters' ones). An input that carries no gradient (the embedding's ids) gets no hook: that
  /// unit's gradients are reduce-scattered by finish_gradients, at the end of backward anyway. Without grad
  /// (evaluation) the unit is gathered, run and freed.
  torch::Tensor run_keeping_activations(std::size_t unit, const BlockCall& block_call, const torch::Tensor& input) {
    acquire(unit);
    prefetch(next_unit(unit));
    const auto call = computing(unit, block_call);
    // Nothing of a unit that does not train (a frozen embedding on the ids) is read in backward: run as in evaluation.
    const bool backward_reads_it =
        !layout_.buckets()[unit].parameters.empty() || (input.is_floating_point() && input.requires_grad());
    if (!torch::GradMode::is_enabled() || !backward_reads_it) {
      auto output = call(input);
      release(unit);
      return output;
    }
    auto x = !input.is_floating_point() ? input : models::on_backward(input, [this, unit] {
      if (sync_ || computes_in_bf16(unit)) start_gradient_reduce_scatter(unit);
      release(unit);
      forget_held(unit);
    });
    auto output = models::on_backward(call(x), [this, unit] {
      acquire(unit);
      prefetch(previous_unit(unit));
    });
    release_keeping_storage(unit);
    return output;
  }

  // ---- the order units run in ----------------------------------------------------------------------------
  static constexpr std::size_t no_unit = static_cast<std::size_t>(-1);

  /// The unit of `edge`, or no_unit.
  std::size_t edge_unit(Edge edge) const { return edge_units_[static_cast<std::size_t>(edge)]; }

  /// The sharded units in the order forward runs them: the embedding, the blocks, the head (build_layout found the
  /// edges' units).
  void order_units() {
    forward_order_.clear();
    if (edge_unit(Edge::embedding) != no_unit) forward_order_.push_back(edge_unit(Edge::embedding));
    for (std::size_t b = 0; b < model_blocks_; ++b) forward_order_.push_back(b);
    if (edge_unit(Edge::head) != no_unit) forward_order_.push_back(edge_unit(Edge::head));
    place_in_order_.assign(sharded_units_, 0);
    for (std::size_t k = 0; k < forward_order_.size(); ++k) place_in_order_[forward_order_[k]] = k;
  }

  /// The unit forward runs after (before) `unit`, or no_unit.
  std::size_t next_unit(std::size_t unit) const {
    const auto k = place_in_order_[unit] + 1;
    return k < forward_order_.size() ? forward_order_[k] : no_unit;
  }
  /// Backward's prefetch: an embedding the strategy looks up is not gathered in backward.
  std::size_t previous_unit(std::size_t unit) const {
    const auto k = place_in_order_[unit];
    if (k == 0 || (looks_up_embedding_ && forward_order_[k - 1] == edge_unit(Edge::embedding))) return no_unit;
    return forward_order_[k - 1];
  }

  /// Starts reduce-scattering unit b's gradients (in the gradient shard's fp32; the parameters' gradients are
  /// released): into its gradient shard, or, once that holds an earlier micro-batch's sum, into a buffer added
  /// to it when finished.
  /// At most this many reduce-scatters stay in flight; starting another first waits for the oldest. Each holds its
  /// unit's whole fp32 gradient (the padded flat input) until waited for: left in flight until the end of backward,
  /// they held the whole model's gradients in fp32 at once (4 bytes a parameter: 4.4 GB at 1.1B). Two keep a unit's
  /// reduction overlapping the next unit's backward, as FSDP2's post-backward waits for the previous one.
  static constexpr std::size_t max_reduce_scatters_in_flight = 2;

  void start_gradient_reduce_scatter(std::size_t b) {
    auto& unit = units_[b];
    finish_gradient_reduce_scatter(b);  // the previous micro-batch's, when still in flight
    while (reducing_.size() >= max_reduce_scatters_in_flight)
      finish_gradient_reduce_scatter(reducing_.front());  // before allocating
    auto output = unit.gradient_accumulated ? torch::empty_like(unit.gradient_shard) : unit.gradient_shard;
    unit.reduce_scatter = dist::start_bucket_reduce_scatter(*group_, layout_.buckets()[b], parameters_, output,
                                                            world_->world_size(), reduce_dtype_);
    unit.reduce_scatter_ends_step = sync_;
    unit.sent = true;
    if (!unit.reduce_scatter.pending()) return;
    if (b < sharded_units_) block_traffic_.reduce_scattered += unit.reduce_scatter.input.nbytes();
    reducing_.push_back(b);
    reducing_bytes_ += unit.reduce_scatter.input.nbytes();
    peak_reducing_bytes_ = std::max(peak_reducing_bytes_, reducing_bytes_);
  }

  /// Waits for unit b's reduce-scatter, if one is in flight, and sums it into the gradient shard. Hybrid: the step's
  /// last one then starts the shard's all-reduce across the replicas (FSDP2's HSDP: each unit's as its
  /// reduce-scatter ends, overlapping the rest of backward).
  void finish_gradient_reduce_scatter(std::size_t b) {
    auto& unit = units_[b];
    if (!unit.reduce_scatter.pending()) return;
    reducing_bytes_ -= unit.reduce_scatter.input.nbytes();
    reducing_.erase(std::find(reducing_.begin(), reducing_.end(), b));
    dist::wait(*group_, unit.reduce_scatter);
    torch::NoGradGuard no_grad;
    if (!unit.reduce_scatter.output.is_same(unit.gradient_shard)) unit.gradient_shard.add_(unit.reduce_scatter.output);
    unit.reduce_scatter.output = torch::Tensor();
    unit.gradient_accumulated = true;
    if (replicas_ && unit.reduce_scatter_ends_step) start_replica_reduction(b);
  }

  /// Starts summing unit b's gradient shard across the replicas (pre-scaled by 1/W: the world's average), in the
  /// reduce dtype: a bf16 copy of the fp32 shard, summed and converted back by finish_replica_reduction.
  void start_replica_reduction(std::size_t b) {
    auto& unit = units_[b];
    torch::NoGradGuard no_grad;
    const bool converts = unit.gradient_shard.scalar_type() != reduce_dtype_;
    unit.replica_buffer = converts ? unit.gradient_shard.to(reduce_dtype_) : torch::Tensor();
    const auto& summed = converts ? unit.replica_buffer : unit.gradient_shard;
    unit.across_replicas = dist::start_all_reduce_in_place(*replicas_, summed);
    if (unit.across_replicas.pending) replica_reduced_bytes_ += summed.nbytes();
  }

  /// Waits for unit b's all-reduce across the replicas, if one is in flight (or starts it: a unit whose
  /// reduce-scatter ended before the step's last micro-batch had none started).
  void finish_replica_reduction(std::size_t b) {
    if (!replicas_) return;
    auto& unit = units_[b];
    if (!unit.across_replicas.pending && !unit.replica_buffer.defined()) start_replica_reduction(b);
    dist::wait(*replicas_, unit.across_replicas);
    torch::NoGradGuard no_grad;
    if (unit.replica_buffer.defined()) unit.gradient_shard.copy_(unit.replica_buffer);
    unit.replica_buffer = torch::Tensor();
  }

  detail::ZeroShardView shard_view(const std::vector<torch::Tensor>& parameters) {
    // The world's rank and size: the index names the archive of this rank among all of them.
    detail::ZeroShardView view{name(), *world_, *model_, names_, parameters, *optimizer_, {}, 0, {}};
    if (hybrid_) view.shard_group = group_->world_size();
    for (const auto& piece : pieces_) view.pieces.push_back({piece.place, piece.master});
    return view;
  }

  dist::GradientSyncOptions buckets_;
  bool prefetch_next_block_ = true;
  bool hybrid_ = false;
  int hybrid_group_size_ = 0;                     // 0: the ranks of a node
  std::shared_ptr<dist::ProcessGroup> world_;     // every rank: setup's broadcast, the checkpoint's archive names
  std::shared_ptr<dist::ProcessGroup> group_;     // the shard group: the world under ZeRO-3
  std::shared_ptr<dist::ProcessGroup> replicas_;  // hybrid: the replica group (null: none)
  int replica_index_ = 0;                         // which shard group this rank is in (hybrid)
  std::size_t replica_reduced_bytes_ = 0;
  std::shared_ptr<torch::nn::Module> model_;
  ListsBlocks* lists_ = nullptr;
  std::vector<std::shared_ptr<torch::nn::Module>> block_modules_;
  std::vector<std::shared_ptr<torch::nn::Module>> edge_modules_;  // by Edge: the model's edges (null: none)
  std::vector<std::string> names_;
  std::vector<torch::Tensor> parameters_;
  std::vector<torch::Tensor> full_shapes_;  // meta tensors: each parameter's full shape and dtype
  std::vector<std::string> frozen_names_;   // the units' frozen parameters (frozen_layout_'s), as the three above
  std::vector<torch::Tensor> frozen_;
  std::vector<torch::Tensor> frozen_shapes_;                     // meta tensors in the dtype the units hold them in
  std::unordered_map<const void*, std::string> frozen_name_of_;  // every frozen parameter of the model, by TensorImpl
  std::unordered_set<const void*> frozen_taken_;                 // those a unit took
  dist::FlatShardLayout frozen_layout_;                          // one bucket per sharded unit: its frozen parameters
  std::shared_ptr<DeferredBlocks> deferred_;  // during setup, when the model's blocks were built empty
  std::unordered_map<const void*, DeferredPlace> deferred_places_;  // during setup: where each deferred parameter sits
  dist::FlatShardLayout layout_;
  std::vector<std::pair<std::size_t, std::size_t>> bucket_of_;  // parameter -> (bucket, place in the bucket)
  std::size_t model_blocks_ = 0;                                // units 0 .. model_blocks_ - 1: the model's blocks
  std::size_t sharded_units_ = 0;  // then its edges that train, up to sharded_units_: gathered around their use
  std::array<std::size_t, 2> edge_units_{no_unit, no_unit};  // by Edge
  std::vector<std::size_t> forward_order_;                   // the sharded units in the order forward runs them
  std::vector<std::size_t> place_in_order_;                  // each sharded unit's place in forward_order_
  std::vector<Unit> units_;
  std::vector<Piece> pieces_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  bool sync_ = true;
  bool pinned_ = false;
  bool bf16_blocks_ = false;  // Precision::bf16: blocks gathered and computed in bf16 (computes_in_bf16)
  torch::ScalarType stream_dtype_ = torch::kFloat32;  // what the first bf16 block took, the last one gives back
  bool looks_up_embedding_ = false;                   // choose_embedding_lookup
  std::int64_t embedding_padding_ = -1;               // its padding_idx (-1: none): that row gets no gradient
  torch::ScalarType reduce_dtype_ = torch::kFloat32;  // what the reduce-scatters and the replicas' all-reduces sum in
  std::size_t gathered_bytes_ = 0, peak_gathered_bytes_ = 0;
  std::deque<std::size_t> reducing_;                          // units whose reduce-scatter is in flight, oldest first
  std::size_t reducing_bytes_ = 0, peak_reducing_bytes_ = 0;  // their inputs' bytes
  BlockTraffic block_traffic_;
};

}  // namespace hpctrain
