#pragma once
// Selective recomputation (--activation-checkpointing selective, models::Recompute::selective): a checkpointed
// block (models/recompute/activation_checkpoint.hpp) still runs again in backward, but the outputs of its matrix
// products are kept from the forward and handed to the recomputation instead of being computed again; only the
// elementwise work (norms, rotary, activations, products, residual adds, dropout with its replayed random state)
// and the attention kernel run twice. torchtitan's selective AC keeps the same (its _save_list: aten.mm and the
// attention kernels) through a dispatch-mode policy, which LibTorch's C++ API does not offer; here every
// projection of the families already goes through one function, models::linear (lora_layer.hpp), which asks
// the context this file keeps:
//
//   forward (no grad)  the block runs under a recording MatrixProducts: each linear() call appends its output
//                      (and a LoRA adapter's rank-r middle, lora_A's output) in call order;
//   recomputation      the block runs again under the same MatrixProducts, replaying: linear() takes the next
//                      recorded output and returns it through ReplayedLinear, a custom autograd Function whose
//                      forward computes nothing and whose backward computes what autograd's linear backward
//                      does (grad-input g·W, grad-weight gᵀ·x, grad-bias Σg; LoRA's terms alike) from the
//                      recomputed input and the weight. No matrix product runs twice forward.
//
// Why keep products and recompute the rest: the products are the block's FLOPs (a Llama block: 2·tokens·params),
// the elementwise work is a few passes over memory; and the kept outputs are fewer bytes than what a block without
// recomputation keeps (Llama 1.1B under bf16: q, k, v, o, gate, up, down are 35.8 kB a token and layer against
// 71.7 kB kept without recomputation; the norms' inputs, SwiGLU's and rotary's operands are what is dropped).
// The attention kernel's output is not kept: replaying SDPA means calling a backend's own forward/backward pair
// (flash, efficient, math, CPU flash) with its saved statistics and random state, one per backend.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join
#include <torch/torch.h>

#include <hpctrain/error.hpp>

namespace hpctrain::models::detail {

/// The matrix products' outputs of one selective block's forward, recorded in call order and replayed in order
/// by its recomputation. Installed on this thread by MatrixProductsScope.
class MatrixProducts {
 public:
  enum class Phase { record, replay };
  /// What one linear() call computed: its output, and for a LoRA layer the adapter's middle (lora_A's output).
  struct Recorded {
    torch::Tensor output, adapter_middle;
  };

  /// The context of a selective block running on this thread in `phase`, or nullptr.
  static MatrixProducts* active(Phase phase) {
    auto* products = current();
    return products != nullptr && products->phase_ == phase ? products : nullptr;
  }

  void record(torch::Tensor output, torch::Tensor adapter_middle) {
    recorded_.push_back({std::move(output), std::move(adapter_middle)});
  }
  /// The next recorded call's products, handed over (the list no longer holds them).
  Recorded replay_next() {
    if (next_ >= recorded_.size())
      throw RuntimeError(
          errors::runtime_recompute,
          fmt::format("a selective block's recomputation made more matrix products than its forward ({}): the block "
                      "must compute the same in both runs",
                      recorded_.size()));
    return std::move(recorded_[next_++]);
  }
  /// After the recomputation: every recorded product was replayed; the list is emptied.
  void finish_replay() {
    const auto recorded = recorded_.size(), replayed = next_;
    recorded_.clear();
    next_ = 0;
    if (replayed != recorded)
      throw RuntimeError(
          errors::runtime_recompute,
          fmt::format("a selective block's recomputation replayed {} of the {} matrix products its forward made: "
                      "the block must compute the same in both runs",
                      replayed, recorded));
  }
  std::size_t recorded_count() const { return recorded_.size(); }

 private:
  friend class MatrixProductsScope;
  static MatrixProducts*& current() {
    thread_local MatrixProducts* products = nullptr;
    return products;
  }
  Phase phase_ = Phase::record;
  std::vector<Recorded> recorded_;
  std::size_t next_ = 0;
};

/// Makes `products` this thread's context in `phase` while alive (the previous one comes back after).
class MatrixProductsScope {
 public:
  MatrixProductsScope(MatrixProducts& products, MatrixProducts::Phase phase) : previous_(MatrixProducts::current()) {
    products.phase_ = phase;
    MatrixProducts::current() = &products;
  }
  ~MatrixProductsScope() { MatrixProducts::current() = previous_; }
  MatrixProductsScope(const MatrixProductsScope&) = delete;
  MatrixProductsScope& operator=(const MatrixProductsScope&) = delete;

