#pragma once
// Sharded checkpoints of the ZeRO strategies, and resharding on load. Every rank writes one file (the Trainer puts
// it in `rank-<r>.hpct` of the checkpoint directory, checksummed): a LibTorch archive holding
//
//   zero_index       JSON: format (2), strategy, world_size, rank, the model's trainable parameters (name,
//                    shape, in registration order), this rank's pieces (parameter name, first element, length,
//                    and the ids of its values and of its elementwise optimizer state in the pieces region) and,
//                    on rank 0, the module's buffer names
//   zero_state_<i>   piece i's optimizer state that is per parameter, not elementwise (Adam's step), under the
//                    names the optimizer's own OptimizerParamState::serialize writes (read and set field by field)
//   zero_buffer_<k>  rank 0 only: the module's k-th buffer (BatchNorm statistics; rank 0's, as Replicated)
//
// and after it the pieces region (train/checkpoint/checkpoint_pieces.hpp): each piece's values (the fp32 master shard,
// flat) and each of its elementwise state tensors (exp_avg, exp_avg_sq, ...), read back by element ranges, each chunk
// checked against its CRC-32C.
//
// Load, at any world size: each rank reads, of every saved piece, only the elements that overlap the pieces it owns
// now (values and elementwise state; the per-parameter state from the archive), into memory first. At the same world
// size and strategy the pieces coincide and each rank opens its own file alone (under hsdp with the same shard groups,
// the file of the first shard group's rank at its place, which wrote the pieces its replicas did not); otherwise it
// opens every
// saved rank's archive (small: the index, the per-parameter state, rank 0's buffers) and reads its overlap of their
// pieces. The ranks then agree that every rank read valid bytes (one all-reduce; any refusal: CheckpointRefused on
// every rank, nothing restored, and the Trainer tries the next older checkpoint) before anything is restored: the
// pieces' values and optimizer state, copied bit for bit, and rank 0's buffers, broadcast. The strategy then
// all-gathers what it keeps whole from every rank's pieces, as after a step. Nothing in that depends on the saved
// world size: a checkpoint written at 4 ranks resumes at 2 or 3, reading about 1/2 or 1/3 of it on each rank.
// A checkpoint of zero_index format 1 (before 2026-11-26: the pieces inside the archive as zero_piece_<i> tensors)
// still loads: each archive it opens is deserialised whole.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <utility>
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
#include <hpctrain/train/strategies/strategy.hpp>

namespace hpctrain::detail {

/// Version of the zero_index layout: 2, the pieces in the pieces region; 1 (still read), inside the archive.
inline constexpr int zero_checkpoint_format = 2;

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
  /// Hybrid sharding: the ranks of a shard group (consecutive ranks; the first group's write the pieces); 0 otherwise.
  int shard_group = 0;
  /// On load, where a saved piece's values go: elements [begin, begin + values.numel()) of parameter p, all within
  /// one of this rank's pieces. Unset: into `parameters[p]` (ZeRO-1/2); ZeRO-3 writes into its shards.
  std::function<void(std::size_t parameter, std::int64_t begin, const torch::Tensor& values)> write_values;
};

inline std::string archive_name(int rank) { return fmt::format("rank-{:05d}", rank); }

/// Whether a checkpoint's strategy wrote this format (the sharded stages; ShardedAtOneRank writes its stage's name).
inline bool is_sharded_checkpoint(const std::string& strategy) {
  return strategy == "zero1" || strategy == "zero2" || strategy == "zero3" || strategy == "hsdp";
}

/// The view of a run that keeps every trainable parameter whole (ShardedAtOneRank; Replicated reading a sharded
/// checkpoint): one piece per parameter, the whole of it, which the optimizer steps itself.
inline ZeroShardView whole_parameter_view(std::string strategy, dist::ProcessGroup& group, torch::nn::Module& model,
                                          const std::vector<std::string>& names,
                                          const std::vector<torch::Tensor>& parameters,
                                          torch::optim::Optimizer& optimizer) {
  ZeroShardView view{std::move(strategy), group, model, names, parameters, optimizer, {}, 0, {}};
  for (std::size_t p = 0; p < parameters.size(); ++p)
    view.pieces.push_back({dist::ShardPiece{p, 0, parameters[p].numel(), 0}, parameters[p]});
  return view;
}

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

