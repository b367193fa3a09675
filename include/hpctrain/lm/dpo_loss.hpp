#pragma once
// The DPO objective on tensors, as TRL's DPOTrainer computes it (trl 0.24, trl/trainer/dpo_trainer.py): the
// log-probability of each completion is the sum of its tokens' log-probabilities (concatenated_forward; the mean per
// token for IPO), and the loss of a pair compares the policy's log-ratio of chosen over rejected with the
// reference's (dpo_loss). The rewards are beta times the policy's log-probability over the reference's; the logged
// names are TRL's (get_batch_loss_metrics).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include <hpctrain/error.hpp>
#include <hpctrain/lm/loss.hpp>

namespace hpctrain::lm {

/// TRL's `loss_type`s (trl 0.24 DPOTrainer.dpo_loss; h is the policy's log-ratio of chosen over rejected minus the
/// reference's, ε the label smoothing). `bco_pair` is not here: it keeps a running mean of the rewards across steps.
enum class DpoLossType {
  sigmoid,    ///< -log σ(βh)(1 - ε) - log σ(-βh)ε (the DPO paper; cDPO with ε; TRL's default)
  robust,     ///< (-log σ(βh)(1 - ε) + log σ(-βh)ε) / (1 - 2ε) (Robust DPO)
  exo_pair,   ///< σ(βh)(log σ(βh) - log(1 - ε)) + σ(-βh)(log σ(-βh) - log ε), ε 1e-3 when 0 (EXO)
  hinge,      ///< max(0, 1 - βh) (SLiC)
  ipo,        ///< (h - 1/(2β))², with the log-probabilities averaged per token (IPO)
  sppo_hard,  ///< (Δc - 1/(2β))² + (Δr + 1/(2β))², Δ the policy's log-probability over the reference's (SPPO)
  nca_pair,   ///< -log σ(βΔc) - ½ log σ(-βΔc) - ½ log σ(-βΔr) (NCA)
  aot,        ///< the sigmoid loss on the batch's sorted policy log-ratios minus its sorted reference ones (AOT)
  aot_pair,   ///< the sigmoid loss on the batch's sorted Δc minus its sorted Δr (AOT, unpaired)
  apo_zero,   ///< 1 - σ(βΔc) + σ(βΔr) (APO-zero)
  apo_down,   ///< σ(βΔc) + 1 - σ(β(Δc - Δr)) (APO-down)
  discopop,   ///< -log σ(βh)(1 - m) + e^(-βh) m, m = σ(βh/τ) (DiscoPOP)
  sft,        ///< the chosen completions' mean token negative log-likelihood (MPO's generation term)
};

/// One term of the loss and its weight (TRL's loss_type list and loss_weights).
struct DpoLossTerm {
  DpoLossType type = DpoLossType::sigmoid;
  double weight = 1.0;
};

inline constexpr std::pair<std::string_view, DpoLossType> dpo_loss_type_names[] = {
    {"sigmoid", DpoLossType::sigmoid},   {"robust", DpoLossType::robust},     {"exo_pair", DpoLossType::exo_pair},
    {"hinge", DpoLossType::hinge},       {"ipo", DpoLossType::ipo},           {"sppo_hard", DpoLossType::sppo_hard},
    {"nca_pair", DpoLossType::nca_pair}, {"aot", DpoLossType::aot},           {"aot_pair", DpoLossType::aot_pair},
    {"apo_zero", DpoLossType::apo_zero}, {"apo_down", DpoLossType::apo_down}, {"discopop", DpoLossType::discopop},
    {"sft", DpoLossType::sft},
};

/// A loss type's name (TRL's), or nothing.
inline std::optional<DpoLossType> parse_dpo_loss_type(std::string_view name) {
  for (const auto& [known, type] : dpo_loss_type_names)
    if (name == known) return type;
  return std::nullopt;
}

/// `--loss-type`'s value: TRL's loss_type and loss_weights in one list, `name[:weight]` separated by commas
/// (`sigmoid`, `sigmoid:0.8,sft:0.2`); a weight defaults to 1. Nothing when a name is unknown or a weight is not a
/// number above 0.
inline std::optional<std::vector<DpoLossTerm>> parse_dpo_loss_terms(std::string_view text) {
  std::vector<DpoLossTerm> terms;
  while (true) {
    const auto comma = text.find(',');
    const auto item = text.substr(0, comma);
    const auto colon = item.find(':');
    const auto type = parse_dpo_loss_type(item.substr(0, colon));
    if (!type) return std::nullopt;
    DpoLossTerm term{*type, 1.0};
    if (colon != std::string_view::npos) {
      const std::string weight(item.substr(colon + 1));
      char* end = nullptr;
      term.weight = std::strtod(weight.c_str(), &end);
      if (weight.empty() || end != weight.c_str() + weight.size() || !(term.weight > 0) || !std::isfinite(term.weight))
        return std::nullopt;
    }
    terms.push_back(term);
    if (comma == std::string_view::npos) return terms;
    text.remove_prefix(comma + 1);
  }
}

/// The knobs of the loss.
struct DpoOptions {
  double beta = 0.1;             ///< Default: 0.1 (TRL's)
  double label_smoothing = 0.0;  ///< ε of sigmoid, robust, exo_pair, aot and aot_pair (TRL's). Default: 0
  std::vector<DpoLossTerm> terms = {DpoLossTerm{}};  ///< summed, each times its weight. Default: sigmoid
  bool reference_free = false;  ///< h and the APO losses without the reference's log-ratios (TRL's). Default: false
  double discopop_tau = 0.05;   ///< τ of discopop. Default: 0.05 (TRL's)
  double rpo_alpha = 0.0;       ///< the chosen completions' NLL times this is added (RPO); 0: none. Default: 0

