#pragma once
// The language-model layer (docs/lm.md): above models/ and train/, the pieces every LM program needs —
// the per-token loss and evaluation, a model from a Hugging Face directory, data from the job's preparation
// or from JSONL, and what happens at the end (export, sample, val_loss).
#include <hpctrain/lm/at_end.hpp>
#include <hpctrain/lm/loss.hpp>
#include <hpctrain/lm/pretrained.hpp>
#include <hpctrain/lm/setting.hpp>
#include <hpctrain/lm/sft_dataset.hpp>
#include <hpctrain/lm/tokens.hpp>
#include <hpctrain/train/metrics.hpp>
#include <hpctrain/train/training.hpp>

namespace hpctrain::lm {

/// A Training for a causal language model: next-token loss over the counted targets (fp32), the packed-aware
/// step, per-token evaluation and perplexity. Add the model, data, optimizer and the rest as usual.
inline Training causal_lm_training() {
  return Training().loss(causal_lm_loss).step(causal_lm_step).eval_step(token_eval_step).metric(metrics::perplexity);
}

}  // namespace hpctrain::lm
