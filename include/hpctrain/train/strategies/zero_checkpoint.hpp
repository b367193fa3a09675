#pragma once
// Sharded checkpoints of the ZeRO strategies, and resharding on load. Every rank writes one archive (the
// Trainer puts it in `rank-<r>.hpct` of the checkpoint directory, checksummed) holding:
//
//   zero_index       JSON: format, strategy, world_size, rank, the model's trainable parameters (name,
//                    shape, in registration order), this rank's pieces (parameter name, first element,
//                    length) and, on rank 0, the module's buffer names
//   zero_piece_<i>   piece i's values (the fp32 master shard), flat
//   zero_state_<i>   piece i's optimizer state, as the optimizer's own OptimizerParamState::serialize
//                    writes it (tensors of the piece's length are elementwise; others, like Adam's step,
//                    are per parameter and equal on every piece)
//   zero_buffer_<k>  rank 0 only: the module's k-th buffer (BatchNorm statistics; rank 0's, as Replicated)
//
// Load, at the same world size and strategy (ShardsRead::own_archive): the pieces coincide, so each rank reads
// its own archive alone — its pieces' values and optimizer state, copied bit for bit; rank 0's buffers are
// broadcast, and the strategy makes the parameters whole with the all-gather that follows its step.
// Otherwise (ShardsRead::every_archive) every saved rank's archive is read, one at a time: the full parameters
// (every rank holds them in ZeRO-1/2; ZeRO-3 keeps only what falls in its shards, never the whole model) are
// reassembled from all pieces, and the optimizer state of each piece this rank owns *now* is cut from the saved
// pieces that overlap it. Nothing in that depends on the saved world size: a checkpoint written at 4 ranks
// resumes at 2 or 3.
#include <cstdint>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <typeinfo>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/optim.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <hpctrain/dist/collectives.hpp>
#include <hpctrain/dist/flat_shards.hpp>
#include <hpctrain/dist/process_group.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/train/strategy.hpp>

