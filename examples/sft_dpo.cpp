// Supervised fine-tuning, then preference tuning (DPO) from its export, as one chain of two jobs: one --submit
// queues both, the DPO job starting only once the SFT job completed (afterok), from the SFT job's export.
//   ./sft_dpo --from DIR --data chats.jsonl --pairs pairs.jsonl --submit [--sft.epochs 2] [--dpo.lora-r 16]
// A knob sets every stage that has it (--max-steps 100); --sft.<knob> or --dpo.<knob> one stage only. --local N runs
// the two stages in order on this machine. Each stage exports in Hugging Face format to <its run dir>/export.
#include <hpctrain/hpctrain.hpp>
#include <hpctrain/lm/dpo.hpp>
#include <hpctrain/lm/sft.hpp>
using namespace std::chrono_literals;
namespace ht = hpctrain;

auto max_length() {  // both stages': the end of a longer example is kept
  return ht::knob("max_length", 512, "tokens of an example or pair", ht::at_least(8));
}

int main(int argc, char** argv) {
  auto sft_job = ht::Job("sft").nodes(2).cpus_per_task(1).time(30min).partition("debug").requeue_on_timeout(1min);
  auto dpo_job = ht::Job("dpo").nodes(2).cpus_per_task(1).time(30min).partition("debug").requeue_on_timeout(1min);
  auto chats = [](ht::lm::Split part) {  // every 16th example (and pair, below) held out for validation
    return ht::lm::sft_jsonl(ht::knob("data", "", "SFT data: JSONL, Parquet or dataset directory (TRL's shapes)"))
        .max_length(max_length()).split(part);
  };
  auto pairs = [](ht::lm::Split part) {
    return ht::lm::preference_jsonl(ht::knob("pairs", "", "DPO data: JSONL of preference pairs (TRL's shapes)"))
        .max_length(max_length()).split(part);
  };
  auto sft = ht::lm::causal_lm_training()
      .model(ht::lm::from_pretrained(ht::knob("from", "", "Hugging Face directory to start from")))
      .optimizer(ht::adamw(3e-4).betas({0.9, 0.95}).weight_decay(0.01))
      .train_data(chats(ht::lm::Split::train)).eval_data(chats(ht::lm::Split::validation))
      .batch_size(ht::global(16)).eval_batch_size(16).epochs(3).schedule(ht::LrSchedule::warmup_cosine(5, 0.1))
      .clip_grad_norm(1.0).seed(1).log_every(5).eval_every(20).checkpoint_every(50).keep_checkpoints(1)
      .at_end(ht::lm::hf_export());
  auto dpo = ht::lm::dpo_training()
      .model(ht::lm::from_pretrained(ht::stage_dir("sft") / "export"))  // the SFT job's export, once it exists
      .optimizer(ht::adamw(5e-6).weight_decay(0.0))
      .train_data(pairs(ht::lm::Split::train)).eval_data(pairs(ht::lm::Split::validation))
      .batch_size(ht::global(8)).eval_batch_size(8).epochs(1).schedule(ht::LrSchedule::warmup_cosine(5, 0.1))
      .clip_grad_norm(1.0).seed(1).log_every(1).eval_every(20).checkpoint_every(50).keep_checkpoints(1)
      .at_end(ht::lm::hf_export());
  return ht::run(argc, argv, {{sft_job, sft}, {dpo_job, dpo}});
}
