// The hpctrain_add_program consumer: a whole train.cpp, whose runtime (ht::run, the Training's defaults, the
// language-model factories and hooks) comes from hpctrain::runtime, compiled once in this build tree. Run
// with --dry-run: the login path through the library's ht::run. Its unit parses the description only: the
// package test "its unit parses no Trainer" reads the compiler's list of the headers it opened.
#include <hpctrain/hpctrain.hpp>
#include <hpctrain/train/optim/fused_adamw.hpp>  // the optimizer it builds itself
#include <torch/nn/modules/linear.h>             // the model's layer: a narrow LibTorch header, not torch/torch.h

#include <iostream>

#ifndef HPCTRAIN_SEPARATE_RUNTIME
#error "hpctrain_add_program did not link hpctrain::runtime"
#endif

namespace ht = hpctrain;

int main(int argc, char** argv) {
  std::cout << "hpctrain " << ht::version << " (runtime compiled apart)\n" << std::flush;
  auto job = ht::Job("consumer").nodes(1).partition("debug");
  auto training = ht::lm::causal_lm_training()
                      .model([] { return torch::nn::Linear(4, 4); })
                      .optimizer([](const ht::NamedParameters& parameters) {
                        const auto options = torch::optim::AdamWOptions(3e-4).weight_decay(0.01);
                        return ht::FusedAdamW(ht::weight_decay_groups(parameters, options), options);
                      })
                      .train_data(ht::data::idx("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz",
                                                "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz"))
                      .batch_size(ht::global(16))
                      .epochs(1)
                      .schedule(ht::LrSchedule::warmup_cosine(5, 0.1))
                      .at_end(ht::lm::print_eval_loss())
                      .at_end(ht::lm::hf_export());
  return ht::run(argc, argv, job, training);
}