namespace hpctrain::detail {

/// Version of the zero_index layout.
inline constexpr int zero_checkpoint_format = 1;

/// One piece a rank owns: where it lies in its parameter, and the tensor the optimizer steps.
struct ZeroPieceRef {
  dist::ShardPiece place;
  torch::Tensor master;
};

/// What a ZeroStrategy hands the checkpoint code: its model, parameters, pieces and optimizer.
struct ZeroShardView {
  std::string strategy;
  dist::ProcessGroup& group;
  torch::nn::Module& model;
  const std::vector<std::string>& names;
  const std::vector<torch::Tensor>& parameters;
  torch::optim::Optimizer& optimizer;
  std::vector<ZeroPieceRef> pieces;
  /// On load, where a saved piece's values go: elements [begin, begin + values.numel()) of parameter p. Unset:
  /// into `parameters[p]`, whole on every rank (ZeRO-1/2); ZeRO-3 keeps only what falls in its own shards.
  std::function<void(std::size_t parameter, std::int64_t begin, const torch::Tensor& values)> write_values;
};

inline std::string archive_name(int rank) { return fmt::format("rank-{:05d}", rank); }

/// A fresh, empty per-parameter state of `optimizer`'s type (to fill from a checkpoint).
inline std::unique_ptr<torch::optim::OptimizerParamState> make_param_state(const torch::optim::Optimizer& optimizer) {
  using namespace torch::optim;
  if (dynamic_cast<const AdamW*>(&optimizer)) return std::make_unique<AdamWParamState>();
  if (dynamic_cast<const Adam*>(&optimizer)) return std::make_unique<AdamParamState>();
  if (dynamic_cast<const SGD*>(&optimizer)) return std::make_unique<SGDParamState>();
  if (dynamic_cast<const Adagrad*>(&optimizer)) return std::make_unique<AdagradParamState>();
  if (dynamic_cast<const RMSprop*>(&optimizer)) return std::make_unique<RMSpropParamState>();
  throw SpecError("optimizer", typeid(optimizer).name(),
                  "a sharded checkpoint restores the state of torch::optim's SGD, Adam, AdamW, Adagrad and RMSprop; "
                  "this optimizer type is not one of them");
}

/// A state's entries by name (what its serialize() writes), through an in-memory archive.
inline std::map<std::string, c10::IValue> state_entries(const torch::optim::OptimizerParamState& state) {
  torch::serialize::OutputArchive out;
  state.serialize(out);
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  std::map<std::string, c10::IValue> entries;
  for (const auto& key : in.keys()) {
    c10::IValue value;
    in.read(key, value);
    entries[key] = value;
  }
  return entries;
}

/// Bytes of the tensors in one optimizer state (exp_avg, exp_avg_sq, momentum_buffer, ...).
inline std::size_t state_tensor_bytes(const torch::optim::OptimizerParamState& state) {
  std::size_t bytes = 0;
  for (const auto& [key, value] : state_entries(state))
    if (value.isTensor()) bytes += value.toTensor().nbytes();
  return bytes;
}

inline nlohmann::json shard_index(const ZeroShardView& view) {
  nlohmann::json index;
  index["format"] = zero_checkpoint_format;
  index["strategy"] = view.strategy;
  index["world_size"] = view.group.world_size();
  index["rank"] = view.group.rank();
  index["parameters"] = nlohmann::json::array();
  for (std::size_t i = 0; i < view.parameters.size(); ++i)
    index["parameters"].push_back({{"name", view.names[i]}, {"shape", view.parameters[i].sizes().vec()}});
  index["pieces"] = nlohmann::json::array();
  for (const auto& piece : view.pieces)
    index["pieces"].push_back(
        {{"parameter", view.names[piece.place.parameter]}, {"begin", piece.place.begin}, {"length", piece.place.length}});
  index["buffers"] = nlohmann::json::array();
  if (view.group.rank() == 0)
    for (const auto& buffer : view.model.named_buffers()) index["buffers"].push_back(buffer.key());
  return index;
}

/// Writes this rank's shard: index, piece values, piece optimizer state (and rank 0: the buffers).
inline void save_zero_shard(torch::serialize::OutputArchive& archive, const ZeroShardView& view) {
  archive.write("zero_index", c10::IValue(shard_index(view).dump()));
  for (std::size_t i = 0; i < view.pieces.size(); ++i) {
    const auto& master = view.pieces[i].master;
    archive.write(fmt::format("zero_piece_{}", i), master.detach());
    const auto found = view.optimizer.state().find(master.unsafeGetTensorImpl());
    if (found == view.optimizer.state().end()) continue;  // not stepped yet (or SGD without momentum)
    torch::serialize::OutputArchive state(archive.compilation_unit());
    found->second->serialize(state);
    archive.write(fmt::format("zero_state_{}", i), state);
  }
  if (view.group.rank() == 0) {
    std::size_t k = 0;
    for (const auto& buffer : view.model.named_buffers())
      archive.write(fmt::format("zero_buffer_{}", k++), buffer.value().detach(), /*is_buffer=*/true);
  }
}

/// The optimizer state of one piece this rank owns, assembled from the saved pieces that overlap it.
struct AssembledState {
  std::map<std::string, torch::Tensor> elementwise;  // key -> tensor of the piece's length
  std::map<std::string, c10::IValue> per_parameter;  // key -> value (Adam's step)
  std::int64_t covered = 0;                          // elements filled from saved states
};

/// Reads one saved rank's archive; copies its parameter values and the overlapping optimizer state.
class ShardReader {
 public:
  ShardReader(const SavedStrategyState& saved, ZeroShardView& view)
      : saved_(saved), view_(view), covered_(view.parameters.size(), 0), states_(view.pieces.size()) {
    for (std::size_t i = 0; i < view.names.size(); ++i) parameter_of_[view.names[i]] = i;
  }

