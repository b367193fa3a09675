// fairseq's RoBERTa recipe in C++: RoBERTa pretrained from scratch with the masked-LM objective on the fortunes
// corpus (or --data: text files, a Parquet dataset's --text-column), DDP on 2 Slurm nodes: `./roberta --submit`, or
// `./roberta --local 2 --max-steps 30`. The job's preparation tokenizes the corpus once (fairseq's preprocess step;
// 5% held out) with a RoBERTa tokenizer (default: the one scripts/setup trains; HPCTRAIN_ROBERTA_TOKENIZER names
// another tokenizer.json), whose <s>, </s>, <pad> and <mask> the model and the masking use. Blocks of --max-length
// tokens, masked anew each epoch (15%: 80% <mask>, 10% random, 10% kept); fairseq's recipe scaled down: Adam (0.9,
// 0.98), eps 1e-6, weight decay 0.01, warmup then linear decay. Rank 0 ends with val_loss= and an HF export for
// fill_mask.
#include <hpctrain/hpctrain.hpp>
#include <hpctrain/lm/masked_lm_data.hpp>  // lm::prepared_masked_blocks, MaskedLmTokens
#include <hpctrain/lm/scratch.hpp>         // lm::roberta_from_scratch
#include <hpctrain/text/default_data.hpp>  // text::prepare_tokens_step, corpus_knobs, roberta_tokenizer
using namespace std::chrono_literals;
namespace ht = hpctrain;

int main(int argc, char** argv) {
  const auto max_length = ht::knob("max_length", 128, "tokens per block, <s> and </s> included", ht::positive());
  auto job = ht::Job("roberta").nodes(2).cpus_per_task(1).time(30min).partition("debug")
                 .requeue_on_timeout(1min)
                 .prepare(ht::text::prepare_tokens_step(ht::text::corpus_knobs(), ht::text::roberta_tokenizer(),
                                                        ht::text::PrepareOptions().validation_fraction(0.05)));
  auto training = ht::lm::masked_lm_training()
      .model(ht::lm::roberta_from_scratch()  // vocabulary and special tokens from the prepared tokenizer
                 .layers(ht::knob("layers", 4, "encoder blocks", ht::positive()))
                 .heads(ht::knob("heads", 4, "attention heads (must divide --hidden)", ht::positive()))
                 .hidden(ht::knob("hidden", 128, "model width (the MLP is 4x wider)", ht::positive()))
                 .max_length(max_length)
                 .dropout(ht::knob("dropout", 0.1, "dropout: embeddings, attention, residuals", ht::between(0, 0.99))))
      .optimizer(ht::adamw(5e-4).betas({0.9, 0.98}).eps(1e-6).weight_decay(
          ht::knob("weight_decay", 0.01, "weight decay of the matrices (biases, norms: none)", ht::non_negative())))
      .train_data(ht::lm::prepared_masked_blocks("train", max_length))
      .eval_data(ht::lm::prepared_masked_blocks("val", max_length))
      .schedule(ht::warmup_linear(
          ht::knob("warmup_steps", 30, "linear warmup steps before the linear decay", ht::non_negative())))
      .batch_size(ht::global(16)).eval_batch_size(16).epochs(100).max_steps(300).lr(5e-4).clip_grad_norm(1.0).seed(1)
      .precision(ht::auto_precision).log_every(10).eval_every(100).checkpoint_every(100).keep_checkpoints(2)
      .at_end(ht::lm::hf_export()).at_end(ht::lm::print_eval_loss("val_loss"));
  return ht::run(argc, argv, job, training);
}
