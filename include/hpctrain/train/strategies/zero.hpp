#pragma once
// ZeRO-1 and ZeRO-2 (Rajbhandari et al., 2020) as implementations of the data-parallel strategy seam
// (train/strategies/strategy.hpp). Both keep the full parameters on every rank and shard the optimizer: the trainable
// parameters are laid out in flat buckets (dist/flat_shards.hpp), each split evenly over the ranks, and each
// rank's optimizer sees only its shard — one fp32 "master" tensor per parameter piece, named after its
// parameter. After the optimizer step every bucket is all-gathered in place: the module's parameters are
// views into the flat buckets, so the gather writes them directly.
//
//   ZeRO-1: gradients all-reduced during backward (GradientSync); each rank steps its shard.
//   ZeRO-2: gradients reduce-scattered during backward (ShardedGradients); each rank keeps only its shard.
//
// Collectives per step, in order: [ZeRO-1] one all-reduce per bucket during backward, [ZeRO-2] one
// reduce-scatter per bucket during backward; then one all-reduce of one number when clipping; then one
// all-gather per bucket after the optimizer step. Any elementwise optimizer works unchanged on a shard
// (torch::optim SGD, Adam, AdamW, Adagrad, RMSprop); LBFGS (whole-vector line search) is refused.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/optim/lbfgs.h>
#include <torch/types.h>

#include <hpctrain/dist/collectives.hpp>
#include <hpctrain/dist/flat_shards.hpp>
#include <hpctrain/dist/gradient_sync.hpp>
#include <hpctrain/dist/shard_collectives.hpp>
#include <hpctrain/dist/sharded_gradients.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/train/strategies/replicated.hpp>
#include <hpctrain/train/strategies/sharding.hpp>
#include <hpctrain/train/strategies/strategy.hpp>
#include <hpctrain/train/strategies/zero_checkpoint.hpp>

namespace hpctrain {

/// Options of a ZeroStrategy.
struct ZeroOptions {
  explicit ZeroOptions(ZeroStage stage = ZeroStage::zero2) : stage(stage) {}
  /// The stage. Default: zero2.
  ZeroStage stage;
  /// Bucket sizes (as GradientSync's): every bucket is one collective. Default: 25 MiB, first 1 MiB.
  dist::GradientSyncOptions buckets;
};

namespace detail {

/// Throws SpecError("optimizer") for optimizers whose update is not elementwise (a shard cannot step alone).
inline void require_elementwise(const torch::optim::Optimizer& optimizer, ZeroStage stage) {
  if (dynamic_cast<const torch::optim::LBFGS*>(&optimizer)) {
    throw SpecError("optimizer", "LBFGS",
                    fmt::format("{} steps each rank's shard of the parameters on its own, which needs an elementwise "
                                "optimizer (SGD, Adam, AdamW, Adagrad, RMSprop); LBFGS's line search and history "
                                "span the whole parameter vector: use it with the replicated strategy",
                                to_string(stage)));
  }
}

/// Scales the gradients of this rank's `masters` (its pieces of the parameters; padding holds none) so that
/// the global L2 norm over all ranks' pieces is at most `max_norm`: one all-reduce of one fp64 number (the
/// sum of squares). Returns the norm before clipping, 0-dim fp32, as torch::nn::utils::clip_grad_norm_ on
/// the replicated model (the same clip_coefficient as Replicated).
inline torch::Tensor clip_sharded_grad_norm(dist::ProcessGroup& group, const std::vector<torch::Tensor>& masters,
                                            double max_norm) {
  torch::NoGradGuard no_grad;
  auto squares = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat64).device(group.device()));
  for (const auto& master : masters)
    if (master.grad().defined()) squares += master.grad().pow(2).sum(torch::kFloat64);
  dist::all_reduce_sum(group, squares);
  auto norm = squares.sqrt().to(torch::kFloat32).reshape({});
  const auto coefficient = clip_coefficient(norm, max_norm);
  for (const auto& master : masters)
    if (master.grad().defined()) master.grad().mul_(coefficient.to(master.scalar_type()));
  return norm;
}

/// The masters of `pieces` (anything with a `.master` tensor): what the optimizer steps on this rank.
template <class Pieces>
std::vector<torch::Tensor> masters_of(const Pieces& pieces) {
  std::vector<torch::Tensor> masters;
  for (const auto& piece : pieces) masters.push_back(piece.master);
  return masters;
}

/// Bytes of `optimizer`'s state (every tensor) for the masters of `pieces`, and of the masters themselves.
template <class Pieces>
std::pair<std::size_t, std::size_t> state_and_master_bytes(const torch::optim::Optimizer& optimizer,
                                                           const Pieces& pieces) {
  std::size_t state = 0, masters = 0;
  for (const auto& piece : pieces) {
    masters += piece.master.nbytes();
    const auto found = optimizer.state().find(piece.master.unsafeGetTensorImpl());
    if (found != optimizer.state().end()) state += state_tensor_bytes(*found->second);
  }
  return {state, masters};
}

