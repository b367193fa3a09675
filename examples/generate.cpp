// Text generation from a Hugging Face-format directory (config.json + model.safetensors or shards, and
// tokenizer.json or one *.tiktoken for text), GPT-2 or Llama, on the CPU in fp32:
//   ./generate --model DIR --prompt "Once upon a time" [--max-new-tokens 32]            greedy, prints text
//   ./generate --model DIR --prompt TEXT --temperature 0.8 --top-k 40 --seed 1          sampled
//   ./generate --model DIR --prompt-ids "464 2068 7586"                                  ids in, ids out
//   ./generate --model DIR --prompt TEXT --ids                                           text in, ids out
// The prompt is encoded as transformers' tokenizer encodes it (AutoTokenizer(dir)(text): the model directory's
// post-processor and tokenizer_config.json add Llama 3's BOS, RoBERTa's <s>, ...); with --tokenizer FILE, plainly.
// Greedy decoding equals transformers' generate(do_sample=False) token for token (tests/models).
// A config or checkpoint that does not fit (corrupt safetensors, a missing tensor) exits 1 with the file,
// the tensor and the reason before any weight is used; bad usage exits 2.
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include <hpctrain/error.hpp>
#include <hpctrain/models/models.hpp>
#include <hpctrain/text/pretrained_tokenizer.hpp>  // text::load_pretrained_tokenizer, text::load_tokenizer
#include <hpctrain/text/utf8.hpp>                  // text::utf8_lossy

namespace {

namespace hm = hpctrain::models;

struct Arguments {
  std::string model;
  std::string prompt;
  std::string prompt_ids;
  std::string tokenizer;  ///< default: <model>/tokenizer.json
  bool print_ids = false;
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
    if (used != token.size() || id < 0)
      throw hpctrain::UsageError(fmt::format("--prompt-ids: \"{}\" is not a token id", token));
    ids.push_back(id);
  }
  if (ids.empty()) throw hpctrain::UsageError("--prompt-ids: no token ids");
  return ids;
}

/// The model directory's tokenizer: tokenizer.json, else its one `*.tiktoken` file (examples/gpt exports GPT-2's
/// ranks that way); with neither, tokenizer.json, which load_tokenizer then names as missing.
std::filesystem::path default_tokenizer(const std::filesystem::path& model) {
  if (std::filesystem::exists(model / "tokenizer.json")) return model / "tokenizer.json";
  std::vector<std::filesystem::path> ranks;
  if (std::filesystem::is_directory(model))
    for (const auto& entry : std::filesystem::directory_iterator(model))
      if (entry.path().extension() == ".tiktoken") ranks.push_back(entry.path());
  return ranks.size() == 1 ? ranks.front() : model / "tokenizer.json";
}

int generate(const Arguments& arguments) {
  std::optional<hpctrain::text::Tokenizer> tokenizer;
  std::vector<std::int64_t> prompt;
  if (!arguments.prompt_ids.empty()) {
    prompt = parse_ids(arguments.prompt_ids);
  } else {
    std::vector<hpctrain::text::TokenId> ids;
    if (arguments.tokenizer.empty() && std::filesystem::exists(default_tokenizer(arguments.model))) {
      const auto pretrained = hpctrain::text::load_pretrained_tokenizer(arguments.model);
      ids = pretrained.encode(arguments.prompt, /*add_special_tokens=*/true);
      tokenizer = pretrained.tokenizer();
    } else {
      const auto file =
          arguments.tokenizer.empty() ? default_tokenizer(arguments.model) : std::filesystem::path(arguments.tokenizer);
      tokenizer = hpctrain::text::load_tokenizer(file);
      ids = tokenizer->encode(arguments.prompt);
    }
    for (auto id : ids) prompt.push_back(static_cast<std::int64_t>(id));
    if (prompt.empty()) throw hpctrain::UsageError("--prompt: the text encodes to no tokens");
  }
  auto model = hm::load_pretrained(arguments.model);
  const auto vocab = model->parameters().front().size(0);  // the token embedding comes first in both families
  for (auto id : prompt)
    if (id >= vocab)
      throw hpctrain::UsageError(fmt::format("--prompt-ids: {} is not below the vocabulary size {}", id, vocab));
  const auto tokens = hm::generate(*model, prompt, arguments.generation);
  if (!tokenizer || arguments.print_ids) {
    std::cout << fmt::format("{}", fmt::join(tokens, " ")) << std::endl;
  } else {
    const std::vector<hpctrain::text::TokenId> ids(tokens.begin(), tokens.end());
    std::cout << hpctrain::text::utf8_lossy(tokenizer->decode(ids)) << std::endl;
  }
  return hpctrain::exit_ok;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Continues a prompt with a GPT-2 or Llama model saved in Hugging Face format."};
  Arguments arguments;
  double temperature = 1.0;
  std::int64_t top_k = 0;
  app.add_option("--model", arguments.model, "directory with config.json and model.safetensors (or shards)")
      ->required();
  auto* prompt = app.add_option("--prompt", arguments.prompt, "prompt text, encoded with the model's tokenizer.json");
  auto* prompt_ids =
      app.add_option("--prompt-ids", arguments.prompt_ids, "prompt token ids, separated by spaces or commas");
  prompt->excludes(prompt_ids);
  app.add_option("--tokenizer", arguments.tokenizer,
                 "tokenizer file (default: <model>/tokenizer.json, else the one <model>/*.tiktoken)");
  app.add_flag("--ids", arguments.print_ids, "print the generated ids rather than their text");
  app.add_option("--max-new-tokens", arguments.generation.max_new_tokens, "tokens to generate (default 32)");
  auto* temperature_option =
      app.add_option("--temperature", temperature, "sample at this temperature (default: greedy)");
  auto* top_k_option = app.add_option("--top-k", top_k, "sample among the k likeliest tokens (needs --temperature)");
  app.add_option("--seed", arguments.generation.seed, "seed of the sampling generator (default 0)");
  try {
    app.parse(argc, argv);
    if (prompt->count() == 0 && prompt_ids->count() == 0) throw CLI::RequiredError("--prompt or --prompt-ids");
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? hpctrain::exit_ok : hpctrain::exit_usage;
  }
  if (temperature_option->count() > 0) arguments.generation.temperature = temperature;
  if (top_k_option->count() > 0) arguments.generation.top_k = top_k;
  return hpctrain::with_exit_codes([&] { return generate(arguments); });
}
