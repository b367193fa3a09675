#pragma once
// The head and the cross entropy a chunk of tokens at a time, as Liger's fused linear cross-entropy and
// torchtitan's chunked loss do: the logits of `chunk` tokens exist at once, never the whole tokens ×
// vocabulary (Llama 3's vocabulary of 128,256 words: 4 GiB of fp32 logits for 8 × 1024 tokens, and as much
// again for their gradient). The forward computes each chunk's loss and, when gradients are wanted, its
// gradients with respect to the hidden states and the head's weight right away (the gradient of the logits
// is softmax − one-hot, which needs nothing else), so backward only scales them: no logits are kept or
// recomputed. The operands are the whole-logits path's (lm/loss.hpp): the head's product takes them in
// autocast's dtype (else the weight's), the softmax and the loss run in fp32, the gradients' products take the
// logits' gradient in the operands' dtype. Unlike that path, every product writes its result in fp32 straight away
// (models::detail::product_into: cuBLAS's fp32 result on CUDA), so the logits and the gradients are not rounded to
// bf16, and no cast kernel reads the logits to widen them. The loss's weight of a row (1, or 0 for an ignored
// target) scales that row of the [chunk, width] gradients instead of the [chunk, vocabulary] one: a pass over the
// chunk's logits fewer. On CUDA with bf16 or fp16 products, one row kernel computes a chunk's loss and its logits'
// gradient (models/kernels/cross_entropy_rows.hpp: two reads of the logits and one write of the gradient, where the
// operations make five passes), and zeroes the ignored rows itself. Equal in fp32 within reassociation
// (tests/lm/lm_step_test.cpp). Logits soft-capped by the model (Gemma 2: cap·tanh(z / cap)) are capped in fp32 per
// chunk, and the gradient taken through the cap: dz = d(capped) · (1 − (capped / cap)²).
#include <cstdint>
#include <utility>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <hpctrain/models/kernels/cross_entropy_rows.hpp>
#include <hpctrain/models/kernels/mixed_precision_products.hpp>

namespace hpctrain::lm {

namespace detail {

/// The dtype of the head's products on `device`: autocast's where it is on, else the weight's.
inline c10::ScalarType head_product_dtype(const torch::Device& device, c10::ScalarType weight) {
  return at::autocast::is_autocast_enabled(device.type()) ? at::autocast::get_autocast_dtype(device.type()) : weight;
}

struct ChunkedLinearCrossEntropy : torch::autograd::Function<ChunkedLinearCrossEntropy> {
  /// hidden [N, H], weight [V, H], targets [N] (`ignore` where no loss counts): the summed loss (fp32, 0-dim).
  /// `hidden_gradient`, `weight_gradient`: whether autograd will want each (decided before the call: inside,
  /// grad mode is off); a frozen head (LoRA) costs no product for its gradient. `softcap` > 0: the logits capped.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor hidden, torch::Tensor weight,
                               torch::Tensor targets, std::int64_t chunk, std::int64_t ignore, bool hidden_gradient,
                               bool weight_gradient, double softcap) {
    const auto compute = head_product_dtype(hidden.device(), weight.scalar_type());
    // The casts below are the ones autocast would make; it must not make them again.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto w = weight.to(compute);  // once for every chunk
    const auto n = hidden.size(0);
    auto loss = torch::zeros({}, hidden.options().dtype(torch::kFloat32));
    const bool with_gradients = hidden_gradient || weight_gradient;
    torch::Tensor grad_hidden, grad_weight;
    if (hidden_gradient) grad_hidden = torch::empty_like(hidden);
    for (std::int64_t start = 0; start < n; start += chunk) {
      const auto rows = std::min(chunk, n - start);
      const auto h = hidden.narrow(0, start, rows).to(compute);
      // [rows, V]: the logits in fp32 from the product, their loss, and dloss/dz = softmax(z) - onehot(target).
      auto logits = models::detail::product_into(h, w.t(), torch::kFloat32);
      if (softcap > 0.0) logits = logits.div_(softcap).tanh_().mul_(softcap);
      auto part = models::detail::cross_entropy_fastest(logits, targets.narrow(0, start, rows), ignore, compute,
                                                        with_gradients);
      loss.add_(part.loss);
      if (!with_gradients) continue;
      if (softcap > 0.0)  // through the cap: 1 - tanh² = 1 - (capped / cap)² (the capped logits' last use)
        part.gradient.mul_(logits.div_(softcap).square_().neg_().add_(1.0));
      // Where the gradient's ignored rows are not zeroed, the rows' weights (0 or 1: exact) scale the [rows, H]
      // factors and results instead.
      const auto& g = part.gradient;
      const bool weighted = part.row_weights.defined();
      if (hidden_gradient) {
        auto rows_gradient = grad_hidden.narrow(0, start, rows);
        const auto product = models::detail::product_into(g, w, hidden.scalar_type());
        if (weighted) torch::mul_out(rows_gradient, product, part.row_weights);
        else rows_gradient.copy_(product);
      }
      if (weight_gradient) {
        auto product =
            models::detail::product_into(g.t(), weighted ? h * part.row_weights.to(compute) : h, torch::kFloat32);
        grad_weight = grad_weight.defined() ? grad_weight.add_(product) : std::move(product);
      }
    }
    if (weight_gradient && !grad_weight.defined()) grad_weight = torch::zeros_like(weight, torch::kFloat32);  // no rows
    if (hidden_gradient) ctx->saved_data["grad_hidden"] = grad_hidden;
    if (weight_gradient) ctx->saved_data["grad_weight"] = grad_weight.to(weight.scalar_type());
    return loss;
  }