  bool has(DpoLossType type) const {
    return std::any_of(terms.begin(), terms.end(), [&](const DpoLossTerm& term) { return term.type == type; });
  }
  /// Whether the loss reads the chosen completions' negative log-likelihood.
  bool needs_nll() const { return rpo_alpha > 0 || has(DpoLossType::sft); }
};

/// What a batch of pairs gives: per pair, its loss and rewards.
struct DpoLosses {
  torch::Tensor losses;            ///< [B]
  torch::Tensor chosen_rewards;    ///< [B], β (policy - reference) of the chosen completion (times the terms' weights)
  torch::Tensor rejected_rewards;  ///< [B], the same of the rejected one
};

namespace detail {

/// -log σ(x)(1 - ε) - log σ(-x)ε: the sigmoid loss's shape, which aot and aot_pair reuse.
inline torch::Tensor smoothed_sigmoid_loss(const torch::Tensor& x, double smoothing) {
  return -torch::log_sigmoid(x) * (1 - smoothing) - torch::log_sigmoid(-x) * smoothing;
}

/// One loss type's per-pair losses. `logits` is h (without the reference's part when reference-free),
/// `chosen_ratio`/`rejected_ratio` Δc and Δr the same way; `raw_*` Δc and Δr always with the reference (TRL's
/// sppo_hard, nca_pair, aot and discopop ignore reference_free).
struct DpoTermInputs {
  torch::Tensor chosen, rejected, ref_chosen, ref_rejected, logits, chosen_ratio, rejected_ratio, nll;
};

inline torch::Tensor dpo_term_losses(DpoLossType type, const DpoTermInputs& in, const DpoOptions& options,
                                     double smoothing) {
  const double beta = options.beta;
  const auto raw_chosen = in.chosen - in.ref_chosen, raw_rejected = in.rejected - in.ref_rejected;
  switch (type) {
    case DpoLossType::sigmoid: return smoothed_sigmoid_loss(beta * in.logits, smoothing);
    case DpoLossType::robust:
      return (-torch::log_sigmoid(beta * in.logits) * (1 - smoothing) +
              torch::log_sigmoid(-beta * in.logits) * smoothing) /
             (1 - 2 * smoothing);
    case DpoLossType::exo_pair: {
      const auto x = beta * in.logits;
      return x.sigmoid() * (torch::log_sigmoid(x) - std::log(1 - smoothing)) +
             (-x).sigmoid() * (torch::log_sigmoid(-x) - std::log(smoothing));
    }
    case DpoLossType::hinge: return torch::relu(1 - beta * in.logits);
    case DpoLossType::ipo: return (in.logits - 1 / (2 * beta)).pow(2);
    case DpoLossType::sppo_hard: return (raw_chosen - 0.5 / beta).pow(2) + (raw_rejected + 0.5 / beta).pow(2);
    case DpoLossType::nca_pair: {
      const auto chosen_rewards = raw_chosen * beta, rejected_rewards = raw_rejected * beta;
      return -torch::log_sigmoid(chosen_rewards) - 0.5 * torch::log_sigmoid(-chosen_rewards) -
             0.5 * torch::log_sigmoid(-rejected_rewards);
    }
    case DpoLossType::aot_pair: {
      const auto delta = std::get<0>(raw_chosen.sort(0)) - std::get<0>(raw_rejected.sort(0));
      return smoothed_sigmoid_loss(beta * delta, smoothing);
    }
    case DpoLossType::aot: {
      const auto delta =
          std::get<0>((in.chosen - in.rejected).sort(0)) - std::get<0>((in.ref_chosen - in.ref_rejected).sort(0));
      return smoothed_sigmoid_loss(beta * delta, smoothing);
    }
    case DpoLossType::apo_zero:
      return 1 - torch::sigmoid(beta * in.chosen_ratio) + torch::sigmoid(beta * in.rejected_ratio);
    case DpoLossType::apo_down:
      return torch::sigmoid(beta * in.chosen_ratio) + 1 - torch::sigmoid(beta * (in.chosen_ratio - in.rejected_ratio));
    case DpoLossType::discopop: {
      const auto logits = ((in.chosen - in.rejected) - (in.ref_chosen - in.ref_rejected)) * beta;
      const auto modulation = torch::sigmoid(logits / options.discopop_tau);
      return -torch::log_sigmoid(logits) * (1 - modulation) + torch::exp(-logits) * modulation;
    }
    case DpoLossType::sft: return in.nll.expand_as(in.chosen);
  }
  return {};
}

}  // namespace detail

/// TRL's DPOTrainer.dpo_loss summed over `options.terms` with their weights, plus `rpo_alpha` times `nll` (as its
/// get_batch_loss_metrics): the log-probabilities are [B] each (fp32); `nll` (0-dim, the chosen completions' mean
/// token negative log-likelihood) is read by the sft term and rpo_alpha only.
inline DpoLosses dpo_loss(const torch::Tensor& chosen, const torch::Tensor& rejected, const torch::Tensor& ref_chosen,
                          const torch::Tensor& ref_rejected, const DpoOptions& options, const torch::Tensor& nll = {}) {
  hpctrain::detail::require(!options.needs_nll() || nll.defined(), "preference.nll", "undefined",
                            "the sft term and rpo_alpha read the chosen completions' negative log-likelihood");
  const double keep_reference = options.reference_free ? 0.0 : 1.0;
  detail::DpoTermInputs in{chosen,
                           rejected,
                           ref_chosen,
                           ref_rejected,
                           (chosen - rejected) - keep_reference * (ref_chosen - ref_rejected),
                           chosen - keep_reference * ref_chosen,
                           rejected - keep_reference * ref_rejected,
                           nll};
  // TRL's exo_pair sets the trainer's label smoothing to 1e-3 when it is 0, for every term after it and every step.
  const double smoothing =
      options.has(DpoLossType::exo_pair) && options.label_smoothing == 0 ? 1e-3 : options.label_smoothing;
  torch::Tensor losses = torch::zeros_like(chosen);
  double weights = 0;
  for (const auto& term : options.terms) {
    losses = losses + detail::dpo_term_losses(term.type, in, options, smoothing) * term.weight;
    weights += term.weight;
  }
  if (options.rpo_alpha > 0) losses = losses + options.rpo_alpha * nll;
  return {losses, (weights * options.beta * (chosen - ref_chosen)).detach(),
          (weights * options.beta * (rejected - ref_rejected)).detach()};
}

/// Per row of `logits` [N, T, V] against `targets` [N, T] (lm::ignore_index where no token counts): the sum of the
/// counted tokens' log-probabilities, their number, and the sum of the logits at the counted positions (every
/// vocabulary entry: TRL's mean_*_logits is their mean), all fp32 [N].
struct CompletionLogps {
  torch::Tensor logps, tokens, logit_sums;
  torch::Tensor token_logps;  ///< [N, T]: each counted token's log-probability, 0 elsewhere
};
inline CompletionLogps completion_logps(const torch::Tensor& logits, const torch::Tensor& targets) {
  const auto counted = targets.ne(ignore_index);
  const auto safe = targets.masked_fill(counted.logical_not(), 0);
  const auto fp32 = logits.to(torch::kFloat32);
  const auto token_logps =
      torch::log_softmax(fp32, -1).gather(-1, safe.unsqueeze(-1)).squeeze(-1).masked_fill(counted.logical_not(), 0);
  const auto mask = counted.to(torch::kFloat32);
  return {token_logps.sum(-1), mask.sum(-1), (fp32.detach().sum(-1) * mask).sum(-1), token_logps};
}

/// TRL's nll_loss (the RPO term, the sft loss type): the mean negative log-probability of the chosen rows' counted
/// tokens, `chosen` [n, T] of completion_logps' token_logps and `targets` [n, T]. As TRL 0.24 computes it
/// (cross_entropy with ignore_index=0), a token whose id is 0 does not count.
inline torch::Tensor chosen_nll(const torch::Tensor& chosen, const torch::Tensor& targets) {
  const auto counted = targets.ne(ignore_index).logical_and(targets.ne(0));
  return -(chosen * counted).sum() / counted.sum().clamp_min(1);
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