 private:
  MatrixProducts* previous_;
};

/// A recorded output, carried to ReplayedLinear's forward as a non-tensor argument (not an input of the node).
struct RecordedOutput {
  torch::Tensor tensor;
};

/// `output` = linear(x, weight, bias) + scale · linear(middle, adapter_weight, adapter_bias), already computed by
/// the forward: returned as it is, with the gradients of both terms in backward. The adapter term is absent when
/// `middle` is. Inputs arrive cast as autocast would cast them for at::linear. (Absent tensors are nullopt: an
/// undefined tensor is no valid input of a custom Function.)
struct ReplayedLinear : torch::autograd::Function<ReplayedLinear> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const std::optional<torch::Tensor>& bias,
                               const std::optional<torch::Tensor>& middle,
                               const std::optional<torch::Tensor>& adapter_weight,
                               const std::optional<torch::Tensor>& adapter_bias, double scale, RecordedOutput output) {
    const auto or_none = [](const std::optional<torch::Tensor>& t) { return t ? *t : torch::Tensor(); };
    ctx->save_for_backward({x, weight, or_none(bias), or_none(middle), or_none(adapter_weight), or_none(adapter_bias)});
    ctx->saved_data["scale"] = scale;
    return std::move(output.tensor);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    torch::autograd::variable_list out(8);
    term(grads[0], saved, 0, out);
    // As autograd differentiates `y + z * scale`: the adapter's output gradient is g · scale, then its products.
    if (saved[3].defined()) term(grads[0] * ctx->saved_data["scale"].toDouble(), saved, 3, out);
    return out;
  }

 private:
  /// The gradients of linear(saved[first], saved[first + 1], saved[first + 2]) for the output gradient `g`, for the
  /// inputs that require one (a frozen weight, LoRA's base, gets none).
  static void term(const torch::Tensor& g, const torch::autograd::variable_list& saved, std::size_t first,
                   torch::autograd::variable_list& out) {
    const auto& x = saved[first];
    const auto& weight = saved[first + 1];
    const auto& bias = saved[first + 2];
    const auto rows = g.reshape({-1, g.size(-1)});
    if (x.requires_grad()) out[first] = g.matmul(weight);
    if (weight.requires_grad()) out[first + 1] = rows.t().mm(x.reshape({-1, x.size(-1)}));
    if (bias.defined() && bias.requires_grad()) out[first + 2] = rows.sum(0);
  }
};

/// `t` as autocast casts at::linear's arguments on `x`'s device (unchanged when autocast is off there).
inline torch::Tensor autocast_for_linear(const torch::Tensor& t, c10::DeviceType device_type) {
  if (!t.defined() || !at::autocast::is_autocast_enabled(device_type)) return t;
  return at::autocast::cached_cast(at::autocast::get_autocast_dtype(device_type), t, device_type);
}

/// Refuses a recorded `output` that is not the shape of a product of `x` with `rows` output features: the
/// recomputation does not compute what the forward did.
inline void check_replayed_shape(const torch::Tensor& x, std::int64_t rows, const torch::Tensor& output) {
  auto leading = x.sizes().vec();
  leading.back() = rows;
  if (!output.defined() || output.sizes() != torch::IntArrayRef(leading))
    throw RuntimeError(
        errors::runtime_recompute,
        fmt::format("a selective block's recomputation asks for a product of shape {} where its forward recorded {}: "
                    "the block must compute the same in both runs",
                    fmt::join(leading, "x"),
                    output.defined() ? fmt::format("{}", fmt::join(output.sizes(), "x")) : "none"));
}

/// The recorded `output` of linear(x, weight, bias) [+ scale · linear(middle, ...)], checked against the shapes the
/// recomputation brings, as the node of ReplayedLinear.
inline torch::Tensor replayed_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                     const torch::Tensor& middle, const torch::Tensor& adapter_weight,
                                     const torch::Tensor& adapter_bias, double scale, torch::Tensor output) {
  check_replayed_shape(x, weight.size(0), output);
  const auto device = x.device().type();
  const auto cast = [device](const torch::Tensor& t) -> std::optional<torch::Tensor> {
    if (!t.defined()) return std::nullopt;
    return autocast_for_linear(t, device);
  };
  return ReplayedLinear::apply(*cast(x), *cast(weight), cast(bias), cast(middle), cast(adapter_weight),
                               cast(adapter_bias), scale, RecordedOutput{std::move(output)});
}

}  // namespace hpctrain::models::detail
