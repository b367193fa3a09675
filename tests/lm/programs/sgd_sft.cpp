// The sft example's fine-tuning with plain SGD at a learning rate of 1 (no momentum, no weight decay, no schedule,
// no clipping): one step's update is the gradient itself, so an fp32 export after `--max-steps 1` shows every
// parameter's gradient (tests/lm/split_invariance_test.sh compares them across splits of one global batch).
#include <hpctrain/hpctrain.hpp>
#include <hpctrain/lm/sft.hpp>
using namespace std::chrono_literals;
namespace ht = hpctrain;

int main(int argc, char** argv) {
  auto job = ht::Job("sgd_sft").nodes(1).tasks_per_node(1).cpus_per_task(1).time(10min).partition("debug");
  auto training =
      ht::lm::causal_lm_training()
          .model(ht::lm::from_pretrained(ht::knob("from", "", "Hugging Face directory to start from")))
          .optimizer([](std::vector<torch::Tensor> parameters) {
            return torch::optim::SGD(std::move(parameters), torch::optim::SGDOptions(1.0));
          })
          .train_data(
              ht::lm::sft_jsonl(ht::knob("data", "", "JSONL file of conversations"))
                  .max_length(ht::knob("max_length", 256, "tokens per example, per packed row", ht::at_least(8)))
                  .packing(ht::knob("packing", false, "pack examples into rows of --max-length tokens"))
                  .split(ht::lm::Split::train))
          .batch_size(ht::global(32))
          .max_steps(1)
          .seed(1)
          .log_every(1)
          .checkpoint_every(0)
          .at_end(ht::lm::hf_export());
  return ht::run(argc, argv, job, training);
}