/// Calls `visit(name, field)` for each field of `state` (an int64_t& or a torch::Tensor&), by the names its
/// serialize() writes: the tensors are read and set in place, never through an archive (which would copy each
/// moment twice in host memory at a save and three times at a resume). The types make_param_state makes.
template <class Visit>
void for_each_state_field(torch::optim::OptimizerParamState& state, Visit&& visit) {
  using namespace torch::optim;
  const auto adam = [&](auto& s) {
    visit("step", s.step());
    visit("exp_avg", s.exp_avg());
    visit("exp_avg_sq", s.exp_avg_sq());
    visit("max_exp_avg_sq", s.max_exp_avg_sq());
  };
  if (auto* s = dynamic_cast<AdamWParamState*>(&state)) return adam(*s);
  if (auto* s = dynamic_cast<AdamParamState*>(&state)) return adam(*s);
  if (auto* s = dynamic_cast<SGDParamState*>(&state)) return visit("momentum_buffer", s->momentum_buffer());
  if (auto* s = dynamic_cast<AdagradParamState*>(&state)) {
    visit("sum", s->sum());
    return visit("step", s->step());
  }
  if (auto* s = dynamic_cast<RMSpropParamState*>(&state)) {
    visit("step", s->step());
    visit("square_avg", s->square_avg());
    visit("momentum_buffer", s->momentum_buffer());
    return visit("grad_avg", s->grad_avg());
  }
  throw SpecError("optimizer", typeid(state).name(),
                  "a sharded checkpoint saves the state of torch::optim's SGD, Adam, AdamW, Adagrad and RMSprop; "
                  "this state type is not one of theirs");
}

/// A state's entries by name, as its serialize() writes them (no undefined tensor); the tensors are the state's own.
inline std::map<std::string, c10::IValue> state_entries(torch::optim::OptimizerParamState& state) {
  std::map<std::string, c10::IValue> entries;
  for_each_state_field(state, [&](const char* name, const auto& field) {
    if constexpr (std::is_same_v<std::decay_t<decltype(field)>, torch::Tensor>) {
      if (field.defined()) entries[name] = field;
    } else {
      entries[name] = field;
    }
  });
  return entries;
}

/// Whether a state entry is elementwise over a piece of `length` elements (Adam's moments), not per parameter. A
/// piece that is a whole parameter (ShardedAtOneRank's) has its state in the parameter's shape: written flat.
inline bool elementwise_entry(const c10::IValue& value, std::int64_t length) {
  return value.isTensor() && value.toTensor().defined() && value.toTensor().dim() >= 1 &&
         value.toTensor().numel() == length;
}

/// Bytes of the tensors in one optimizer state (exp_avg, exp_avg_sq, momentum_buffer, ...).
inline std::size_t state_tensor_bytes(torch::optim::OptimizerParamState& state) {
  std::size_t bytes = 0;
  for (const auto& [key, value] : state_entries(state))
    if (value.isTensor()) bytes += value.toTensor().nbytes();
  return bytes;
}

