// Preference tuning (DPO, as TRL's DPOTrainer): a Hugging Face model — sft's export — trained on (prompt, chosen,
// rejected) pairs from a JSONL file in TRL's shapes: {"prompt", "chosen", "rejected"} as text, or conversational
// {"chosen", "rejected"} message lists (with a "prompt" list, or the messages both share as the prompt) rendered
// with the model's chat template. The reference is the start weights: with --lora-r N the model with its adapters
// off, else the pairs' log-probabilities computed once before training (--ref-model DIR holds a reference model
// instead). Then exported in Hugging Face format.
//   ./dpo --from DIR --data pairs.jsonl --local 2 [--beta 0.1] [--loss-type sigmoid|ipo|...|sigmoid:0.8,sft:0.2]
//          [--rpo-alpha 1] [--lora-r 16]
// Every 16th pair is held out: metrics.jsonl has TRL's rewards/chosen, rewards/accuracies, ... per log interval and
// eval_rewards/... at each evaluation; the export lands in <run dir>/export.
#include <hpctrain/hpctrain.hpp>
#include <hpctrain/lm/dpo.hpp>
using namespace std::chrono_literals;
namespace ht = hpctrain;

ht::lm::PreferenceJsonl pairs(ht::lm::Split part) {  // every 16th pair of the file is held out for validation
  return ht::lm::preference_jsonl(ht::knob("data", "", "JSONL file of preference pairs (TRL's shapes)"))
      .max_length(ht::knob("max_length", 1024, "tokens of prompt + completion (the end kept)", ht::at_least(2)))
      .max_prompt_length(ht::knob("max_prompt_length", 512, "the prompt's last tokens kept", ht::at_least(1)))
      .split(part);
}

int main(int argc, char** argv) {
  auto job = ht::Job("dpo").nodes(2).cpus_per_task(1).time(30min).partition("debug").requeue_on_timeout(1min);
  auto training = ht::lm::dpo_training()
      .model(ht::lm::from_pretrained(
          ht::knob("from", "", "Hugging Face directory to start from (config.json, safetensors, tokenizer files)")))
      .optimizer(ht::adamw(5e-6).weight_decay(0.0))  // TRL's DPOConfig: learning rate 1e-6 .. 5e-6
      .train_data(pairs(ht::lm::Split::train))
      .eval_data(pairs(ht::lm::Split::validation))
      .evaluate_at_start(true)
      .batch_size(ht::global(8)).eval_batch_size(8).epochs(1).schedule(ht::LrSchedule::warmup_cosine(5, 0.1))
      .clip_grad_norm(1.0).seed(1).log_every(1).eval_every(20).checkpoint_every(50).keep_checkpoints(1)
      .at_end(ht::lm::hf_export());
  return ht::run(argc, argv, job, training);
}