  /// The gradients computed in forward, scaled in place by the loss's own (1 / count for a mean, 1 /
  /// accumulation) and handed over: no second weight-sized tensor at the backward's peak. A second backward
  /// through the same loss (retain_graph) finds them gone and fails rather than scaling twice.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto scaled = [&](const char* name) {
      if (ctx->saved_data.count(name) == 0) return torch::Tensor();
      auto gradient = ctx->saved_data[name].toTensor();
      TORCH_CHECK(gradient.defined(), "chunked_token_loss_sum: backward ran twice through the same loss");
      ctx->saved_data[name] = torch::Tensor();
      return gradient.mul_(grads[0]);
    };
    return {scaled("grad_hidden"), scaled("grad_weight"), torch::Tensor(), torch::Tensor(),
            torch::Tensor(),       torch::Tensor(),       torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace detail

/// {the summed cross entropy of logits = hidden · weightᵀ against `targets`, the number of counted targets},
/// in fp32, computed `chunk` tokens at a time (hidden [..., H], weight [V, H], targets [...]; `ignore` marks
/// targets without loss). What lm::token_loss_sum(linear(hidden, weight), targets) gives, without the whole
/// logits in memory: the most at once is one chunk's [chunk, V] in fp32. `softcap` > 0: the logits soft-capped
/// (cap·tanh(logits / cap), models::CausalLM::final_logit_softcap) before the loss.
inline std::pair<torch::Tensor, torch::Tensor> chunked_token_loss_sum(const torch::Tensor& hidden,
                                                                      const torch::Tensor& weight,
                                                                      const torch::Tensor& targets, std::int64_t chunk,
                                                                      std::int64_t ignore = -100,
                                                                      double softcap = 0.0) {
  TORCH_CHECK(chunk > 0, "chunked_token_loss_sum: the chunk must hold at least one token; got ", chunk);
  const auto flat_hidden = hidden.reshape({-1, hidden.size(-1)});
  const auto flat_targets = targets.reshape({-1});
  const bool grad_mode = torch::GradMode::is_enabled();
  auto sum = detail::ChunkedLinearCrossEntropy::apply(flat_hidden, weight, flat_targets, chunk, ignore,
                                                      grad_mode && hidden.requires_grad(),
                                                      grad_mode && weight.requires_grad(), softcap);
  return {sum, flat_targets.ne(ignore).sum().to(torch::kFloat32)};
}

}  // namespace hpctrain::lm