/// Writes this rank's shard: its index, per-parameter state (and rank 0: the buffers) into `archive`; the pieces'
/// values and elementwise state into `pieces`.
inline void save_zero_shard(torch::serialize::OutputArchive& archive, PieceWriter& pieces, const ZeroShardView& view) {
  nlohmann::json index;
  index["format"] = zero_checkpoint_format;
  index["strategy"] = view.strategy;
  index["world_size"] = view.group.world_size();
  index["rank"] = view.group.rank();
  if (view.shard_group > 0) index["shard_group"] = view.shard_group;  // where an hsdp resume finds its own pieces
  index["parameters"] = nlohmann::json::array();
  for (std::size_t i = 0; i < view.parameters.size(); ++i)
    index["parameters"].push_back({{"name", view.names[i]}, {"shape", view.parameters[i].sizes().vec()}});
  index["pieces"] = nlohmann::json::array();
  for (std::size_t i = 0; i < view.pieces.size(); ++i) {
    const auto& piece = view.pieces[i];
    nlohmann::json entry{{"parameter", view.names[piece.place.parameter]},
                         {"begin", piece.place.begin},
                         {"length", piece.place.length},
                         {"values", pieces.add(piece.master)},
                         {"state", nlohmann::json::object()}};
    const auto found = view.optimizer.state().find(piece.master.unsafeGetTensorImpl());
    if (found != view.optimizer.state().end()) {  // else not stepped yet (or SGD without momentum)
      torch::serialize::OutputArchive per_parameter(archive.compilation_unit());
      for (const auto& [key, value] : state_entries(*found->second)) {
        if (elementwise_entry(value, piece.place.length)) entry["state"][key] = pieces.add(value.toTensor());
        else per_parameter.write(key, value);
      }
      archive.write(fmt::format("zero_state_{}", i), per_parameter);
      entry["has_state"] = true;
    }
    index["pieces"].push_back(std::move(entry));
  }
  index["buffers"] = nlohmann::json::array();
  if (view.group.rank() == 0) {
    std::size_t k = 0;
    for (const auto& buffer : view.model.named_buffers()) {
      index["buffers"].push_back(buffer.key());
      archive.write(fmt::format("zero_buffer_{}", k++), buffer.value().detach(), /*is_buffer=*/true);
    }
  }
  archive.write("zero_index", c10::IValue(index.dump()));
}

/// What a load reads for one piece this rank owns, before anything is restored: its values and optimizer state,
/// assembled from the saved pieces that overlap it.
struct StagedPiece {
  torch::Tensor values;                              // the piece's length, on the CPU
  std::int64_t values_covered = 0;                   // elements filled from saved pieces
  std::map<std::string, torch::Tensor> elementwise;  // key -> tensor of the piece's length
  std::map<std::string, c10::IValue> per_parameter;  // key -> value (Adam's step)
  std::int64_t state_covered = 0;                    // elements filled from saved states
};

/// One saved piece as a load reads it: where it lies, and how to read element ranges of its values and state.
struct SavedPiece {
  std::size_t parameter = 0;
  std::int64_t begin = 0, length = 0;
  std::function<torch::Tensor(std::int64_t from, std::int64_t count)> values;
  std::map<std::string, std::function<torch::Tensor(std::int64_t from, std::int64_t count)>> elementwise;
  std::map<std::string, c10::IValue> per_parameter;
  bool has_state = false;
};

/// Reads saved ranks' files into this rank's staged pieces (nothing restored until install()).
class ShardReader {
 public:
  ShardReader(const SavedStrategyState& saved, ZeroShardView& view)
      : saved_(saved), view_(view), staged_(view.pieces.size()) {
    for (std::size_t i = 0; i < view.names.size(); ++i) parameter_of_[view.names[i]] = i;
    for (std::size_t i = 0; i < view.pieces.size(); ++i)
      staged_[i].values =
          torch::empty({view.pieces[i].place.length}, view.pieces[i].master.options().device(torch::kCPU));
  }

  /// Reads rank `rank`'s overlap with this rank's pieces. `own`: the archive must hold exactly this rank's pieces
  /// (the same world size and strategy).
  void read_rank(int rank) {
    auto archive = saved_.open(rank);
    read_pieces(archive, read_index(archive, rank), rank, /*own=*/false);
  }

  /// Reads rank `rank`'s file as holding exactly this rank's pieces (own_pieces_file); false, having read nothing
  /// more than its index, when the index says its hsdp shard groups were not this run's (then every file's overlap is
  /// read instead).
  bool read_own(int rank) {
    auto archive = saved_.open(rank);
    const auto index = read_index(archive, rank);
    if (view_.shard_group > 0 && index.value("shard_group", 0) != view_.shard_group) return false;
    read_pieces(archive, index, rank, /*own=*/true);
    return true;
  }

