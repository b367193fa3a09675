// A small GPT-2 pretrained from scratch on the fortunes corpus (or --data: text files, a Parquet dataset's
// --text-column), data-parallel: `./gpt --local 2 --max-steps 30` or `./gpt --submit` (2 nodes). The job's
// preparation tokenizes the corpus once (GPT-2's BPE, 5% held out); at the end rank 0 prints val_loss=, a greedy
// sample, and exports the model + tokenizer to <run dir>/export.
#include <hpctrain/hpctrain.hpp>
#include <hpctrain/lm/scratch.hpp>            // lm::gpt2_from_scratch
#include <hpctrain/lm/tokens.hpp>             // lm::prepared_tokens, prepared_vocab_size
#include <hpctrain/text/default_data.hpp>     // text::prepare_tokens_step, corpus_knobs, gpt2_tokenizer
using namespace std::chrono_literals;
namespace ht = hpctrain;

int main(int argc, char** argv) {
  const auto seq_len = ht::knob("seq_len", 128, "tokens per training window (the model's n_positions)", ht::positive());
  auto job = ht::Job("gpt").nodes(2).cpus_per_task(1).time(30min).partition("debug")
                 .requeue_on_timeout(1min)
                 .prepare(ht::text::prepare_tokens_step(ht::text::corpus_knobs(), ht::text::gpt2_tokenizer(),
                                                        ht::text::PrepareOptions().validation_fraction(0.05)));
  auto training = ht::lm::causal_lm_training()
      .model(ht::lm::gpt2_from_scratch()  // at the prepared tokenizer's vocabulary
                 .n_layer(ht::knob("n_layer", 4, "transformer blocks", ht::positive()))
                 .n_head(ht::knob("n_head", 4, "attention heads (must divide --n-embd)", ht::positive()))
                 .n_embd(ht::knob("n_embd", 128, "model width", ht::positive()))
                 .n_positions(seq_len)
                 .dropout(ht::knob("dropout", 0.0, "dropout: embeddings, attention, residuals", ht::between(0, 0.99)))
                 .pad_vocab_to(ht::knob("pad_vocab_to", 64, "round the vocabulary up to a multiple of this "
                                        "(50257 -> 50304; 1: as the tokenizer has it)", ht::positive())))
      .optimizer(ht::adamw(1e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(
          ht::knob("weight_decay", 0.1, "weight decay of the matrices (biases, norms: none)", ht::non_negative())))
      .train_data(ht::lm::prepared_tokens("train", seq_len))
      .eval_data(ht::lm::prepared_tokens("val", seq_len))
      .schedule(ht::warmup_cosine(
          ht::knob("warmup_steps", 30, "linear warmup steps before the cosine decay", ht::non_negative()),
          ht::knob("min_lr_fraction", 0.1, "the cosine ends at this fraction of --lr", ht::between(0, 1))))
      .batch_size(ht::global(16)).eval_batch_size(16).epochs(100).max_steps(300).lr(1e-3).clip_grad_norm(1.0).seed(1)
      .precision(ht::auto_precision).log_every(10).eval_every(100).checkpoint_every(100).keep_checkpoints(2)
      .at_end(ht::lm::hf_export())
      .at_end(ht::lm::sample_at_end(
          ht::knob("prompt", "Q: What is the meaning of life?\nA:", "prompt of the sample printed at the end"),
          ht::knob("sample_tokens", 40, "tokens of the greedy sample printed at the end", ht::non_negative())))
      .at_end(ht::lm::print_eval_loss("val_loss"));
  return ht::run(argc, argv, job, training);
}
