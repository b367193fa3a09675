#pragma once
// The replicated data-parallel strategy (DDP): every rank holds the whole model and optimizer state;
// gradients are averaged by dist::GradientSync (bucketed all-reduce overlapped with backward); rank 0 alone
// saves a checkpoint archive. The default strategy of a Training.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <hpctrain/dist/gradient_sync.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/models/blocks.hpp>
#include <hpctrain/train/precision.hpp>
#include <hpctrain/train/strategies/strategy.hpp>
#include <hpctrain/train/strategies/zero_checkpoint.hpp>

namespace hpctrain {

namespace detail {
/// The names and tensors of `module.named_parameters()` that train (frozen ones, such as the base weights
/// under LoRA, are left out of the optimizer), in registration order.
inline NamedParameters named_parameters_of(const torch::nn::Module& module) {
  NamedParameters named;
  for (const auto& item : module.named_parameters())
    if (item.value().requires_grad()) named.emplace_back(item.key(), item.value());
  return named;
}

/// The fp32 parameters of `modules` that `take` accepts, converted to bf16 in place (the same tensors: what refers to
/// them, a deferred place included, still does). An empty one (a block not read yet) stays empty.
template <class Take>
void modules_to_bf16(const std::vector<std::shared_ptr<torch::nn::Module>>& modules, Take take) {
  torch::NoGradGuard no_grad;
  for (const auto& module : modules)
    for (auto& parameter : module->parameters())
      if (parameter.scalar_type() == torch::kFloat32 && take(parameter))
        parameter.set_data(parameter.to(torch::kBFloat16));
}

/// Under Precision::bf16, a frozen fp32 token table that a tied head shares (ListsBlocks::tied_embedding: LoRA's base
/// of Llama 3.2 1B, Qwen2.5 0.5B, GPT-2) held in bf16, as the edges are when untied: its rows widened to fp32 as they
/// are looked up, the head's product over it the one autocast computed over its bf16 cast. Every strategy, ZeRO-3's
/// too (the table is outside its units, whole on every rank).
inline void hold_frozen_tied_embedding_in_compute_dtype(ListsBlocks& lists, Precision precision) {
  auto table = lists.tied_embedding();
  if (precision != Precision::bf16 || !table.defined() || table.requires_grad() ||
      table.scalar_type() != torch::kFloat32)
    return;
  torch::NoGradGuard no_grad;
  table.set_data(table.to(torch::kBFloat16));
  lists.set_embedding_widened(true);
}

/// Under Precision::bf16, the frozen fp32 parameters of the model's blocks and edges (LoRA's base: its blocks, and
/// an untied token embedding and head, or a tied table) are held in bf16, the dtype they compute in, as ZeRO-3 and
/// HSDP hold them (FullyShardedStrategy::frozen_dtype): half their memory, and no copy of them cast by autocast at
/// each forward (what PEFT on a bf16 model holds). The embedding's rows are widened back to fp32 as they are looked
/// up (ListsBlocks::set_embedding_widened), so the residual stream is the one the fp32 table gave. What trains stays
/// fp32, and so does whatever is neither a block nor an edge (norms, GPT-2's positions). A model that lists no
/// blocks keeps its dtypes.
inline void hold_frozen_in_compute_dtype(torch::nn::Module& model, Precision precision) {
  auto* lists = dynamic_cast<ListsBlocks*>(&model);
  if (precision != Precision::bf16 || lists == nullptr) return;
  const auto frozen = [](const torch::Tensor& parameter) { return !parameter.requires_grad(); };
  modules_to_bf16(lists->deferred_modules(/*edges=*/true), frozen);
  if (const auto embedding = lists->edge(Edge::embedding))
    for (const auto& parameter : embedding->parameters())
      if (frozen(parameter) && parameter.scalar_type() == torch::kBFloat16) lists->set_embedding_widened(true);
  hold_frozen_tied_embedding_in_compute_dtype(*lists, precision);
}

/// Module::save, but without the frozen parameters (LoRA's base): a checkpoint holds what trains and the buffers, as
/// the sharded stages' do (zero_checkpoint.hpp), and the base is read again from its source when the run resumes
/// (what PEFT's trainers save). Llama 3.1 8B under LoRA: 0.1 GB a checkpoint instead of 18.5 GB.
inline void save_trained(const torch::nn::Module& module, torch::serialize::OutputArchive& archive) {
  for (const auto& parameter : module.named_parameters(/*recurse=*/false))
    if (parameter.value().requires_grad()) archive.write(parameter.key(), parameter.value());
  for (const auto& buffer : module.named_buffers(/*recurse=*/false))
    archive.write(buffer.key(), buffer.value(), /*is_buffer=*/true);
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::OutputArchive child_archive(archive.compilation_unit());
    save_trained(*child.value(), child_archive);
    archive.write(child.key(), child_archive);
  }
}

/// Module::load, but a tensor saved in another dtype than the module's is converted into it (a checkpoint of a run in
/// fp32 loads into a bf16 run's frozen blocks, and the other way round), and a frozen parameter the archive does not
/// hold keeps the value the model was built with (save_trained leaves the base out; a checkpoint written before it
/// holds the base, read as any tensor). Tensors of the same dtype are taken as Module::load takes them.
inline void load_module(torch::nn::Module& module, torch::serialize::InputArchive& archive) {
  torch::NoGradGuard no_grad;
  const auto read_into = [&archive](const std::string& key, torch::Tensor& tensor, bool is_buffer) {
    torch::Tensor saved;
    if (!is_buffer && !tensor.requires_grad()) {
      if (!archive.try_read(key, saved, is_buffer)) return;
    } else {
      archive.read(key, saved, is_buffer);
    }
    if (saved.scalar_type() == tensor.scalar_type() && saved.device() == tensor.device()) tensor.set_(saved);
    else tensor.copy_(saved);
  };
  for (auto& parameter : module.named_parameters(/*recurse=*/false))
    read_into(parameter.key(), parameter.value(), false);
  for (auto& buffer : module.named_buffers(/*recurse=*/false)) read_into(buffer.key(), buffer.value(), true);
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::InputArchive child_archive;
    archive.read(child.key(), child_archive);
    load_module(*child.value(), child_archive);
  }
}

