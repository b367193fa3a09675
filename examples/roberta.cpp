// fairseq's RoBERTa recipe in C++: RoBERTa pretrained from scratch with the masked-LM objective on the fortunes corpus, DDP on 2
// Slurm nodes: `./roberta --submit`, or `./roberta --local 2 --max-steps 30`. The job's preparation tokenizes the
// corpus once (fairseq's preprocess step; 5% held out) with a RoBERTa tokenizer (default: the one scripts/setup
// trains; HPCTRAIN_ROBERTA_TOKENIZER names another tokenizer.json). Blocks of --max-length tokens, masked anew
// each epoch (15%: 80% <mask>, 10% random, 10% kept); fairseq's recipe scaled down: Adam (0.9, 0.98), eps 1e-6,
// weight decay 0.01, warmup then linear decay. Rank 0 ends with val_loss= and an HF export for fill_mask.
#include <hpctrain/hpctrain.hpp>
#include <hpctrain/lm/masked_lm_data.hpp>  // lm::prepared_masked_blocks, MaskedLmTokens
#include <hpctrain/models/roberta.hpp>     // models::RobertaForMaskedLM, save_pretrained
#include <hpctrain/text/prepare_step.hpp>  // text::prepare_tokens_step
using namespace std::chrono_literals;
namespace ht = hpctrain;
namespace fs = std::filesystem;

hpctrain::models::RobertaForMaskedLM roberta(const ht::RunContext& run) {  // sized by the knobs, at the tokenizer's vocabulary
  const auto tokens = ht::lm::MaskedLmTokens::of(ht::lm::prepared_tokenizer(run));
  hpctrain::models::RobertaConfig config;
  config.vocab_size = tokens.vocab_size, config.pad_token_id = tokens.pad, config.bos_token_id = tokens.bos, config.eos_token_id = tokens.eos;
  config.hidden_size = run.knobs.get<std::int64_t>("hidden"), config.intermediate_size = 4 * config.hidden_size;
  config.num_hidden_layers = run.knobs.get<std::int64_t>("layers"), config.num_attention_heads = run.knobs.get<std::int64_t>("heads");
  config.max_position_embeddings = run.knobs.get<std::int64_t>("max_length") + config.pad_token_id + 1;
  config.hidden_dropout_prob = config.attention_probs_dropout_prob = run.knobs.get<double>("dropout");
  hpctrain::models::RobertaForMaskedLM model(config);  // seeded: every rank starts from rank 0's weights
  if (run.knobs.get<bool>("save_initial") && run.rank == 0) hpctrain::models::save_pretrained(*model, run.run_dir / "initial");
  return model;
}

int main(int argc, char** argv) {
  const auto corpus = ht::text::corpus_files("/usr/share/games/fortunes", {".dat"});  // Debian's fortunes, no indexes
  const char* tokenizer = std::getenv("HPCTRAIN_ROBERTA_TOKENIZER");
  auto job = ht::Job("roberta").nodes(2).tasks_per_node(1).cpus_per_task(1).time(30min).partition("debug").requeue_on_timeout(1min)
                 .prepare(ht::text::prepare_tokens_step(corpus, tokenizer ? fs::path(tokenizer) : fs::path(std::getenv("HOME")) / ".cache/hpctrain/roberta-fortunes/tokenizer.json",
                                                        ht::text::PrepareOptions().validation_fraction(0.05)));
  auto training = ht::lm::masked_lm_training()
      .model(roberta)
      .optimizer([](const ht::NamedParameters& parameters, const ht::Knobs& knobs) {
        auto options = torch::optim::AdamWOptions(5e-4).betas({0.9, 0.98}).eps(1e-6).weight_decay(knobs.get<double>("weight_decay"));
        return ht::FusedAdamW(ht::weight_decay_groups(parameters, options), options);  // AdamW in one kernel
      })
      .train_data(ht::lm::prepared_masked_blocks("train", ht::lm::knob("max_length")))
      .eval_data(ht::lm::prepared_masked_blocks("val", ht::lm::knob("max_length")))
      .schedule([](const ht::Knobs& knobs) { return ht::LrSchedule::warmup_linear(knobs.get<std::int64_t>("warmup_steps")); })
      .batch_size(ht::global(16)).eval_batch_size(16).epochs(100).max_steps(300).lr(5e-4).clip_grad_norm(1.0).seed(1)
      .precision(ht::auto_precision).log_every(10).eval_every(100).checkpoint_every(100).keep_checkpoints(2)
      .knob<std::int64_t>("layers", 4, "encoder blocks", ht::positive())
      .knob<std::int64_t>("heads", 4, "attention heads (must divide --hidden)", ht::positive())
      .knob<std::int64_t>("hidden", 128, "model width (the MLP is 4x wider)", ht::positive())
      .knob<std::int64_t>("max_length", 128, "tokens per block, <s> and </s> included", ht::positive())
      .knob<double>("weight_decay", 0.01, "AdamW weight decay of the matrices (biases, norms: none)", ht::non_negative())
      .knob<double>("dropout", 0.1, "dropout of embeddings, attention and residuals", ht::between(0.0, 0.99))
      .knob<std::int64_t>("warmup_steps", 30, "linear warmup steps before the linear decay", ht::non_negative())
      .knob<bool>("save_initial", false, "also write the step-0 weights to <run dir>/initial/ (the loss-curve oracle reads them)")
      .at_end(ht::lm::hf_export()).at_end(ht::lm::print_eval_loss("val_loss"));
  return ht::run(argc, argv, job, training);
}
