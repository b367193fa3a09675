#pragma once
// A model's parameters as a sharded strategy hands them out one unit at a time (a block, an edge, a group of small
// parameters, each gathered whole while it is visited): what an export reads instead of the whole model.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

namespace hpctrain::models {

/// A parameter as an export plans it before any value is gathered: its name in the module and its whole shape.
struct ParameterShape {
  std::string name;
  std::vector<std::int64_t> shape;
};

/// Parameters of one unit of a model, whole, by their names in the module (`named_parameters()` keys).
using NamedUnit = std::vector<std::pair<std::string, torch::Tensor>>;
/// Calls `visit` with each unit of a model in turn; the tensors are valid only during the call.
using UnitVisitor = std::function<void(const NamedUnit&)>;

/// The parameters of `module` as they are, whole, in one unit (a module that is not sharded).
inline NamedUnit whole_unit(torch::nn::Module& module) {
  NamedUnit unit;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    unit.emplace_back(item.key(), item.value().detach());
  return unit;
}

/// Shapes of `unit`'s parameters, in its order.
inline std::vector<ParameterShape> shapes_of(const NamedUnit& unit) {
  std::vector<ParameterShape> shapes;
  for (const auto& [name, tensor] : unit) shapes.push_back({name, tensor.sizes().vec()});
  return shapes;
}

}  // namespace hpctrain::models
