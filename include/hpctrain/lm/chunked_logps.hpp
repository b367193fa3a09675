#pragma once
// Each target token's log-probability under logits = hidden · weightᵀ, a chunk of tokens at a time: what DPO's
// completion log-probabilities need (lm/dpo.hpp, --loss-chunk-tokens) without the tokens × vocabulary logits whole
// (pairs of 2 × 1024 tokens under Llama 3's vocabulary of 128,256: 1 GiB of fp32 logits a pair, and as much again
// for their gradient). Unlike the cross entropy of lm/chunked_loss.hpp, whose gradient its forward computes (the
// loss's upstream gradient is one scalar), a preference loss weighs each token by its sequence's gradient, known
// only in backward: backward computes each chunk's logits again (one more head product, as Liger's chunked losses
// pay where they do not fuse the loss) and takes dlogits = g · (one-hot − softmax) from them. The products and dtypes
// are chunked_loss.hpp's: the head's product in autocast's dtype (else the weight's) with an fp32 result, the
// softmax in fp32, the gradients' products in the operands' dtype. Logits soft-capped by the model (Gemma 2) are
// capped per chunk, the gradient taken through the cap. Equal in fp32 within reassociation to the whole logits'
// log_softmax and gather (tests/lm/dpo_test.cpp).
#include <cstdint>
#include <utility>

#include <torch/torch.h>

#include <hpctrain/lm/chunked_loss.hpp>
#include <hpctrain/models/kernels/mixed_precision_products.hpp>

namespace hpctrain::lm {

namespace detail {

/// The logits of one chunk's hidden rows `h` (already in the product's dtype) in fp32, capped where `softcap` > 0.
inline torch::Tensor chunk_logits(const torch::Tensor& h, const torch::Tensor& w, double softcap) {
  auto logits = models::detail::product_into(h, w.t(), torch::kFloat32);
  if (softcap > 0.0) logits = logits.div_(softcap).tanh_().mul_(softcap);
  return logits;
}

struct ChunkedTokenLogps : torch::autograd::Function<ChunkedTokenLogps> {
  /// hidden [N, H], weight [V, H], targets [N] (`ignore` where no token counts): {each counted target's
  /// log-probability, 0 elsewhere; each counted row's sum of logits, 0 elsewhere (no gradient)}, fp32 [N].
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, torch::Tensor hidden,
                                                torch::Tensor weight, torch::Tensor targets, std::int64_t chunk,
                                                std::int64_t ignore, double softcap) {
    const auto compute = head_product_dtype(hidden.device(), weight.scalar_type());
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);  // the casts below are autocast's
    const auto w = weight.to(compute);
    const auto n = hidden.size(0);
    const auto fp32 = hidden.options().dtype(torch::kFloat32);
    auto logps = torch::zeros({n}, fp32), sums = torch::zeros({n}, fp32);
    for (std::int64_t start = 0; start < n; start += chunk) {
      const auto rows = std::min(chunk, n - start);
      const auto logits = chunk_logits(hidden.narrow(0, start, rows).to(compute), w, softcap);
      const auto t = targets.narrow(0, start, rows);
      const auto skipped = t.eq(ignore);
      const auto picked = logits.gather(1, t.masked_fill(skipped, 0).unsqueeze(1)).squeeze(1);
      logps.narrow(0, start, rows).copy_((picked - logits.logsumexp(1)).masked_fill_(skipped, 0.0));
      sums.narrow(0, start, rows).copy_(logits.sum(1).masked_fill_(skipped, 0.0));
    }
    // Not save_for_backward: a sharded head's weight is gathered again into the same tensor for backward (ZeRO-3),
    // which a saved variable's version check would take for an in-place change.
    ctx->saved_data["hidden"] = hidden;
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["targets"] = targets;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["ignore"] = ignore;
    ctx->saved_data["softcap"] = softcap;
    ctx->mark_non_differentiable({sums});
    return {logps, sums};
  }

  /// Each chunk's logits again, dlogits = g · (one-hot(target) − softmax) for the counted rows (through the cap), and
  /// from them the hidden rows' gradient and the weight's (where autograd wants each).
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto hidden = ctx->saved_data["hidden"].toTensor();
    const auto weight = ctx->saved_data["weight"].toTensor();
    const auto targets = ctx->saved_data["targets"].toTensor();
    const auto chunk = ctx->saved_data["chunk"].toInt();
    const auto ignore = ctx->saved_data["ignore"].toInt();
    const auto softcap = ctx->saved_data["softcap"].toDouble();
    const bool hidden_gradient = ctx->needs_input_grad(0), weight_gradient = ctx->needs_input_grad(1);
    torch::Tensor grad_hidden, grad_weight;
    if (!grads[0].defined() || (!hidden_gradient && !weight_gradient))
      return {grad_hidden, grad_weight, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
    const auto compute = head_product_dtype(hidden.device(), weight.scalar_type());
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto w = weight.to(compute);
    const auto n = hidden.size(0);
    if (hidden_gradient) grad_hidden = torch::empty_like(hidden);
    if (weight_gradient) grad_weight = torch::zeros_like(weight, torch::kFloat32);
    const auto upstream = grads[0].to(torch::kFloat32);
    for (std::int64_t start = 0; start < n; start += chunk) {
      const auto rows = std::min(chunk, n - start);
      const auto h = hidden.narrow(0, start, rows).to(compute);
      const auto logits = chunk_logits(h, w, softcap);
      const auto t = targets.narrow(0, start, rows);
      const auto skipped = t.eq(ignore);
      const auto g = upstream.narrow(0, start, rows).masked_fill(skipped, 0.0).unsqueeze(1);  // [rows, 1]
      auto dlogits = torch::softmax(logits, 1).mul_(g).neg_();
      dlogits.scatter_add_(1, t.masked_fill(skipped, 0).unsqueeze(1), g);
      if (softcap > 0.0) dlogits.mul_(logits.div(softcap).square_().neg_().add_(1.0));  // 1 − tanh²
      const auto d = dlogits.to(compute);
      if (hidden_gradient)
        grad_hidden.narrow(0, start, rows).copy_(models::detail::product_into(d, w, hidden.scalar_type()));
      if (weight_gradient) grad_weight.add_(models::detail::product_into(d.t(), h, torch::kFloat32));
    }
    if (weight_gradient) grad_weight = grad_weight.to(weight.scalar_type());
    return {grad_hidden, grad_weight, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace detail

/// {each target's log-probability under logits = hidden · weightᵀ (0 where the target is `ignore`), each counted
/// position's sum of logits over the vocabulary (0 elsewhere; no gradient)}, fp32, shaped like `targets`
/// (hidden [..., H], weight [V, H]), computed `chunk` tokens at a time: the most logits at once are one chunk's
/// [chunk, V], in forward and in backward. `softcap` > 0: the logits soft-capped first (cap·tanh(logits / cap)).
inline std::pair<torch::Tensor, torch::Tensor> chunked_token_logps(const torch::Tensor& hidden,
                                                                   const torch::Tensor& weight,
                                                                   const torch::Tensor& targets, std::int64_t chunk,
                                                                   std::int64_t ignore, double softcap = 0.0) {
  TORCH_CHECK(chunk > 0, "chunked_token_logps: the chunk must hold at least one token; got ", chunk);
  auto out = detail::ChunkedTokenLogps::apply(hidden.reshape({-1, hidden.size(-1)}), weight, targets.reshape({-1}),
                                              chunk, ignore, softcap);
  return {out[0].view(targets.sizes()), out[1].view(targets.sizes())};
}

}  // namespace hpctrain::lm