  /// `own`: the archive must hold exactly this rank's pieces (the same world size and strategy).
  void read_rank(int rank, bool own = false) {
    auto archive = saved_.open(rank);
    const auto index = read_index(archive, rank);
    check_same_model(index, rank);
    if (own) check_own_pieces(index, rank);
    torch::NoGradGuard no_grad;
    const auto& pieces = index.at("pieces");
    for (std::size_t j = 0; j < pieces.size(); ++j) read_piece(archive, rank, j, pieces[j]);
    if (rank == 0) read_buffers(archive, index);
  }

  /// After this rank's own archive alone: installs its pieces' optimizer state (each piece was read whole).
  void finish_own() {
    for (std::size_t i = 0; i < view_.pieces.size(); ++i) install_state(i);
  }

  /// After every rank: checks that the archives covered every element once, installs optimizer state.
  void finish() {
    for (std::size_t p = 0; p < view_.parameters.size(); ++p) {
      if (covered_[p] != view_.parameters[p].numel()) {
        throw RuntimeError("checkpoint", fmt::format("sharded checkpoint of {} ranks: the archives hold {} of the {} "
                                                     "elements of parameter '{}' (a rank's archive is missing pieces)",
                                                     saved_.world_size, covered_[p], view_.parameters[p].numel(),
                                                     view_.names[p]));
      }
    }
    for (std::size_t i = 0; i < view_.pieces.size(); ++i) install_state(i);
  }

 private:
  nlohmann::json read_index(torch::serialize::InputArchive& archive, int rank) {
    c10::IValue text;
    if (!archive.try_read("zero_index", text) || !text.isString()) {
      throw RuntimeError("checkpoint", fmt::format("{}: no zero_index (the archive was not written by a ZeRO strategy)",
                                                   archive_name(rank)));
    }
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(text.toStringRef());
      const auto expect = [&](const char* field, const nlohmann::json& value) {
        if (index.at(field) != value)
          throw RuntimeError("checkpoint", fmt::format("{}: zero_index field '{}' is {}, expected {}", archive_name(rank),
                                                       field, index.at(field).dump(), value.dump()));
      };
      expect("format", zero_checkpoint_format);
      expect("rank", rank);
      expect("world_size", saved_.world_size);
      (void)index.at("parameters").size();
      (void)index.at("pieces").size();
    } catch (const nlohmann::json::exception& e) {
      throw RuntimeError("checkpoint", fmt::format("{}: zero_index is malformed: {}", archive_name(rank), e.what()));
    }
    return index;
  }

  /// An index from another model (other names, shapes or order of parameters) is refused, naming the first
  /// difference.
  void check_same_model(const nlohmann::json& index, int rank) {
    const auto& saved = index.at("parameters");
    const auto describe = [](const std::string& name, const std::vector<std::int64_t>& shape) {
      return fmt::format("'{}' [{}]", name, fmt::join(shape, ", "));
    };
    const std::size_t common = std::min(saved.size(), view_.parameters.size());
    for (std::size_t p = 0; p < common; ++p) {
      const auto name = saved[p].at("name").get<std::string>();
      const auto shape = saved[p].at("shape").get<std::vector<std::int64_t>>();
      const auto ours = view_.parameters[p].sizes().vec();
      if (name != view_.names[p] || shape != ours) {
        throw SpecError("checkpoint.parameters", archive_name(rank),
                        fmt::format("the checkpoint is of another model: its parameter {} is {}, this model's is {}",
                                    p, describe(name, shape), describe(view_.names[p], ours)));
      }
    }
    if (saved.size() != view_.parameters.size()) {
      throw SpecError("checkpoint.parameters", archive_name(rank),
                      fmt::format("the checkpoint is of another model: it has {} trainable parameters, this model {}",
                                  saved.size(), view_.parameters.size()));
    }
  }

