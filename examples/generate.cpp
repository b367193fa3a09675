// Text generation from a Hugging Face-format directory (config.json + model.safetensors or shards), GPT-2
// or Llama, on the CPU in fp32:
//   ./generate --model DIR --prompt-ids "464 2068 7586" [--max-new-tokens 32]          greedy, prints ids
//   ./generate --model DIR --prompt-ids "1 2 3" --temperature 0.8 --top-k 40 --seed 1   sampled
// Greedy decoding equals transformers' generate(do_sample=False) token for token (tests/models).
// A config or checkpoint that does not fit (corrupt safetensors, a missing tensor) exits 1 with the file,
// the tensor and the reason before any weight is used; bad usage exits 2.
#include <cstdint>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include <hpctrain/error.hpp>
#include <hpctrain/models/models.hpp>

namespace {

namespace hm = hpctrain::models;

struct Arguments {
  std::string model;
  std::string prompt_ids;
  hm::GenerationOptions generation;
};

/// "1 2 3" (or "1,2,3") → ids; a UsageError names the token that is not an id.
std::vector<std::int64_t> parse_ids(std::string text) {
  for (auto& c : text)
    if (c == ',') c = ' ';
  std::istringstream in(text);
  std::vector<std::int64_t> ids;
  std::string token;
  while (in >> token) {
    std::size_t used = 0;
    std::int64_t id = -1;
    try {
      id = std::stoll(token, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != token.size() || id < 0) throw hpctrain::UsageError(fmt::format("--prompt-ids: \"{}\" is not a token id", token));
    ids.push_back(id);
  }
  if (ids.empty()) throw hpctrain::UsageError("--prompt-ids: no token ids");
  return ids;
}

int generate(const Arguments& arguments) {
  const auto prompt = parse_ids(arguments.prompt_ids);
  auto model = hm::load_pretrained(arguments.model);
  const auto vocab = model->parameters().front().size(0);  // the token embedding comes first in both families
  for (auto id : prompt)
    if (id >= vocab) throw hpctrain::UsageError(fmt::format("--prompt-ids: {} is not below the vocabulary size {}", id, vocab));
  const auto tokens = hm::generate(*model, prompt, arguments.generation);
  std::cout << fmt::format("{}", fmt::join(tokens, " ")) << std::endl;
  return hpctrain::exit_ok;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Continues a prompt with a GPT-2 or Llama model saved in Hugging Face format."};
  Arguments arguments;
  double temperature = 1.0;
  std::int64_t top_k = 0;
  app.add_option("--model", arguments.model, "directory with config.json and model.safetensors (or shards)")->required();
  app.add_option("--prompt-ids", arguments.prompt_ids, "prompt token ids, separated by spaces or commas")->required();
  app.add_option("--max-new-tokens", arguments.generation.max_new_tokens, "tokens to generate (default 32)");
  auto* temperature_option = app.add_option("--temperature", temperature, "sample at this temperature (default: greedy)");
  auto* top_k_option = app.add_option("--top-k", top_k, "sample among the k likeliest tokens (needs --temperature)");
  app.add_option("--seed", arguments.generation.seed, "seed of the sampling generator (default 0)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? hpctrain::exit_ok : hpctrain::exit_usage;
  }
  if (temperature_option->count() > 0) arguments.generation.temperature = temperature;
  if (top_k_option->count() > 0) arguments.generation.top_k = top_k;
  try {
    return generate(arguments);
  } catch (const hpctrain::SpecError& e) {
    std::cerr << e.what() << std::endl;
    return hpctrain::exit_usage;
  } catch (const hpctrain::UsageError& e) {
    std::cerr << e.what() << std::endl;
    return hpctrain::exit_usage;
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return hpctrain::exit_failure;
  }
}
