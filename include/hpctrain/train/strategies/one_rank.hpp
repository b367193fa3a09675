#pragma once
// A sharded stage (zero1, zero2, zero3, hsdp) at one rank. Sharding over one rank shards nothing: it only adds
// work — ZeRO-1/2 copy every parameter into an fp32 master and back each step, ZeRO-3 gathers each block from a
// "shard" that is the whole block (on an H200, docs/gpu.md: 0.83x Replicated's speed, 3.4 GiB more held). So at
// one rank such a stage trains as Replicated, as torchtitan (no FSDP at dp_shard 1) and Lightning do.
//
// What users rely on is kept: its checkpoints are the stage's sharded format (zero_checkpoint.hpp) with one piece
// per trainable parameter, the whole of it, so that they resume at any world size under zero1, zero2, zero3 or
// hsdp (whose loads read any layout of pieces), and it resumes theirs (Replicated's load reads every saved rank's
// overlap with each whole parameter) and Replicated's own. A checkpoint's strategy is the stage's name, as is name() in
// the logs.
//
// Memory per rank, in bytes per trainable parameter with Adam: Replicated's, 4 (parameter) + 4 (gradient) + 8
// (moments); collectives: none at one rank. --shard-at-one-rank makes the stage's own strategy instead
// (the GPU suite measures ZeRO-3's path on one GPU that way).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <hpctrain/dist/gradient_sync.hpp>
#include <hpctrain/train/strategies/replicated.hpp>
#include <hpctrain/train/strategies/sharding.hpp>
#include <hpctrain/train/strategies/strategy.hpp>
#include <hpctrain/train/strategies/zero.hpp>  // require_elementwise
#include <hpctrain/train/strategies/zero_checkpoint.hpp>
#include <hpctrain/train/training.hpp>

namespace hpctrain {

/// A sharded stage at one rank: Replicated's training, the stage's checkpoint format (the header's comment).
class ShardedAtOneRank : public Replicated {
 public:
  explicit ShardedAtOneRank(ZeroStage stage, dist::GradientSyncOptions buckets = {})
      : Replicated(buckets), stage_(stage) {}

  /// The stage's name ("zero3"): the checkpoint's strategy, which every sharded stage resumes.
  std::string name() const override { return to_string(stage_); }

  void setup(StrategyContext context) override {
    group_ = context.group;
    model_ = context.model;
    context.reduce_dtype =
        ReduceDtype::fp32;  // one rank reduces nothing: the stage's bf16 reduction costs nothing here
    Replicated::setup(std::move(context));
    detail::require_elementwise(optimizer(), stage_);  // as the stage refuses LBFGS: its checkpoint is per element
    for (const auto& [name, parameter] : detail::named_parameters_of(*model_)) {
      names_.push_back(name);
      parameters_.push_back(parameter);
    }
  }

  bool saves_per_rank() const override { return true; }

  void save(torch::serialize::OutputArchive& archive, PieceWriter& pieces) override {
    detail::save_zero_shard(archive, pieces, shard_view());
  }

  // load: Replicated's, which reads a zero1/zero2/zero3/hsdp checkpoint of any world size (every saved piece's
  // overlap with each whole parameter) and a replicated one.

 private:
  detail::ZeroShardView shard_view() {
    return detail::whole_parameter_view(name(), *group_, *model_, names_, parameters_, optimizer());
  }

  ZeroStage stage_;
  std::shared_ptr<dist::ProcessGroup> group_;
  std::shared_ptr<torch::nn::Module> model_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> parameters_;
};

/// The strategy of a run of `training` on `world_size` ranks: a ShardedAtOneRank where a sharded stage chosen with
/// Training::sharding (or --sharding) runs replicated (sharded_stage_runs_replicated), else the Training's own. A
/// strategy given with Training::strategy is made as given.
inline std::unique_ptr<DataParallelStrategy> make_strategy_for_world(const Training& training, int world_size) {
  if (const auto stage = training.sharding();
      stage && sharded_stage_runs_replicated(*stage, world_size, training.shard_at_one_rank()))
    return std::make_unique<ShardedAtOneRank>(*stage);
  return training.make_strategy();
}

}  // namespace hpctrain
