#pragma once
// What the Training's optimizer factory takes and makes, apart from the strategy seam that calls it
// (train/strategy.hpp, which parses c10d's process group): a program's description needs only these.
#include <functional>
#include <memory>
#include <string>
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

}  // namespace hpctrain
