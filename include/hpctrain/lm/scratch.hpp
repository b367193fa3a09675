#pragma once
// Models trained from scratch on the job's prepared tokens, described as configuration: the sizes are values or
// knobs (`lm::gpt2_from_scratch().n_layer(ht::knob("n_layer", 4, "transformer blocks"))`), and what the tokenizer
// decides — the vocabulary, RoBERTa's <s>, </s>, <pad> and the positions after <pad> — comes from the tokenizer the
// preparation kept beside its tokens. Called once per rank after seeding: every rank builds rank 0's weights.
#include <cstdint>
#include <filesystem>

#include <hpctrain/lm/masked_lm_data.hpp>
#include <hpctrain/lm/setting.hpp>
#include <hpctrain/lm/tokens.hpp>
#include <hpctrain/models/gpt2.hpp>
#include <hpctrain/models/roberta.hpp>
#include <hpctrain/train/run_context.hpp>

namespace hpctrain::lm {

/// GPT-2 from scratch at the prepared tokens' vocabulary, rounded up to a multiple of pad_vocab_to.
class Gpt2FromScratch {
 public:
  explicit Gpt2FromScratch(models::GPT2Config base) : base_(std::move(base)) {}
  /// Transformer blocks. Default: the base config's (12).
  Gpt2FromScratch& n_layer(Setting<std::int64_t> n) {
    n_layer_ = std::move(n);
    return *this;
  }
  /// Attention heads; must divide n_embd. Default: the base config's (12).
  Gpt2FromScratch& n_head(Setting<std::int64_t> n) {
    n_head_ = std::move(n);
    return *this;
  }
  /// Width. Default: the base config's (768).
  Gpt2FromScratch& n_embd(Setting<std::int64_t> n) {
    n_embd_ = std::move(n);
    return *this;
  }
  /// Longest sequence (learned positions): the training window. Default: the base config's (1024).
  Gpt2FromScratch& n_positions(Setting<std::int64_t> n) {
    n_positions_ = std::move(n);
    return *this;
  }
  /// Dropout of the embeddings, attention and residuals. Default: the base config's (0.1).
  Gpt2FromScratch& dropout(Setting<double> p) {
    dropout_ = std::move(p);
    return *this;
  }
  /// The vocabulary is rounded up to a multiple of this (padded_vocab_size: GPT-2's 50257 -> 50304 at 64; 1: as
  /// the tokenizer has it). Default: 64.
  Gpt2FromScratch& pad_vocab_to(Setting<std::int64_t> multiple) {
    pad_vocab_to_ = std::move(multiple);
    return *this;
  }

  /// The config for this run's knobs and prepared tokens.
  models::GPT2Config config(const RunContext& run) const {
    auto config = base_;
    const auto& knobs = run.knobs;
    config.vocab_size = padded_vocab_size(prepared_vocab_size(run), pad_vocab_to_.get(knobs));
    config.n_layer = n_layer_.get(knobs), config.n_head = n_head_.get(knobs), config.n_embd = n_embd_.get(knobs);
    config.n_positions = n_positions_.get(knobs);
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = dropout_.get(knobs);
    return config;
  }
  models::GPT2 operator()(const RunContext& run) const { return models::GPT2(config(run)); }

 private:
  models::GPT2Config base_;
  Setting<std::int64_t> n_layer_ = base_.n_layer, n_head_ = base_.n_head, n_embd_ = base_.n_embd;
  Setting<std::int64_t> n_positions_ = base_.n_positions, pad_vocab_to_ = std::int64_t{64};
  Setting<double> dropout_ = base_.resid_pdrop;
};

/// `.model(lm::gpt2_from_scratch().n_layer(4).n_embd(128))`: GPT-2 trained from scratch; `base` gives the fields
/// no setter names (activation, initializer range, ...). Default: GPT-2 124M's config.
inline Gpt2FromScratch gpt2_from_scratch(models::GPT2Config base = {}) { return Gpt2FromScratch(std::move(base)); }

/// RoBERTa for masked LM from scratch: the vocabulary and the ids of <s>, </s> and <pad> from the prepared
/// tokenizer, the learned positions after <pad> as RoBERTa counts them (RobertaConfig::max_length).
class RobertaFromScratch {
 public:
  explicit RobertaFromScratch(models::RobertaConfig base) : base_(std::move(base)) {}
  /// Encoder blocks. Default: the base config's (12).
  RobertaFromScratch& layers(Setting<std::int64_t> n) {
    layers_ = std::move(n);
    return *this;
  }
  /// Attention heads; must divide hidden. Default: the base config's (12).
  RobertaFromScratch& heads(Setting<std::int64_t> n) {
    heads_ = std::move(n);
    return *this;
  }
  /// Width; the MLP is 4x wider. Default: the base config's (768).
  RobertaFromScratch& hidden(Setting<std::int64_t> n) {
    hidden_ = std::move(n);
    return *this;
  }
  /// Longest block, <s> and </s> included. Default: the base config's (512).
  RobertaFromScratch& max_length(Setting<std::int64_t> n) {
    max_length_ = std::move(n);
    return *this;
  }
  /// Dropout of the embeddings, attention and residuals. Default: the base config's (0.1).
  RobertaFromScratch& dropout(Setting<double> p) {
    dropout_ = std::move(p);
    return *this;
  }

  /// The config for this run's knobs and prepared tokenizer.
  models::RobertaConfig config(const RunContext& run) const {
    auto config = base_;
    const auto& knobs = run.knobs;
    const auto tokens = MaskedLmTokens::of(prepared_tokenizer(run));
    config.vocab_size = tokens.vocab_size, config.pad_token_id = tokens.pad;
    config.bos_token_id = tokens.bos, config.eos_token_id = tokens.eos;
    config.hidden_size = hidden_.get(knobs), config.intermediate_size = 4 * config.hidden_size;
    config.num_hidden_layers = layers_.get(knobs), config.num_attention_heads = heads_.get(knobs);
    config.max_position_embeddings = max_length_.get(knobs) + config.position_offset();
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = dropout_.get(knobs);
    return config;
  }
  models::RobertaForMaskedLM operator()(const RunContext& run) const { return models::RobertaForMaskedLM(config(run)); }

 private:
  models::RobertaConfig base_;
  Setting<std::int64_t> layers_ = base_.num_hidden_layers, heads_ = base_.num_attention_heads;
  Setting<std::int64_t> hidden_ = base_.hidden_size, max_length_ = base_.max_length();
  Setting<double> dropout_ = base_.hidden_dropout_prob;
};

/// `.model(lm::roberta_from_scratch().layers(4).hidden(128))`: RoBERTa trained from scratch with masked LM; `base`
/// gives the fields no setter names. Default: roberta-base's config.
inline RobertaFromScratch roberta_from_scratch(models::RobertaConfig base = {}) {
  return RobertaFromScratch(std::move(base));
}

}  // namespace hpctrain::lm
