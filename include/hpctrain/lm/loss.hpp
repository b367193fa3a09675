#pragma once
// The causal-LM objective as the Trainer's seams take it: the loss of next-token prediction over the
// targets that count (Hugging Face's -100 marks the others: padding, prompts, non-assistant turns), in fp32
// whatever the forward precision; the step, which runs packed rows through the model's packed forward; and an
// evaluation weighted by counted tokens, so val_loss and perplexity are per token.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

#include <torch/torch.h>

#include <hpctrain/lm/chunked_loss.hpp>
#include <hpctrain/models/causal_lm.hpp>
#include <hpctrain/models/kernels/cross_entropy_rows.hpp>
#include <hpctrain/train/data/source.hpp>
#include <hpctrain/train/step.hpp>

namespace hpctrain::lm {

/// The target that takes no loss (transformers' and torch.nn.CrossEntropyLoss's default ignore_index).
inline constexpr std::int64_t ignore_index = -100;

/// {sum of the per-token cross entropy over the counted targets, their count}, in fp32.
inline std::pair<torch::Tensor, torch::Tensor> token_loss_sum(const torch::Tensor& logits,
                                                              const torch::Tensor& targets) {
  const auto flat_targets = targets.reshape({-1});
  const auto sum = torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32), flat_targets,
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(ignore_index));
  return {sum, flat_targets.ne(ignore_index).sum().to(torch::kFloat32)};
}

/// The mean cross entropy per counted target token of `logits` [B, T, V] against `targets` [B, T] (fp32; 0
/// when no target counts, rather than NaN).
inline torch::Tensor token_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  const auto [sum, count] = token_loss_sum(logits, targets);
  return sum / count.clamp_min(1);
}

/// The logits of a language-model batch: packed rows (fields "position_ids" and "document_ids") through the
/// model's packed forward, others through its plain one.
inline torch::Tensor batch_logits(StepContext& context, const data::Batch& batch) {
  if (!batch.has("document_ids")) return context.forward(batch.inputs);
  auto* model = dynamic_cast<models::CausalLM*>(&context.module);
  TORCH_CHECK(model != nullptr, "a packed batch needs a models::CausalLM (GPT-2, Llama, ...); the model is ",
              context.module.name());
  return model->forward(batch.inputs, models::TokenLayout{batch.field("position_ids"), batch.field("document_ids")});
}

/// The knob of causal_lm_training and masked_lm_training that weighs each micro-batch's mean loss alike (the mean
/// of the micro-batches' means: TRL's `average_tokens_across_devices=False` with gradient accumulation before
/// transformers 4.46). Off by default: a step's loss is the mean over every counted token of its global batch.
inline constexpr const char* micro_batch_mean_knob = "micro_batch_mean_loss";

/// A micro-batch's counted targets (0-dim int64): what token_loss_step's mean is over.
inline torch::Tensor counted_targets(const data::Batch& batch) { return batch.targets.ne(ignore_index).sum(); }

/// The loss count of the language-model trainings (Training::loss_count): the counted targets, so that the Trainer
/// weighs micro-batches and ranks by their tokens; none under `--micro-batch-mean-loss`.
inline torch::Tensor token_loss_count(StepContext& context, const data::Batch& batch) {
  if (context.knobs.get<bool>(micro_batch_mean_knob)) return {};
  return counted_targets(batch);
}

/// The step: the mean loss over the micro-batch's counted targets (the Trainer weighs it by their share of the
/// global batch's through token_loss_count).
inline torch::Tensor token_loss_step(StepContext& context, const data::Batch& batch) {
  return token_loss(batch_logits(context, batch), batch.targets);
}

/// Whether the head and the loss of all a batch's tokens run fastest as one chunk of lm/chunked_loss.hpp: where the
/// cross-entropy row kernel runs for the head's products (models/kernels/cross_entropy_rows.hpp: on CUDA, in bf16 or
/// fp16), which computes the loss and the logits' gradient in one pass where the whole logits' operations make five.
inline bool whole_head_as_one_chunk(models::CausalLM& model, const torch::Device& device) {
  return models::detail::cross_entropy_rows_usable(
      device, detail::head_product_dtype(device, model.head_weight().scalar_type()));
}

