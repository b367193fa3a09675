// Supervised fine-tuning: a Hugging Face model fine-tuned data-parallel on a JSONL file (or a Hugging Face
// dataset on disk: Parquet shards, a save_to_disk folder) in TRL's shapes — {"text"}, {"prompt", "completion"}
// or conversational {"messages"} rendered with the model's chat template — with the loss on the response
// tokens only, then exported in Hugging Face format again.
//   ./sft --from DIR --data FILE.jsonl --local 2 [--packing] [--max-length 256] [--tools tools.json]  (--submit:
//   2 nodes)
//   examples/data/fortunes_qa.jsonl: the fortunes corpus's Q/A pairs as conversations.
// Every 16th example is held out: the log shows response_loss_before= and response_loss_after= (the mean loss
// over the held-out responses) and where the model went (<run dir>/export: transformers and generate load it).
#include <hpctrain/hpctrain.hpp>
#include <hpctrain/lm/sft.hpp>
using namespace std::chrono_literals;
namespace ht = hpctrain;

ht::lm::SftJsonl examples(ht::lm::Split part) {  // every 16th example of the file is held out for validation
  return ht::lm::sft_jsonl(ht::knob("data", "", "JSONL file, Parquet file or dataset directory (TRL's shapes), or "
                                                "several mixed by weight: a.parquet:0.7,b.jsonl:0.3"))
      .max_length(ht::knob("max_length", 256, "tokens per example (longer ones cut), per packed row", ht::at_least(8)))
      .packing(ht::knob("packing", false, "pack examples into rows of --max-length tokens (attention within each)"))
      .tools(ht::knob("tools", "", "JSON file of function schemas the chat template gets with every conversation"))
      .split(part);
}

int main(int argc, char** argv) {
  auto job = ht::Job("sft").nodes(2).cpus_per_task(1).time(30min).partition("debug")
                 .requeue_on_timeout(1min);
  auto training = ht::lm::causal_lm_training()
      .model(ht::lm::from_pretrained(
          ht::knob("from", "", "Hugging Face directory to start from (config.json, safetensors, tokenizer files)")))
      .optimizer(ht::adamw(3e-4).betas({0.9, 0.95}).weight_decay(0.01))  // fused, matrices decayed
      .train_data(examples(ht::lm::Split::train))
      .eval_data(examples(ht::lm::Split::validation))
      .evaluate_at_start(true)
      .batch_size(ht::global(16)).eval_batch_size(16).epochs(3).schedule(ht::LrSchedule::warmup_cosine(5, 0.1))
      .clip_grad_norm(1.0).seed(1).log_every(5).eval_every(20).checkpoint_every(50).keep_checkpoints(1)
      .at_end(ht::lm::report_response_loss())
      .at_end(ht::lm::hf_export());
  return ht::run(argc, argv, job, training);
}