  /// Checks that the saved pieces covered every element of this rank's pieces once (and their state, if any).
  void check_covered() const {
    for (std::size_t i = 0; i < view_.pieces.size(); ++i) {
      const auto& place = view_.pieces[i].place;
      const auto& staged = staged_[i];
      if (staged.values_covered != place.length)
        throw RuntimeError(
            errors::runtime_checkpoint,
            fmt::format("sharded checkpoint of {} ranks: the archives hold {} of the {} elements of this "
                        "rank's piece [{}, {}) of parameter '{}' (a rank's archive is missing pieces)",
                        saved_.world_size, staged.values_covered, place.length, place.begin, place.begin + place.length,
                        view_.names[place.parameter]));
      if (staged.state_covered != 0 && staged.state_covered != place.length)
        throw RuntimeError(
            errors::runtime_checkpoint,
            fmt::format("sharded checkpoint of {} ranks: optimizer state covers {} of the {} "
                        "elements of this rank's piece of parameter '{}'",
                        saved_.world_size, staged.state_covered, place.length, view_.names[place.parameter]));
      if (staged.state_covered != 0) check_state_integers(i);
    }
  }

  /// The integer fields of the optimizer's state (Adam's step) were read for piece `i`: without them the state would
  /// restart its bias correction, silently.
  void check_state_integers(std::size_t i) const {
    auto probe = make_param_state(view_.optimizer);
    for_each_state_field(*probe, [&](const char* name, const auto& field) {
      if constexpr (!std::is_same_v<std::decay_t<decltype(field)>, torch::Tensor>) {
        const auto found = staged_[i].per_parameter.find(name);
        if (found == staged_[i].per_parameter.end() || !found->second.isInt())
          throw RuntimeError(errors::runtime_checkpoint,
                             fmt::format("sharded checkpoint of {} ranks: the optimizer state of this rank's piece "
                                         "of parameter '{}' has no integer '{}'",
                                         saved_.world_size, view_.names[view_.pieces[i].place.parameter], name));
      }
    });
  }

