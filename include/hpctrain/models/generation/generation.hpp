#pragma once
// Text generation with a KV cache: the prompt runs once, then one token per step attends to the cached
// keys and values. Greedy (argmax, as transformers' `generate(do_sample=False)`) unless a temperature is
// given; then top-k sampling from a generator seeded for reproducibility.
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <hpctrain/error.hpp>
#include <hpctrain/models/causal_lm.hpp>

namespace hpctrain::models {

/// How to continue a prompt.
struct GenerationOptions {
  std::int64_t max_new_tokens = 32;   ///< Default: 32
  std::optional<double> temperature;  ///< sample at this temperature. Default: none (greedy)
  std::optional<std::int64_t> top_k;  ///< sample among the k likeliest tokens. Default: none (all)
  std::uint64_t seed = 0;             ///< seed of the sampling generator. Default: 0
  bool stop_at_eos = true;            ///< stop after the config's eos token. Default: true
  /// generate only ids below this: the tokenizer's vocabulary when the model's is padded (`--pad-vocab-to`:
  /// its extra rows are no token). Default: none (every id of the model)
  std::optional<std::int64_t> vocabulary;

  /// SpecError `[hpctrain.spec.generation.<field>]` for an invalid value.
  void validate() const {
    using hpctrain::detail::require;
    require(max_new_tokens >= 0, "generation.max_new_tokens", max_new_tokens, "must not be negative");
    if (temperature) require(*temperature > 0.0, "generation.temperature", *temperature, "must be positive");
    if (top_k) require(*top_k >= 1, "generation.top_k", *top_k, "must be at least 1");
    require(!top_k || temperature, "generation.top_k", top_k.value_or(0), "needs a temperature (sampling)");
    if (vocabulary) require(*vocabulary >= 1, "generation.vocabulary", *vocabulary, "must be at least 1");
  }
};

namespace detail {

/// The next token from the last position's logits [vocab].
inline std::int64_t next_token(torch::Tensor logits, const GenerationOptions& options, at::Generator& generator) {
  logits = logits.to(torch::kFloat32);
  if (options.vocabulary && *options.vocabulary < logits.size(0)) logits = logits.narrow(0, 0, *options.vocabulary);
  if (!options.temperature) return logits.argmax().item<std::int64_t>();
  logits = (logits / *options.temperature).to(torch::kCPU);
  if (options.top_k && *options.top_k < logits.size(0)) {
    const auto kth = std::get<0>(logits.topk(*options.top_k)).min();
    logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
  }
  return torch::multinomial(torch::softmax(logits, 0), 1, /*replacement=*/false, generator).item<std::int64_t>();
}

}  // namespace detail

/// Continues `prompt` (token ids, at least one); returns the new tokens only (ending with the eos token
/// when generation stopped there). The model is put in eval mode and back.
inline std::vector<std::int64_t> generate(CausalLM& model, const std::vector<std::int64_t>& prompt,
                                          const GenerationOptions& options = {}) {
  options.validate();
  if (prompt.empty()) throw SpecError("generation.prompt", "[]", "needs at least one token");
  const auto total = static_cast<std::int64_t>(prompt.size()) + options.max_new_tokens;
  if (const auto limit = model.max_positions(); limit && total > *limit)
    throw SpecError(
        "generation.max_new_tokens", std::to_string(options.max_new_tokens),
        fmt::format("prompt ({} tokens) + new tokens exceed the model's {} positions", prompt.size(), *limit));
  const bool was_training = model.is_training();
  model.eval();
  torch::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  const auto device = model.parameters().front().device();
  auto cache = model.make_cache(1, total);
  auto input = torch::tensor(prompt, torch::kLong).unsqueeze(0).to(device);
  std::vector<std::int64_t> generated;
  const auto eos = model.eos_token_id();
  for (std::int64_t step = 0; step < options.max_new_tokens; ++step) {
    const auto logits = model.forward(input, &cache);
    const auto token = detail::next_token(logits[0][-1], options, generator);
    generated.push_back(token);
    if (options.stop_at_eos && eos && token == *eos) break;
    input = torch::full({1, 1}, token, torch::TensorOptions().dtype(torch::kLong).device(device));
  }
  model.train(was_training);
  return generated;
}

}  // namespace hpctrain::models