/// The factor gradient clipping scales by: min(1, max_norm / (norm + 1e-6)), as torch::nn::utils::clip_grad_norm_
/// (a tensor: no host sync). Shared by Replicated and the sharded strategies (which get `norm` over all shards).
inline torch::Tensor clip_coefficient(const torch::Tensor& norm, double max_norm) {
  return torch::clamp(max_norm / (norm + 1e-6), std::nullopt, 1.0);
}

/// Scales the gradients of `parameters` so that their global L2 norm is at most `max_norm`; returns the
/// norm before clipping as a 0-dim tensor, without reading it on the host (torch::nn::utils::clip_grad_norm_
/// computes the same, then calls .item()). Through the foreach kernels, as PyTorch's clip_grad_norm_ on CUDA:
/// a few launches instead of two per tensor (296 for GPT-2 124M).
inline torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& parameter : parameters)
    if (parameter.grad().defined()) grads.push_back(parameter.grad());
  if (grads.empty()) return torch::zeros({}, torch::kFloat32);
  const auto norms = torch::_foreach_norm(grads, 2);
  auto total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2);
  torch::_foreach_mul_(grads, clip_coefficient(total, max_norm));
  return total;
}
}  // namespace detail

/// Replicated data parallelism: whole model and optimizer on every rank, gradients all-reduced.
class Replicated : public DataParallelStrategy {
 public:
  explicit Replicated(dist::GradientSyncOptions options = {}) : options_(options) {}

  std::string name() const override { return "replicated"; }

  /// Broadcasts rank 0's parameters and buffers (once, in GradientSync), installs the gradient hooks and
  /// makes the optimizer over every parameter.
  void setup(StrategyContext context) override {
    require_fp32_reduce(context.reduce_dtype, name());
    model_ = context.model;
    group_ = context.group;
    detail::hold_frozen_in_compute_dtype(*model_, context.precision);
    sync_ = std::make_unique<dist::GradientSync>(context.group, *model_, options_);
    parameters_ = model_->parameters();
    optimizer_ = context.make_optimizer(detail::named_parameters_of(*model_));
  }
  torch::optim::Optimizer& optimizer() override { return *optimizer_; }
  void zero_grad() override { optimizer_->zero_grad(); }
  void set_sync(bool sync) override { sync_->set_sync(sync); }
  void finish_gradients() override { sync_->finish(); }
  torch::Tensor clip_grad_norm(double max_norm) override { return detail::clip_grad_norm(parameters_, max_norm); }
  void step() override { optimizer_->step(); }
  bool saves_per_rank() const override { return false; }

  /// Archive entries "model" (what trains and the buffers: save_trained) and "optimizer" (no pieces: every rank loads
  /// the whole state).
  void save(torch::serialize::OutputArchive& archive, PieceWriter& /*pieces*/) override {
    torch::serialize::OutputArchive model_archive, optimizer_archive;
    detail::save_trained(*model_, model_archive);
    optimizer_->save(optimizer_archive);
    archive.write("model", model_archive);
    archive.write("optimizer", optimizer_archive);
  }
  /// Reads rank 0's archive: a replicated checkpoint loads at any world size. A sharded stage's checkpoint (zero1,
  /// zero2, zero3, hsdp, of any world size) loads too: every rank reads every saved piece's overlap with its whole
  /// parameters, as a sharded stage at one rank does (train/strategies/one_rank.hpp).
  void load(const SavedStrategyState& saved) override {
    if (detail::is_sharded_checkpoint(saved.strategy)) {
      std::vector<std::string> names;
      std::vector<torch::Tensor> trainable;
      for (const auto& [parameter_name, parameter] : detail::named_parameters_of(*model_)) {
        names.push_back(parameter_name);
        trainable.push_back(parameter);
      }
      detail::load_zero_shards(saved,
                               detail::whole_parameter_view(name(), *group_, *model_, names, trainable, *optimizer_));
      return;
    }
    // "replicated", not name(): a sharded stage at one rank (ShardedAtOneRank) is this strategy under its stage's name
    detail::require(saved.strategy == "replicated", "checkpoint.strategy", saved.strategy,
                    fmt::format("the checkpoint was written by strategy '{}'; this run uses '{}', which resumes "
                                "replicated checkpoints and the sharded stages' (zero1, zero2, zero3, hsdp)",
                                saved.strategy, name()));
    auto archive = saved.open(0);
    torch::serialize::InputArchive model_archive, optimizer_archive;
    archive.read("model", model_archive);
    archive.read("optimizer", optimizer_archive);
    detail::load_module(*model_, model_archive);
    optimizer_->load(optimizer_archive);
  }

  /// The gradient synchroniser (instrumentation: buckets, launches).
  const dist::GradientSync& gradient_sync() const { return *sync_; }

 private:
  dist::GradientSyncOptions options_;
  std::shared_ptr<torch::nn::Module> model_;
  std::shared_ptr<dist::ProcessGroup> group_;
  std::unique_ptr<dist::GradientSync> sync_;
  std::vector<torch::Tensor> parameters_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

/// A Replicated strategy (for `Training::strategy(hpctrain::replicated)`).
inline std::unique_ptr<DataParallelStrategy> replicated() { return std::make_unique<Replicated>(); }

}  // namespace hpctrain
