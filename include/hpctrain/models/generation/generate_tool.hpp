#pragma once
// `generate`, text generation on the command line (examples/generate.cpp is its main): a Hugging Face-format
// directory (config.json + model.safetensors or shards, and tokenizer.json or a *.tiktoken file for text), any
// family load_pretrained reads (GPT-2, Llama, Qwen2, Mistral), on the CPU in fp32:
//   generate --model DIR --prompt "Once upon a time" [--max-new-tokens 32]            greedy, prints text
//   generate --model DIR --prompt TEXT --temperature 0.8 --top-k 40 --seed 1          sampled
//   generate --model DIR --prompt-ids "464 2068 7586"                                  ids in, ids out
//   generate --model DIR --prompt TEXT --ids                                           text in, ids out
// The prompt is encoded as transformers' tokenizer encodes it (AutoTokenizer(dir)(text): the model directory's
// post-processor and tokenizer_config.json add Llama 3's BOS, RoBERTa's <s>, ...); with --tokenizer FILE, plainly.
// Greedy decoding equals transformers' generate(do_sample=False) token for token (tests/models).
// A config or checkpoint that does not fit (corrupt safetensors, a missing tensor) exits 1 with the file, the
// tensor and the reason before any weight is used; bad usage exits 2.
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include <hpctrain/error.hpp>
#include <hpctrain/models/generation/generation.hpp>
#include <hpctrain/models/hf/hf_checkpoint.hpp>
#include <hpctrain/text/pretrained_tokenizer.hpp>  // text::load_pretrained_tokenizer, text::load_tokenizer
#include <hpctrain/text/utf8.hpp>                  // text::utf8_lossy

namespace hpctrain::models {

/// What a `generate` command line asks for.
struct GenerateCommand {
  std::filesystem::path model;  ///< the Hugging Face-format directory
  std::string prompt;           ///< the prompt as text (encoded with the tokenizer), or
  std::string prompt_ids;       ///< the prompt as token ids, separated by spaces or commas
  /// The tokenizer file, encoding plainly. Default: the model directory's, as AutoTokenizer(dir) encodes
  std::filesystem::path tokenizer;
  bool print_ids = false;        ///< print the generated ids rather than their text (always for --prompt-ids)
  GenerationOptions generation;  ///< --max-new-tokens, --temperature, --top-k, --seed
  std::string help;              ///< not empty when --help was asked: the text to print
};

/// "1 2 3" (or "1,2,3") → ids; a UsageError names the token that is not an id.
inline std::vector<std::int64_t> parse_token_ids(std::string text) {
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
    if (used != token.size() || id < 0) throw UsageError(fmt::format("--prompt-ids: \"{}\" is not a token id", token));
    ids.push_back(id);
  }
  if (ids.empty()) throw UsageError("--prompt-ids: no token ids");
  return ids;
}

/// The command line `generate ARGS...`; UsageError (exit 2) for bad usage.
inline GenerateCommand parse_generate_command(int argc, const char* const* argv) {
  GenerateCommand command;
  CLI::App app{
      "Continues a prompt with a causal language model (GPT-2, Llama, Qwen2, Mistral) saved in Hugging Face "
      "format.",
      "generate"};
  app.add_option("--model", command.model, "directory with config.json and model.safetensors (or shards)")
      ->required()
      ->type_name("DIR");
  auto* prompt = app.add_option("--prompt", command.prompt,
                                "prompt text, encoded as AutoTokenizer(DIR) encodes it (or with --tokenizer)");
  auto* prompt_ids = app.add_option("--prompt-ids", command.prompt_ids,
                                    "prompt token ids, separated by spaces or commas; the output is ids too")
                         ->type_name("IDS");
  prompt->excludes(prompt_ids);
  app.add_option("--tokenizer", command.tokenizer,
                 "encode plainly with this tokenizer.json or *.tiktoken (default: the model directory's tokenizer)")
      ->type_name("FILE");
  app.add_flag("--ids", command.print_ids, "print the generated ids rather than their text");
  auto& generation = command.generation;
  app.add_option("--max-new-tokens", generation.max_new_tokens, "tokens to generate (default 32)");
  app.add_option("--temperature", generation.temperature, "sample at this temperature (default: greedy)");
  app.add_option("--top-k", generation.top_k, "sample among the k likeliest tokens (needs --temperature)");
  app.add_option("--seed", generation.seed, "seed of the sampling generator (default 0)");
  try {
    app.parse(argc, argv);
    if (prompt->count() == 0 && prompt_ids->count() == 0) throw CLI::RequiredError("--prompt or --prompt-ids");
  } catch (const CLI::CallForHelp&) {
    command.help = app.help();
  } catch (const CLI::ParseError& error) {
    throw UsageError(error.what());
  }
  return command;
}

namespace detail {

/// The prompt's ids, and the tokenizer that decodes the output (none for --prompt-ids: ids in, ids out).
struct EncodedPrompt {
  std::vector<std::int64_t> ids;
  std::optional<text::Tokenizer> tokenizer;
};

/// Encodes the prompt as AutoTokenizer(model) does, or plainly with --tokenizer; or parses --prompt-ids.
inline EncodedPrompt encode_prompt(const GenerateCommand& command) {
  if (!command.prompt_ids.empty()) return {parse_token_ids(command.prompt_ids), std::nullopt};
  std::vector<text::TokenId> ids;
  std::optional<text::Tokenizer> tokenizer;
  if (command.tokenizer.empty()) {
    const auto pretrained = text::load_pretrained_tokenizer(command.model);
    ids = pretrained.encode(command.prompt, /*add_special_tokens=*/true);
    tokenizer = pretrained.tokenizer();
  } else {
    tokenizer = text::load_tokenizer(command.tokenizer);
    ids = tokenizer->encode(command.prompt);
  }
  if (ids.empty()) throw UsageError("--prompt: the text encodes to no tokens");
  return {std::vector<std::int64_t>(ids.begin(), ids.end()), std::move(tokenizer)};
}

}  // namespace detail

/// Loads the model, continues the prompt and writes one line to `out`: the new tokens' text, or their ids (with
/// --ids or --prompt-ids).
inline void generate_to(const GenerateCommand& command, std::ostream& out) {
  const auto prompt = detail::encode_prompt(command);
  auto model = load_pretrained(command.model);
  const auto vocabulary = model->head_weight().size(0);
  for (auto id : prompt.ids)
    if (id >= vocabulary)
      throw UsageError(fmt::format("--prompt-ids: {} is not below the vocabulary size {}", id, vocabulary));
  const auto tokens = generate(*model, prompt.ids, command.generation);
  if (!prompt.tokenizer || command.print_ids) {
    out << fmt::format("{}", fmt::join(tokens, " ")) << std::endl;
  } else {
    const std::vector<text::TokenId> ids(tokens.begin(), tokens.end());
    out << text::utf8_lossy(prompt.tokenizer->decode(ids)) << std::endl;
  }
}

/// The `generate` program: parses the command line and prints the continuation on stdout. Exit codes as every
/// hpctrain program's (with_exit_codes): 0, 2 for bad usage, 1 for a model or tokenizer that cannot be read.
inline int generate_main(int argc, const char* const* argv) {
  return with_exit_codes([&] {
    const auto command = parse_generate_command(argc, argv);
    if (!command.help.empty()) std::cout << command.help;
    else generate_to(command, std::cout);
    return exit_ok;
  });
}

}  // namespace hpctrain::models
