// A small GPT-2 pretrained from scratch on the fortunes corpus, data-parallel: `./gpt --local 2 --max-steps 30`
// or `./gpt --submit` (2 nodes). The job's preparation tokenizes the corpus once (GPT-2's BPE, 5% held out); at
// the end rank 0 prints val_loss=, a greedy sample, and exports the model + tokenizer to <run dir>/export.
#include <hpctrain/hpctrain.hpp>
#include <hpctrain/lm/tokens.hpp>             // lm::prepared_tokens, prepared_vocab_size
#include <hpctrain/models/hf_checkpoint.hpp>  // models::GPT2, save_pretrained
#include <hpctrain/text/prepare_step.hpp>     // text::prepare_tokens_step
using namespace std::chrono_literals;
namespace ht = hpctrain;
namespace fs = std::filesystem;

hpctrain::models::GPT2 gpt(const ht::RunContext& run) {  // the model the knobs ask for, at the prepared vocabulary
  hpctrain::models::GPT2Config config;
  config.vocab_size = ht::lm::padded_vocab_size(ht::lm::prepared_vocab_size(run), run.knobs.get<std::int64_t>("pad_vocab_to"));
  config.n_layer = run.knobs.get<std::int64_t>("n_layer"), config.n_head = run.knobs.get<std::int64_t>("n_head");
  config.n_embd = run.knobs.get<std::int64_t>("n_embd"), config.n_positions = run.knobs.get<std::int64_t>("seq_len");
  config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = run.knobs.get<double>("dropout");
  hpctrain::models::GPT2 model(config);  // seeded: every rank starts from rank 0's weights
  if (run.knobs.get<bool>("save_initial") && run.rank == 0) hpctrain::models::save_pretrained(*model, run.run_dir / "initial");
  return model;
}

int main(int argc, char** argv) {
  const char* corpus_dir = std::getenv("HPCTRAIN_GPT_CORPUS");  // default: Debian's fortunes (no .dat indexes)
  const auto corpus = ht::text::corpus_files(corpus_dir ? corpus_dir : "/usr/share/games/fortunes", {".dat"});
  const char* tokenizer = std::getenv("HPCTRAIN_GPT_TOKENIZER");  // default: GPT-2's ranks from scripts/setup
  auto job = ht::Job("gpt").nodes(2).tasks_per_node(1).cpus_per_task(1).time(30min).partition("debug").requeue_on_timeout(1min)
                 .prepare(ht::text::prepare_tokens_step(corpus, tokenizer ? fs::path(tokenizer) : fs::path(std::getenv("HOME")) / ".cache/hpctrain/gpt2.tiktoken",
                                                        ht::text::PrepareOptions().validation_fraction(0.05)));
  auto training = ht::lm::causal_lm_training()
      .model(gpt)
      .optimizer([](const ht::NamedParameters& parameters, const ht::Knobs& knobs) {
        auto options = torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(knobs.get<double>("weight_decay"));
        return ht::FusedAdamW(ht::weight_decay_groups(parameters, options), options);  // AdamW in one kernel
      })
      .train_data(ht::lm::prepared_tokens("train", ht::lm::knob("seq_len")))
      .eval_data(ht::lm::prepared_tokens("val", ht::lm::knob("seq_len")))
      .schedule([](const ht::Knobs& knobs) {
        return ht::LrSchedule::warmup_cosine(knobs.get<std::int64_t>("warmup_steps"), knobs.get<double>("min_lr_fraction"));
      })
      .batch_size(ht::global(16)).eval_batch_size(16).epochs(100).max_steps(300).lr(1e-3).clip_grad_norm(1.0).seed(1)
      .precision(ht::auto_precision).log_every(10).eval_every(100).checkpoint_every(100).keep_checkpoints(2)
      .knob<std::int64_t>("n_layer", 4, "transformer blocks", ht::positive())
      .knob<std::int64_t>("n_head", 4, "attention heads (must divide --n-embd)", ht::positive())
      .knob<std::int64_t>("n_embd", 128, "model width", ht::positive())
      .knob<std::int64_t>("seq_len", 128, "tokens per training window (and the model's n_positions)", ht::positive())
      .knob<std::int64_t>("pad_vocab_to", 64, "round the vocabulary up to a multiple of this (GPT-2's 50257 -> 50304; 1: as the tokenizer has it)",
                          ht::positive())
      .knob<double>("dropout", 0.0, "dropout of embeddings, attention and residuals", ht::between(0.0, 0.99))
      .knob<double>("weight_decay", 0.1, "AdamW weight decay of the matrices (biases, norms: none)", ht::non_negative())
      .knob<std::int64_t>("warmup_steps", 30, "linear warmup steps before the cosine decay", ht::non_negative())
      .knob<double>("min_lr_fraction", 0.1, "the cosine ends at this fraction of --lr", ht::between(0.0, 1.0))
      .knob<std::string>("prompt", "Q: What is the meaning of life?\nA:", "prompt of the sample printed at the end")
      .knob<std::int64_t>("sample_tokens", 40, "tokens of the greedy sample printed at the end", ht::non_negative())
      .knob<bool>("save_initial", false, "also write the step-0 weights to <run dir>/initial/ (the loss-curve oracle reads them)")
      .at_end(ht::lm::hf_export()).at_end(ht::lm::sample_at_end(ht::lm::knob("prompt"), ht::lm::knob("sample_tokens")))
      .at_end(ht::lm::print_eval_loss("val_loss"));
  return ht::run(argc, argv, job, training);
}
