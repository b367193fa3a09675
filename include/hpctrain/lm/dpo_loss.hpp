#pragma once
// The DPO objective on tensors, as TRL's DPOTrainer computes it (trl 0.24, trl/trainer/dpo_trainer.py): the
// log-probability of each completion is the sum of its tokens' log-probabilities (concatenated_forward; the mean per
// token for IPO), and the loss of a pair compares the policy's log-ratio of chosen over rejected with the
// reference's (dpo_loss). The rewards are beta times the policy's log-probability over the reference's; the logged
// names are TRL's (get_batch_loss_metrics).
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include <hpctrain/lm/loss.hpp>

namespace hpctrain::lm {

/// TRL's `loss_type`s implemented here.
enum class DpoLossType {
  sigmoid,  ///< -log σ(βh)(1 - ε) - log σ(-βh)ε, h the log-ratios' difference (the DPO paper; TRL's default)
  ipo,      ///< (h - 1/(2β))², with the log-probabilities averaged per token (the IPO paper)
  hinge,    ///< max(0, 1 - βh) (SLiC)
};

/// "sigmoid", "ipo" or "hinge"; nothing else.
inline std::optional<DpoLossType> parse_dpo_loss_type(std::string_view name) {
  if (name == "sigmoid") return DpoLossType::sigmoid;
  if (name == "ipo") return DpoLossType::ipo;
  if (name == "hinge") return DpoLossType::hinge;
  return std::nullopt;
}

/// The knobs of the loss.
struct DpoOptions {
  double beta = 0.1;             ///< Default: 0.1 (TRL's)
  double label_smoothing = 0.0;  ///< ε of the sigmoid loss (cDPO); the others ignore it, as TRL does. Default: 0
  DpoLossType loss_type = DpoLossType::sigmoid;  ///< Default: sigmoid
};

/// What a batch of pairs gives: per pair, its loss and rewards.
struct DpoLosses {
  torch::Tensor losses;            ///< [B]
  torch::Tensor chosen_rewards;    ///< [B], β (policy - reference) of the chosen completion, detached
  torch::Tensor rejected_rewards;  ///< [B], the same of the rejected one
};

/// TRL's DPOTrainer.dpo_loss for the loss types of DpoLossType: the log-probabilities are [B] each (fp32).
inline DpoLosses dpo_loss(const torch::Tensor& chosen, const torch::Tensor& rejected, const torch::Tensor& ref_chosen,
                          const torch::Tensor& ref_rejected, const DpoOptions& options) {
  const auto logits = (chosen - rejected) - (ref_chosen - ref_rejected);
  const double beta = options.beta;
  torch::Tensor losses;
  switch (options.loss_type) {
    case DpoLossType::sigmoid:
      losses = -torch::log_sigmoid(beta * logits) * (1 - options.label_smoothing) -
               torch::log_sigmoid(-beta * logits) * options.label_smoothing;
      break;
    case DpoLossType::ipo: losses = (logits - 1 / (2 * beta)).pow(2); break;
    case DpoLossType::hinge: losses = torch::relu(1 - beta * logits); break;
  }
  return {losses, (beta * (chosen - ref_chosen)).detach(), (beta * (rejected - ref_rejected)).detach()};
}

/// Per row of `logits` [N, T, V] against `targets` [N, T] (lm::ignore_index where no token counts): the sum of the
/// counted tokens' log-probabilities, their number, and the sum of the logits at the counted positions (every
/// vocabulary entry: TRL's mean_*_logits is their mean), all fp32 [N].
struct CompletionLogps {
  torch::Tensor logps, tokens, logit_sums;
};
inline CompletionLogps completion_logps(const torch::Tensor& logits, const torch::Tensor& targets) {
  const auto counted = targets.ne(ignore_index);
  const auto safe = targets.masked_fill(counted.logical_not(), 0);
  const auto fp32 = logits.to(torch::kFloat32);
  const auto token_logps =
      torch::log_softmax(fp32, -1).gather(-1, safe.unsqueeze(-1)).squeeze(-1).masked_fill(counted.logical_not(), 0);
  const auto mask = counted.to(torch::kFloat32);
  return {token_logps.sum(-1), mask.sum(-1), (fp32.detach().sum(-1) * mask).sum(-1)};
}

/// The names TRL's DPOTrainer logs (with `eval_` before them in an evaluation record), in its order.
inline constexpr const char* dpo_metric_names[] = {"rewards/chosen",  "rewards/rejected", "rewards/accuracies",
                                                   "rewards/margins", "logps/chosen",     "logps/rejected",
                                                   "logits/chosen",   "logits/rejected"};

/// A batch's values of the eight metrics (each 0-dim), as TRL's get_batch_loss_metrics computes them on one process:
/// the means over the pairs, and the logits' mean over every counted position and vocabulary entry of the chosen
/// (rejected) rows. `vocabulary`: the logits' last dimension.
inline std::vector<torch::Tensor> dpo_batch_metrics(const DpoLosses& out, const CompletionLogps& chosen,
                                                    const CompletionLogps& rejected, const torch::Tensor& chosen_logps,
                                                    const torch::Tensor& rejected_logps, std::int64_t vocabulary) {
  const auto logit_mean = [&](const CompletionLogps& part) {
    return part.logit_sums.sum() / (part.tokens.sum() * static_cast<double>(vocabulary)).clamp_min(1);
  };
  return {out.chosen_rewards.mean(),
          out.rejected_rewards.mean(),
          out.chosen_rewards.gt(out.rejected_rewards).to(torch::kFloat32).mean(),
          (out.chosen_rewards - out.rejected_rewards).mean(),
          chosen_logps.detach().mean(),
          rejected_logps.detach().mean(),
          logit_mean(chosen),
          logit_mean(rejected)};
}

}  // namespace hpctrain::lm