/// The mean loss per counted target of a causal language model's batch (`layout`: packed rows) with the head and
/// the loss applied `chunk` tokens at a time (lm/chunked_loss.hpp), or with `chunk` 0 all at once: as one chunk
/// where whole_head_as_one_chunk, else through the whole logits (token_loss). What the Trainer's step computes.
inline torch::Tensor causal_lm_loss(models::CausalLM& model, const torch::Tensor& inputs, const torch::Tensor& targets,
                                    const models::TokenLayout* layout = nullptr, std::int64_t chunk = 0) {
  if (chunk == 0 && !whole_head_as_one_chunk(model, inputs.device())) {
    return token_loss(layout ? model.forward(inputs, *layout) : model.forward(inputs), targets);
  }
  if (chunk == 0) chunk = std::max<std::int64_t>(targets.numel(), 1);
  const auto hidden = model.hidden_states(inputs, layout);
  torch::Tensor count;
  const auto sum = model.with_head(hidden, [&](const torch::Tensor& h) {
    auto [chunk_sum, chunk_count] =
        chunked_token_loss_sum(h, model.head_weight(), targets, chunk, ignore_index, model.final_logit_softcap());
    count = chunk_count;
    return chunk_sum;
  });
  return sum / count.clamp_min(1);
}

/// The knob of causal_lm_training that applies the head and the loss a chunk of tokens at a time.
inline constexpr const char* loss_chunk_knob = "loss_chunk_tokens";

/// The model a step trains, as a head computed a chunk of tokens at a time needs it (--loss-chunk-tokens: SFT's
/// chunked loss, DPO's chunked log-probabilities).
inline models::CausalLM& chunked_head_model(StepContext& context) {
  auto* model = dynamic_cast<models::CausalLM*>(&context.module);
  TORCH_CHECK(model != nullptr, "--loss-chunk-tokens needs a models::CausalLM (GPT-2, Llama, ...); the model is ",
              context.module.name());
  return *model;
}

/// The step of causal_lm_training: causal_lm_loss with `--loss-chunk-tokens N` (0, the default: the whole tokens at
/// once; N > 0: the head and the loss N tokens at a time, the same loss and gradients without the whole tokens ×
/// vocabulary logits in memory). With N 0, token_loss_step where the whole head is not one chunk.
inline torch::Tensor chunked_causal_lm_step(StepContext& context, const data::Batch& batch) {
  auto chunk = context.knobs.get<std::int64_t>(loss_chunk_knob);
  if (chunk == 0) {  // decided here once, so that causal_lm_loss gets a chunk and does not ask again
    auto* model = dynamic_cast<models::CausalLM*>(&context.module);
    if (model == nullptr || !whole_head_as_one_chunk(*model, batch.inputs.device()))
      return token_loss_step(context, batch);
    chunk = std::max<std::int64_t>(batch.targets.numel(), 1);
  }
  std::optional<models::TokenLayout> layout;
  if (batch.has("document_ids")) layout = models::TokenLayout{batch.field("position_ids"), batch.field("document_ids")};
  return causal_lm_loss(chunked_head_model(context), batch.inputs, batch.targets, layout ? &*layout : nullptr, chunk);
}

/// The evaluation: the batch's mean loss weighted by its counted targets, so the run's val_loss is the mean
/// over every counted token.
inline EvalOutput token_eval_step(StepContext& context, const data::Batch& batch) {
  auto logits = batch_logits(context, batch);
  const auto [sum, count] = token_loss_sum(logits, batch.targets);
  return {sum / count.clamp_min(1), std::move(logits), count.to(torch::kFloat64)};
}

}  // namespace hpctrain::lm
