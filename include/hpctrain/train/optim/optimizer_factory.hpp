#pragma once
// What the Training's optimizer factory takes and makes, apart from the strategy seam that calls it
// (train/strategies/strategy.hpp, which parses c10d's process group): a program's description needs only these.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

namespace hpctrain {

/// Parameters by their dotted names (`module.named_parameters()` order): what the optimizer factory gets,
/// so a recipe can exclude biases and norms from weight decay. A sharded strategy passes its shards under
/// the names of the parameters they belong to.
using NamedParameters = std::vector<std::pair<std::string, torch::Tensor>>;

/// Makes the optimizer over the tensors one rank updates.
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(const NamedParameters&)>;

namespace detail {
/// While a sharded strategy's optimizer factory runs: the dimensions of the parameters its flat pieces belong to, by
/// the piece's TensorImpl (ZeRO's pieces are 1-D, whatever their parameter's shape). Null otherwise.
inline thread_local const std::unordered_map<const void*, std::int64_t>* dimensions_of_pieces = nullptr;

/// The dimensions `tensor` has as a parameter: its own, or, for a sharded strategy's piece, its parameter's.
inline std::int64_t parameter_dimensions(const torch::Tensor& tensor) {
  if (dimensions_of_pieces != nullptr) {
    const auto found = dimensions_of_pieces->find(tensor.unsafeGetTensorImpl());
    if (found != dimensions_of_pieces->end()) return found->second;
  }
  return tensor.dim();
}

/// `make_optimizer(pieces)` for flat pieces of parameters of `dimensions` (one each, in order): a recipe that decays
/// by shape (weight_decay_groups: matrices decay, 1-D tensors do not) decays a piece as its parameter. Without it a
/// ZeRO run decayed nothing (every piece is 1-D) and left Replicated's loss curve (2e-3 relative in 40 steps of
/// tests/dist/programs/reshard_training.cpp).
inline std::unique_ptr<torch::optim::Optimizer> make_optimizer_over_pieces(
    const OptimizerFactory& make_optimizer, const NamedParameters& pieces,
    const std::vector<std::int64_t>& dimensions) {
  std::unordered_map<const void*, std::int64_t> dims;
  for (std::size_t i = 0; i < pieces.size() && i < dimensions.size(); ++i)
    dims[pieces[i].second.unsafeGetTensorImpl()] = dimensions[i];
  struct Scope {
    explicit Scope(const std::unordered_map<const void*, std::int64_t>* dims) { dimensions_of_pieces = dims; }
    ~Scope() { dimensions_of_pieces = nullptr; }
  } scope(&dims);
  return make_optimizer(pieces);
}

/// The same for a sharded strategy's `pieces` (each with `place.parameter`, the index of its parameter in `names`, and
/// `master`, the flat tensor the optimizer steps): each piece named as its parameter, with the dimensions
/// `dimensions_of(parameter index)` gives.
template <typename Pieces, typename DimensionsOf>
std::unique_ptr<torch::optim::Optimizer> make_optimizer_over_pieces(const OptimizerFactory& make_optimizer,
                                                                    const Pieces& pieces,
                                                                    const std::vector<std::string>& names,
                                                                    DimensionsOf dimensions_of) {
  NamedParameters named;
  std::vector<std::int64_t> dimensions;
  for (const auto& piece : pieces) {
    named.emplace_back(names[piece.place.parameter], piece.master);
    dimensions.push_back(dimensions_of(piece.place.parameter));
  }
  return make_optimizer_over_pieces(make_optimizer, named, dimensions);
}
}  // namespace detail

}  // namespace hpctrain