  /// Restores what was read: the pieces' values and optimizer state, the buffers (rank 0's, where read).
  void install() {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < view_.pieces.size(); ++i) {
      const auto& place = view_.pieces[i].place;
      if (view_.write_values) view_.write_values(place.parameter, place.begin, staged_[i].values);
      else
        view_.parameters[place.parameter]
            .detach()
            .reshape({-1})
            .narrow(0, place.begin, place.length)
            .copy_(staged_[i].values);
      // Each piece's staging freed once installed: a load holds one copy of what it read at most.
      staged_[i].values = torch::Tensor();
      install_state(i);
    }
    std::size_t k = 0;
    for (const auto& buffer : view_.model.named_buffers())
      if (k < buffers_.size()) buffer.value().detach().copy_(buffers_[k++]);
  }

 private:
  void read_pieces(torch::serialize::InputArchive& archive, const nlohmann::json& index, int rank, bool own) {
    check_same_model(index, rank);
    if (own) check_own_pieces(index, rank);
    torch::NoGradGuard no_grad;
    const auto& pieces = index.at("pieces");
    for (std::size_t j = 0; j < pieces.size(); ++j) {
      const auto saved = saved_piece(archive, index, rank, j);
      for (std::size_t i = 0; i < view_.pieces.size(); ++i) read_overlap(saved, i);
    }
    if (rank == 0) read_buffers(archive, index);
  }

  /// Rank `rank`'s file as the messages name it (its path; the archive's name where the checkpoint has no files).
  std::string file_name(int rank) const { return saved_.file ? saved_.file(rank) : archive_name(rank); }

  nlohmann::json read_index(torch::serialize::InputArchive& archive, int rank) {
    c10::IValue text;
    if (!archive.try_read("zero_index", text) || !text.isString()) {
      throw RuntimeError(
          errors::runtime_checkpoint,
          fmt::format("{}: no zero_index (the archive was not written by a ZeRO strategy)", file_name(rank)));
    }
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(text.toStringRef());
      const auto expect = [&](const char* field, const nlohmann::json& value) {
        if (index.at(field) != value)
          throw RuntimeError(errors::runtime_checkpoint,
                             fmt::format("{}: zero_index field '{}' is {}, expected {}", file_name(rank), field,
                                         index.at(field).dump(), value.dump()));
      };
      if (index.at("format") != 1) expect("format", zero_checkpoint_format);
      expect("rank", rank);
      expect("world_size", saved_.world_size);
      (void)index.at("parameters").size();
      (void)index.at("pieces").size();
    } catch (const nlohmann::json::exception& e) {
      throw RuntimeError(errors::runtime_checkpoint,
                         fmt::format("{}: zero_index is malformed: {}", file_name(rank), e.what()));
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
        throw SpecError("checkpoint.parameters", file_name(rank),
                        fmt::format("the checkpoint is of another model: its parameter {} is {}, this model's is {}", p,
                                    describe(name, shape), describe(view_.names[p], ours)));
      }
    }
    if (saved.size() != view_.parameters.size()) {
      throw SpecError("checkpoint.parameters", file_name(rank),
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
             pieces[j].at("begin").get<std::int64_t>() == place.begin &&
             pieces[j].at("length").get<std::int64_t>() == place.length;
    }
    if (!same)
      throw RuntimeError(errors::runtime_checkpoint,
                         fmt::format("{}: its {} pieces are not this rank's {} at the same world size ({}) and "
                                     "strategy: the shard layout changed (bucket sizes?)",
                                     file_name(rank), pieces.size(), view_.pieces.size(), saved_.world_size));
  }

  /// Saved piece `j` of rank `rank`: checked, with readers of its values and state (format 2: element ranges of the
  /// pieces region; format 1: the archive's whole tensors).
  SavedPiece saved_piece(torch::serialize::InputArchive& archive, const nlohmann::json& index, int rank,
                         std::size_t j) {
    const auto& entry = index.at("pieces")[j];
    SavedPiece piece;
    const auto name = entry.at("parameter").get<std::string>();
    piece.parameter = parameter_of_.at(name);  // check_same_model: every saved name is ours
    piece.begin = entry.at("begin").get<std::int64_t>();
    piece.length = entry.at("length").get<std::int64_t>();
    const auto where = fmt::format("{}: piece {} of parameter '{}'", file_name(rank), j, name);
    if (piece.begin < 0 || piece.length <= 0 || piece.begin + piece.length > view_.parameters[piece.parameter].numel())
      throw RuntimeError(errors::runtime_checkpoint,
                         fmt::format("{}: elements [{}, {}) lie outside its {} elements", where, piece.begin,
                                     piece.begin + piece.length, view_.parameters[piece.parameter].numel()));
    torch::serialize::InputArchive state;
    const bool has_archive_state = archive.try_read(fmt::format("zero_state_{}", j), state);
    if (index.at("format") == 1) {  // the piece and its whole state inside the archive
      torch::Tensor values;
      if (!archive.try_read(fmt::format("zero_piece_{}", j), values) || values.numel() != piece.length)
        throw RuntimeError(errors::runtime_checkpoint,
                           fmt::format("{}: zero_piece_{} is missing or not {} elements", where, j, piece.length));
      piece.values = [values = values.reshape({-1})](std::int64_t from, std::int64_t count) {
        return values.narrow(0, from, count);
      };
      if (!has_archive_state) return piece;
      piece.has_state = true;
      for (const auto& key : state.keys()) {
        c10::IValue value;
        state.read(key, value);
        if (elementwise_entry(value, piece.length))
          piece.elementwise[key] = [tensor = value.toTensor()](std::int64_t from, std::int64_t count) {
            return tensor.narrow(0, from, count);
          };
        else piece.per_parameter[key] = value;
      }
      return piece;
    }
    const auto range = [&](const nlohmann::json& id, const std::string& what) {
      if (!id.is_number_integer())
        throw RuntimeError(errors::runtime_checkpoint,
                           fmt::format("{}: its {} is {}, not a piece id", where, what, id.dump()));
      if (!saved_.read_piece)
        throw RuntimeError(errors::runtime_checkpoint,
                           fmt::format("{}: the checkpoint's files have no pieces region", where));
      return [read = saved_.read_piece, rank, id = id.get<std::int64_t>()](std::int64_t from, std::int64_t count) {
        return read(rank, id, from, count);  // beyond the stored piece's elements: refused, naming the file
      };
    };
    piece.values = range(entry.at("values"), "values");
    piece.has_state = entry.value("has_state", false);
    for (const auto& [key, id] : entry.at("state").items()) piece.elementwise[key] = range(id, key);
    if (has_archive_state)
      for (const auto& key : state.keys()) state.read(key, piece.per_parameter[key]);
    return piece;
  }

  /// Reads the overlap of saved piece `saved` with this rank's piece `i` into its staged values and state.
  void read_overlap(const SavedPiece& saved, std::size_t i) {
    const auto& mine = view_.pieces[i].place;
    if (mine.parameter != saved.parameter) return;
    const auto from = std::max(saved.begin, mine.begin);
    const auto to = std::min(saved.begin + saved.length, mine.begin + mine.length);
    if (from >= to) return;
    auto& staged = staged_[i];
    staged.values.narrow(0, from - mine.begin, to - from).copy_(saved.values(from - saved.begin, to - from));
    staged.values_covered += to - from;
    if (!saved.has_state) return;
    for (const auto& [key, read] : saved.elementwise) {
      auto part = read(from - saved.begin, to - from);
      auto& target = staged.elementwise[key];
      // Not zero-filled: check_covered() proves every element written (a state covers the piece whole or not at all).
      if (!target.defined()) target = torch::empty({mine.length}, part.options());
      target.narrow(0, from - mine.begin, to - from).copy_(part);
    }
    for (const auto& [key, value] : saved.per_parameter) staged.per_parameter[key] = value;
    staged.state_covered += to - from;
  }

  void read_buffers(torch::serialize::InputArchive& archive, const nlohmann::json& index) {
    const auto& names = index.at("buffers");
    std::size_t k = 0;
    buffers_.clear();
    for (const auto& buffer : view_.model.named_buffers()) {
      if (k >= names.size() || names[k].get<std::string>() != buffer.key())
        throw SpecError(
            "checkpoint.buffers", file_name(0),
            fmt::format("the checkpoint is of another model: it has no buffer '{}' at position {}", buffer.key(), k));
      torch::Tensor value;
      if (!archive.try_read(fmt::format("zero_buffer_{}", k), value, /*is_buffer=*/true))
        throw RuntimeError(errors::runtime_checkpoint,
                           fmt::format("{}: zero_buffer_{} ('{}') is missing", file_name(0), k, buffer.key()));
      buffers_.push_back(value);
      ++k;
    }
  }

  /// Sets piece `i`'s optimizer state from what was read, field by field (the staged tensors become the state's on
  /// the CPU, are copied to the device elsewhere), and frees the staging.
  void install_state(std::size_t i) {
    auto& staged = staged_[i];
    const auto& master = view_.pieces[i].master;
    auto& states = view_.optimizer.state();
    states.erase(master.unsafeGetTensorImpl());
    if (staged.state_covered == 0) return;  // saved before the first step: no state yet
    auto state = make_param_state(view_.optimizer);
    for_each_state_field(*state, [&](const char* name, auto& field) {
      if constexpr (std::is_same_v<std::decay_t<decltype(field)>, torch::Tensor>) {
        const auto found = staged.elementwise.find(name);
        if (found != staged.elementwise.end())  // in the master's shape (a whole parameter's, at one rank)
          field = std::exchange(found->second, torch::Tensor()).to(master.device()).view(master.sizes());
        else if (const auto whole = staged.per_parameter.find(name);
                 whole != staged.per_parameter.end() && whole->second.isTensor())
          field = whole->second.toTensor().to(master.device());
      } else {
        field = staged.per_parameter.at(name).toInt();  // check_covered: present, an integer
      }
    });
    states[master.unsafeGetTensorImpl()] = std::move(state);
  }

  const SavedStrategyState& saved_;
  ZeroShardView& view_;
  std::unordered_map<std::string, std::size_t> parameter_of_;
  std::vector<StagedPiece> staged_;
  std::vector<torch::Tensor> buffers_;
};

