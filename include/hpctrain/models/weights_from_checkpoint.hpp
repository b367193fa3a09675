#pragma once
// A model whose every parameter a checkpoint is about to write is built without initialising any (issue 54's
// start-up at 70B): while a WeightsFromCheckpoint scope is alive on this thread, the families' linear layers and
// embeddings get torch::empty weights instead of LibTorch's random ones, and the transformers initialisation
// (initialize_normal, init_normal, init_fill) does nothing. The loads of models/hf/hf_checkpoint.hpp and
// models::load_roberta open it: they refuse a checkpoint that lacks any parameter, so none keeps the uninitialised
// memory. Before, every rank drew
// LibTorch's Kaiming-uniform values for each block it then emptied and read, and a normal for the embedding and the
// head: 4.8 ns a parameter on one thread (an 8B model's 8 billion: 38 s a rank; 70B: over five minutes).
#include <torch/torch.h>

namespace hpctrain::models {

class WeightsFromCheckpoint {
 public:
  WeightsFromCheckpoint() : previous_(active()) { flag() = true; }
  ~WeightsFromCheckpoint() { flag() = previous_; }
  WeightsFromCheckpoint(const WeightsFromCheckpoint&) = delete;
  WeightsFromCheckpoint& operator=(const WeightsFromCheckpoint&) = delete;

  /// Whether a scope is alive on this thread: parameters are built uninitialised.
  static bool active() { return flag(); }

 private:
  static bool& flag() {
    thread_local bool on = false;
    return on;
  }
  bool previous_;
};

/// torch::nn::Linear(options), its weight (and bias) uninitialised inside a WeightsFromCheckpoint scope: LibTorch's
/// constructor initialises what it allocates, so it is given one element, and its parameters then take uninitialised
/// data of the real shape.
inline torch::nn::Linear make_linear(const torch::nn::LinearOptions& options) {
  if (!WeightsFromCheckpoint::active()) return torch::nn::Linear(options);
  torch::nn::Linear linear(torch::nn::LinearOptions(1, 1).bias(options.bias()));
  linear->options = options;
  linear->weight.set_data(torch::empty({options.out_features(), options.in_features()}));  // the registered tensor
  if (options.bias()) linear->bias.set_data(torch::empty({options.out_features()}));
  return linear;
}

/// torch::nn::Embedding(options), its weight uninitialised inside a WeightsFromCheckpoint scope (as make_linear).
inline torch::nn::Embedding make_embedding(const torch::nn::EmbeddingOptions& options) {
  if (!WeightsFromCheckpoint::active()) return torch::nn::Embedding(options);
  torch::nn::Embedding embedding(torch::nn::EmbeddingOptions(1, 1));
  embedding->options = options;
  embedding->weight.set_data(torch::empty({options.num_embeddings(), options.embedding_dim()}));
  return embedding;
}

}  // namespace hpctrain::models