  /// The saved pieces are this rank's, in order: the layout did not change (no other bucket sizes or model).
  void check_own_pieces(const nlohmann::json& index, int rank) {
    const auto& pieces = index.at("pieces");
    bool same = pieces.size() == view_.pieces.size();
    for (std::size_t j = 0; same && j < pieces.size(); ++j) {
      const auto& place = view_.pieces[j].place;
      same = pieces[j].at("parameter").get<std::string>() == view_.names[place.parameter] &&
             pieces[j].at("begin").get<std::int64_t>() == place.begin && pieces[j].at("length").get<std::int64_t>() == place.length;
    }
    if (!same)
      throw RuntimeError("checkpoint", fmt::format("{}: its {} pieces are not this rank's {} at the same world size ({}) and "
                                                   "strategy: the shard layout changed (bucket sizes?)",
                                                   archive_name(rank), pieces.size(), view_.pieces.size(), saved_.world_size));
  }

  void read_piece(torch::serialize::InputArchive& archive, int rank, std::size_t j, const nlohmann::json& entry) {
    const auto name = entry.at("parameter").get<std::string>();
    const auto begin = entry.at("begin").get<std::int64_t>();
    const auto length = entry.at("length").get<std::int64_t>();
    const auto p = parameter_of_.at(name);  // check_same_model: every saved name is ours
    const auto where = fmt::format("{}: piece {} of parameter '{}'", archive_name(rank), j, name);
    if (begin < 0 || length <= 0 || begin + length > view_.parameters[p].numel())
      throw RuntimeError("checkpoint", fmt::format("{}: elements [{}, {}) lie outside its {} elements", where, begin,
                                                   begin + length, view_.parameters[p].numel()));
    torch::Tensor values;
    if (!archive.try_read(fmt::format("zero_piece_{}", j), values) || values.numel() != length)
      throw RuntimeError("checkpoint", fmt::format("{}: zero_piece_{} is missing or not {} elements", where, j, length));
    if (view_.write_values) view_.write_values(p, begin, values.reshape({-1}));
    else view_.parameters[p].detach().reshape({-1}).narrow(0, begin, length).copy_(values.reshape({-1}));
    covered_[p] += length;

    torch::serialize::InputArchive state;
    const bool has_state = archive.try_read(fmt::format("zero_state_{}", j), state);
    if (!has_state) return;
    std::map<std::string, c10::IValue> entries;
    for (const auto& key : state.keys()) state.read(key, entries[key]);
    for (std::size_t i = 0; i < view_.pieces.size(); ++i) {
      const auto& mine = view_.pieces[i].place;
      if (mine.parameter != p) continue;
      const auto from = std::max(begin, mine.begin);
      const auto to = std::min(begin + length, mine.begin + mine.length);
      if (from >= to) continue;
      auto& assembled = states_[i];
      for (const auto& [key, value] : entries) {
        if (value.isTensor() && value.toTensor().dim() == 1 && value.toTensor().numel() == length) {
          auto& target = assembled.elementwise[key];
          if (!target.defined()) target = torch::zeros({mine.length}, value.toTensor().options());
          target.narrow(0, from - mine.begin, to - from).copy_(value.toTensor().narrow(0, from - begin, to - from));
        } else {
          assembled.per_parameter[key] = value;
        }
      }
      assembled.covered += to - from;
    }
  }

  void read_buffers(torch::serialize::InputArchive& archive, const nlohmann::json& index) {
    const auto& names = index.at("buffers");
    std::size_t k = 0;
    for (const auto& buffer : view_.model.named_buffers()) {
      if (k >= names.size() || names[k].get<std::string>() != buffer.key())
        throw SpecError("checkpoint.buffers", archive_name(0),
                        fmt::format("the checkpoint is of another model: it has no buffer '{}' at position {}",
                                    buffer.key(), k));
      torch::Tensor value;
      if (!archive.try_read(fmt::format("zero_buffer_{}", k), value, /*is_buffer=*/true))
        throw RuntimeError("checkpoint", fmt::format("{}: zero_buffer_{} ('{}') is missing", archive_name(0), k, buffer.key()));
      buffer.value().detach().copy_(value);
      ++k;
    }
  }