/// The rank whose file holds exactly this rank's pieces, when one may: at the same world size and strategy, its own
/// (ZeRO), or under hsdp the file of the rank in the first shard group at its place, which wrote the pieces its
/// replicas did not (if the saved shard groups were this run's). nullopt: every file's overlap is read.
inline std::optional<int> own_pieces_file(const SavedStrategyState& saved, const ZeroShardView& view) {
  const int rank = view.group.rank(), world = view.group.world_size();
  if (saved.world_size != world || saved.strategy != view.strategy || world == 1) return std::nullopt;
  if (view.strategy != "hsdp") return rank;
  if (view.shard_group <= 0) return std::nullopt;
  return rank % view.shard_group;  // ShardReader::read_own checks the saved groups in the file's index
}

/// Restores this rank's pieces (values and optimizer state) and the buffers from a sharded checkpoint written by
/// ZeRO-1, ZeRO-2, ZeRO-3 or hybrid sharding (whose replicas other than the first write archives without pieces),
/// at any world size; collective. Each rank reads only its overlap (the header's comment); the ranks agree before
/// anything is restored (CheckpointRefused on every rank when any read invalid bytes). The strategy then makes whole
/// what it keeps whole from every rank's pieces (an all-gather, as after a step).
inline void load_zero_shards(const SavedStrategyState& saved, ZeroShardView view) {
  if (!is_sharded_checkpoint(saved.strategy)) {
    throw SpecError(
        "checkpoint.strategy", saved.strategy,
        fmt::format("this run shards with {}, which resumes checkpoints written by zero1, zero2, zero3 or hsdp (at "
                    "any world size); resume it with the strategy that wrote it",
                    view.strategy));
  }
  if (saved.world_size < 1 || !saved.open)
    throw RuntimeError(errors::runtime_checkpoint,
                       fmt::format("sharded checkpoint with world size {} and no archives", saved.world_size));
  ShardReader reader(saved, view);
  std::optional<RuntimeError> refused;
  try {
    // At one rank the general path reads the same one archive, and takes any layout of its pieces (FSDP's flat
    // buckets, or ShardedAtOneRank's whole parameters).
    const auto own = own_pieces_file(saved, view);
    if (!own || !reader.read_own(*own))  // where the pieces coincide, one file; else every file's overlap
      for (int rank = 0; rank < saved.world_size; ++rank) reader.read_rank(rank);
    reader.check_covered();
  } catch (const RuntimeError& error) {
    refused = error;
  }
  const double refusals =
      view.group.world_size() > 1 ? dist::all_reduce_sum(view.group, refused ? 1.0 : 0.0) : (refused ? 1.0 : 0.0);
  if (refusals > 0) {
    if (refused) throw CheckpointRefused(*refused, /*found_here=*/true);
    throw CheckpointRefused(RuntimeError(errors::runtime_checkpoint,
                                         fmt::format("{} of {} ranks found the checkpoint's pieces they read invalid "
                                                     "(their messages name the files)",
                                                     refusals, view.group.world_size())),
                            /*found_here=*/false);
  }
  reader.install();
  if (view.group.world_size() > 1) dist::detail::broadcast_from_rank0(view.group, view.model.buffers());
}

}  // namespace hpctrain::detail