/// The floating type optimizer state is kept in: fp32 for reduced-precision parameters, else their own.
inline torch::ScalarType master_dtype(torch::ScalarType parameter) {
  return parameter == torch::kBFloat16 || parameter == torch::kHalf ? torch::kFloat32 : parameter;
}

}  // namespace detail

/// ZeRO-1 / ZeRO-2 data parallelism: optimizer state (and for ZeRO-2 gradients) sharded over the ranks.
class ZeroStrategy : public DataParallelStrategy {
 public:
  /// Throws SpecError("sharding") for a stage other than zero1 and zero2 (make_zero_strategy picks the class).
  explicit ZeroStrategy(ZeroOptions options = ZeroOptions()) : options_(std::move(options)) {
    if (options_.stage != ZeroStage::zero1 && options_.stage != ZeroStage::zero2)
      throw SpecError("sharding", to_string(options_.stage),
                      "ZeroStrategy runs zero1 or zero2; make_zero_strategy(stage) makes the strategy of any stage");
  }

  std::string name() const override { return to_string(options_.stage); }

  void setup(StrategyContext context) override {
    group_ = std::move(context.group);
    model_ = std::move(context.model);
    detail::hold_frozen_in_compute_dtype(*model_, context.precision);
    collect_trainable_parameters();
    if (options_.stage == ZeroStage::zero1) require_fp32_reduce(context.reduce_dtype, name());
    reduce_dtype_ = scalar_type_of(context.reduce_dtype);
    if (options_.stage == ZeroStage::zero1) {
      all_reduce_ = std::make_unique<dist::GradientSync>(group_, *model_, options_.buckets);  // broadcasts
    } else {
      dist::broadcast_module(*group_, *model_);
    }
    build_flat_buckets();
    build_master_shards();
    optimizer_ = detail::make_optimizer_over_pieces(context.make_optimizer, pieces_, names_,
                                                    [this](std::size_t p) { return parameters_[p].dim(); });
    if (!optimizer_) throw SpecError("optimizer", "null", "the optimizer factory returned no optimizer");
    detail::require_elementwise(*optimizer_, options_.stage);
    if (options_.stage == ZeroStage::zero2)
      reduce_scatter_ = std::make_unique<dist::ShardedGradients>(group_, layout_, parameters_, names_, reduce_dtype_);
  }

  torch::optim::Optimizer& optimizer() override { return *optimizer_; }

  void zero_grad() override {
    for (auto& parameter : parameters_)
      if (parameter.grad().defined()) parameter.mutable_grad().reset();
    for (auto& piece : pieces_)
      if (piece.master.grad().defined()) piece.master.mutable_grad().reset();
  }

  void set_sync(bool sync) override {
    if (all_reduce_) all_reduce_->set_sync(sync);
    if (reduce_scatter_) reduce_scatter_->set_sync(sync);
  }

  void finish_gradients() override {
    torch::NoGradGuard no_grad;
    if (reduce_scatter_) {
      reduce_scatter_->finish();
      for (auto& piece : pieces_) {
        auto shard =
            reduce_scatter_->gradient_shard(piece.bucket).narrow(0, piece.place.shard_offset, piece.place.length);
        set_master_gradient(piece, shard);
      }
      return;
    }
    all_reduce_->finish();
    for (auto& piece : pieces_) {
      const auto& full = parameters_[piece.place.parameter].grad();
      auto part = full.defined() ? full.reshape({-1}).narrow(0, piece.place.begin, piece.place.length)
                                 : torch::zeros({piece.place.length}, parameters_[piece.place.parameter].options());
      set_master_gradient(piece, part);
    }
  }

  torch::Tensor clip_grad_norm(double max_norm) override {
    return detail::clip_sharded_grad_norm(*group_, detail::masters_of(pieces_), max_norm);
  }

  void step() override {
    optimizer_->step();
    gather_parameters_from_masters();
  }

  bool saves_per_rank() const override { return true; }

  void save(torch::serialize::OutputArchive& archive, PieceWriter& pieces) override {
    detail::save_zero_shard(archive, pieces, shard_view());
  }

  /// Restores this rank's pieces (reading only their overlap with the saved ones, at any world size), then gathers
  /// the rest of the parameters from the other ranks, as after a step.
  void load(const SavedStrategyState& saved) override {
    detail::load_zero_shards(saved, shard_view());
    torch::NoGradGuard no_grad;
    for (auto& piece : pieces_) piece.master.copy_(parameter_part(piece));
    gather_parameters_from_masters();
  }