  void install_state(std::size_t i) {
    auto& assembled = states_[i];
    const auto& master = view_.pieces[i].master;
    auto& states = view_.optimizer.state();
    states.erase(master.unsafeGetTensorImpl());
    if (assembled.covered == 0) return;  // saved before the first step: no state yet
    if (assembled.covered != view_.pieces[i].place.length) {
      throw RuntimeError("checkpoint", fmt::format("sharded checkpoint of {} ranks: optimizer state covers {} of the {} "
                                                   "elements of this rank's piece of parameter '{}'",
                                                   saved_.world_size, assembled.covered, view_.pieces[i].place.length,
                                                   view_.names[view_.pieces[i].place.parameter]));
    }
    torch::serialize::OutputArchive out;
    for (const auto& [key, tensor] : assembled.elementwise) out.write(key, c10::IValue(tensor));
    for (const auto& [key, value] : assembled.per_parameter) out.write(key, value);
    std::stringstream bytes;
    out.save_to(bytes);
    torch::serialize::InputArchive in;
    in.load_from(bytes);
    auto state = make_param_state(view_.optimizer);
    state->serialize(in);
    states[master.unsafeGetTensorImpl()] = std::move(state);
  }

  const SavedStrategyState& saved_;
  ZeroShardView& view_;
  std::unordered_map<std::string, std::size_t> parameter_of_;
  std::vector<std::int64_t> covered_;
  std::vector<AssembledState> states_;
};

/// What load_zero_shards read, and so what the strategy still has to do.
enum class ShardsRead {
  own_archive,    ///< this rank's archive alone: its pieces (and rank 0's buffers, broadcast) are restored; the
                  ///< strategy all-gathers what it keeps whole from every rank's pieces
  every_archive,  ///< every saved archive: the full parameters (ZeRO-3: its shards), buffers and state restored
};

/// Restores this rank's pieces and optimizer state and the buffers from a sharded checkpoint written by ZeRO-1,
/// ZeRO-2, ZeRO-3 or hybrid sharding (whose replicas other than the first write archives without pieces: the
/// archives still hold every element once); collective. Written at the same world size by the same strategy
/// (not hybrid: a replica's archive holds no pieces), each rank reads its own archive alone; otherwise every
/// archive, reassembling the full parameters at any world size.
inline ShardsRead load_zero_shards(const SavedStrategyState& saved, ZeroShardView view) {
  if (saved.strategy != "zero1" && saved.strategy != "zero2" && saved.strategy != "zero3" && saved.strategy != "hsdp") {
    throw SpecError("checkpoint.strategy", saved.strategy,
                    fmt::format("this run shards with {}, which resumes checkpoints written by zero1, zero2, zero3 or hsdp (at "
                                "any world size); resume it with the strategy that wrote it",
                                view.strategy));
  }
  if (saved.world_size < 1 || !saved.open)
    throw RuntimeError("checkpoint", fmt::format("sharded checkpoint with world size {} and no archives", saved.world_size));
  ShardReader reader(saved, view);
  if (saved.world_size == view.group.world_size() && saved.strategy == view.strategy && view.strategy != "hsdp") {
    reader.read_rank(view.group.rank(), /*own=*/true);
    reader.finish_own();
    if (view.group.world_size() > 1) dist::detail::broadcast_from_rank0(view.group, view.model.buffers());
    return ShardsRead::own_archive;
  }
  for (int rank = 0; rank < saved.world_size; ++rank) reader.read_rank(rank);
  reader.finish();
  return ShardsRead::every_archive;
}

}  // namespace hpctrain::detail
