// Supervised fine-tuning of a Hugging Face causal LM (Llama 3.1 8B Instruct in docs/quickstart-gpu.md) on chat
// conversations, on 2 nodes x 8 GPUs, in the image containers/Dockerfile makes: a LoRA run first, then every
// parameter under ZeRO-3, both exported in Hugging Face format. Built and run inside the image:
//   cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build
//   ./build/train --submit --from models/Llama-3.1-8B-Instruct --data data/chat.jsonl --lora-r 16 --lr 1e-4
//   ./build/train --submit --from models/Llama-3.1-8B-Instruct --data data/chat.jsonl   (every parameter)
#include <hpctrain/hpctrain.hpp>
#include <hpctrain/lm/sft.hpp>
using namespace std::chrono_literals;
namespace ht = hpctrain;

// TRL's dataset shapes ({"messages"}, {"prompt", "completion"}, {"text"}), the model's chat template, the loss on
// the assistant's tokens; examples packed into rows of --max-length tokens (attention stays within each example).
ht::lm::SftJsonl conversations(ht::lm::Split part) {
  return ht::lm::sft_jsonl(ht::knob("data", "", "JSONL or Parquet file, or a Hugging Face dataset directory"))
      .max_length(ht::knob("max_length", 4096, "tokens per packed row", ht::at_least(8)))
      .packing(true)
      .split(part);
}

int main(int argc, char** argv) {
  auto job = ht::Job("sft")
                 .nodes(2)
                 .gpus_per_node(8)  // one rank a GPU: 16 ranks
                 .cpus_per_task(8)
                 .time(4h)
                 .requeue_on_timeout(10min)  // at the limit: checkpoint, requeue, resume where it stopped
                 .container(ht::Pyxis("./hpctrain-cu128.sqsh"));  // containers/Dockerfile, imported by enroot
  auto training =
      ht::lm::causal_lm_training()
          .model(ht::lm::from_pretrained(
              ht::knob("from", "", "Hugging Face model directory (config, weights, tokenizer)")))
          .sharding(ht::ZeroStage::zero3)  // parameters, gradients and AdamW's state sharded over the 16 ranks
          .precision(ht::auto_precision)   // bf16 on GPUs, fp32 master weights
          .optimizer(ht::adamw(2e-5).weight_decay(0.0))
          .train_data(conversations(ht::lm::Split::train))
          .eval_data(conversations(ht::lm::Split::validation))  // every 16th conversation
          .batch_size(ht::global(64))                           // sequences a step, over every rank
          .gradient_accumulation(2)  // in micro-batches of 2 a GPU: --plan counts their activations
          .epochs(2)
          .schedule(ht::LrSchedule::warmup_cosine(20, 0.1))
          .clip_grad_norm(1.0)
          .log_every(10)
          .eval_every(100)
          .checkpoint_every(100)
          .keep_checkpoints(2)
          .at_end(ht::lm::hf_export());  // <run dir>/export: transformers, vLLM and PEFT load it
  return ht::run(argc, argv, job, training);
}