  // Instrumentation (benchmarks, tests).
  /// The layout: buckets, shard sizes.
  const dist::FlatShardLayout& layout() const { return layout_; }
  /// Bytes of optimizer state this rank holds (every tensor of every piece's state).
  std::size_t optimizer_state_bytes() const { return detail::state_and_master_bytes(*optimizer_, pieces_).first; }
  /// Bytes of the fp32 master shards this rank holds.
  std::size_t master_bytes() const { return detail::state_and_master_bytes(*optimizer_, pieces_).second; }
  /// Bytes of gradient this rank keeps between steps: full gradients (ZeRO-1) or its shards (ZeRO-2).
  std::size_t gradient_bytes() const {
    std::size_t bytes = 0;
    if (reduce_scatter_) {
      for (std::size_t b = 0; b < layout_.buckets().size(); ++b) bytes += reduce_scatter_->gradient_shard(b).nbytes();
    } else {
      for (const auto& parameter : parameters_) bytes += parameter.nbytes();
    }
    return bytes;
  }

 private:
  struct Piece {
    dist::ShardPiece place;
    std::size_t bucket = 0;
    torch::Tensor master;  // what the optimizer steps: this rank's part of the parameter, flat
  };

  void collect_trainable_parameters() {
    for (const auto& item : model_->named_parameters()) {
      if (!item.value().requires_grad()) continue;
      names_.push_back(item.key());
      parameters_.push_back(item.value());
    }
  }

  /// Moves every parameter into its bucket's flat buffer and makes the parameter a view of it.
  void build_flat_buckets() {
    std::vector<dist::detail::ParameterShape> shapes;
    std::vector<std::int64_t> numels;
    for (const auto& parameter : parameters_) {
      shapes.push_back({static_cast<std::size_t>(parameter.numel()) * parameter.element_size(),
                        static_cast<int>(parameter.scalar_type()), parameter.device().str()});
      numels.push_back(parameter.numel());
    }
    layout_ = dist::FlatShardLayout(shapes, numels, group_->world_size(), options_.buckets);
    torch::NoGradGuard no_grad;
    for (const auto& bucket : layout_.buckets()) {
      const auto& first = parameters_[bucket.parameters.front()];
      auto flat = torch::zeros({bucket.padded_numel}, first.options().requires_grad(false));
      for (std::size_t k = 0; k < bucket.parameters.size(); ++k) {
        auto& parameter = parameters_[bucket.parameters[k]];
        auto view = flat.narrow(0, bucket.offsets[k], parameter.numel()).view(parameter.sizes());
        view.copy_(parameter.detach());
        parameter.set_data(view);
      }
      flat_buckets_.push_back(flat);
    }
  }

  void build_master_shards() {
    torch::NoGradGuard no_grad;
    for (std::size_t b = 0; b < layout_.buckets().size(); ++b) {
      for (const auto& place : layout_.pieces(b, group_->rank())) {
        Piece piece{place, b, {}};
        const auto& parameter = parameters_[place.parameter];
        piece.master = parameter_part(piece).to(detail::master_dtype(parameter.scalar_type())).clone();
        pieces_.push_back(std::move(piece));
      }
    }
  }

  torch::Tensor parameter_part(const Piece& piece) const {
    return parameters_[piece.place.parameter].detach().reshape({-1}).narrow(0, piece.place.begin, piece.place.length);
  }

  static void set_master_gradient(Piece& piece, const torch::Tensor& gradient) {
    // Same dtype: a view (no copy; clipping scales it in place). Reduced precision: an fp32 copy.
    piece.master.mutable_grad() =
        gradient.scalar_type() == piece.master.scalar_type() ? gradient : gradient.to(piece.master.scalar_type());
  }

  /// Writes each master into this rank's slice of its flat bucket, then all-gathers every bucket in place.
  void gather_parameters_from_masters() {
    torch::NoGradGuard no_grad;
    for (auto& piece : pieces_) {
      const auto& bucket = layout_.buckets()[piece.bucket];
      flat_buckets_[piece.bucket]
          .narrow(0, group_->rank() * bucket.shard_numel + piece.place.shard_offset, piece.place.length)
          .copy_(piece.master);
    }
    std::vector<dist::PendingAllGather> gathers;
    for (auto& flat : flat_buckets_) gathers.push_back(dist::start_all_gather_in_place(*group_, flat));
    for (auto& gather : gathers) dist::wait(*group_, gather);
  }

  detail::ZeroShardView shard_view() {
    detail::ZeroShardView view{name(), *group_, *model_, names_, parameters_, *optimizer_, {}, 0, {}};
    for (const auto& piece : pieces_) view.pieces.push_back({piece.place, piece.master});
    return view;
  }

  ZeroOptions options_;
  std::shared_ptr<dist::ProcessGroup> group_;
  std::shared_ptr<torch::nn::Module> model_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> parameters_;
  dist::FlatShardLayout layout_;
  std::vector<torch::Tensor> flat_buckets_;
  std::vector<Piece> pieces_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<dist::GradientSync> all_reduce_;          // ZeRO-1
  std::unique_ptr<dist::ShardedGradients> reduce_scatter_;  // ZeRO-2
  torch::ScalarType reduce_dtype_ = torch::kFloat32;        // ZeRO-2: what the reduce-scatters sum in
};

}  // namespace hpctrain
