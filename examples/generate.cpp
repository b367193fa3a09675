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
    if (used != token.size() || id < 0) throw hpctrain::UsageError(fmt::format("--prompt-ids: \"{}\" is not a token id", token));
    ids.push_back(id);
  }
  if (ids.empty()) throw hpctrain::UsageError("--prompt-ids: no token ids");
  return ids;
}

/// `bytes` with every ill-formed UTF-8 sequence (each maximal subpart, as Unicode recommends) replaced by
/// U+FFFD: what transformers prints (Rust's String::from_utf8_lossy in HF tokenizers' decoder), since a
/// token may hold part of a character.
std::string utf8_lossy(std::string_view bytes) {
  constexpr std::string_view replacement = "\xEF\xBF\xBD";
  std::string out;
  std::size_t i = 0;
  while (i < bytes.size()) {
    const auto lead = static_cast<unsigned char>(bytes[i]);
    if (lead < 0x80) {
      out.push_back(bytes[i++]);
      continue;
    }
    int need = 0;
    unsigned char low = 0x80, high = 0xBF;  // the range of the first continuation byte
    if (lead >= 0xC2 && lead <= 0xDF) need = 1;
    else if (lead == 0xE0) need = 2, low = 0xA0;
    else if ((lead >= 0xE1 && lead <= 0xEC) || lead == 0xEE || lead == 0xEF) need = 2;
    else if (lead == 0xED) need = 2, high = 0x9F;
    else if (lead == 0xF0) need = 3, low = 0x90;
    else if (lead >= 0xF1 && lead <= 0xF3) need = 3;
    else if (lead == 0xF4) need = 3, high = 0x8F;
    std::size_t end = i + 1;
    int got = 0;
    while (need > 0 && got < need && end < bytes.size()) {
      const auto next = static_cast<unsigned char>(bytes[end]);
      if (next < (got == 0 ? low : 0x80) || next > (got == 0 ? high : 0xBF)) break;
      ++end;
      ++got;
    }
    if (need > 0 && got == need) {
      out.append(bytes.substr(i, end - i));
    } else {
      out.append(replacement);
    }
    i = end;
  }
  return out;
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
      const auto file = arguments.tokenizer.empty() ? default_tokenizer(arguments.model) : std::filesystem::path(arguments.tokenizer);
      tokenizer = hpctrain::text::load_tokenizer(file);
      ids = tokenizer->encode(arguments.prompt);
    }
    for (auto id : ids) prompt.push_back(static_cast<std::int64_t>(id));
    if (prompt.empty()) throw hpctrain::UsageError("--prompt: the text encodes to no tokens");
  }
  auto model = hm::load_pretrained(arguments.model);
  const auto vocab = model->parameters().front().size(0);  // the token embedding comes first in both families
  for (auto id : prompt)
    if (id >= vocab) throw hpctrain::UsageError(fmt::format("--prompt-ids: {} is not below the vocabulary size {}", id, vocab));
  const auto tokens = hm::generate(*model, prompt, arguments.generation);
  if (!tokenizer || arguments.print_ids) {
    std::cout << fmt::format("{}", fmt::join(tokens, " ")) << std::endl;
  } else {
    const std::vector<hpctrain::text::TokenId> ids(tokens.begin(), tokens.end());
    std::cout << utf8_lossy(tokenizer->decode(ids)) << std::endl;
  }
  return hpctrain::exit_ok;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Continues a prompt with a GPT-2 or Llama model saved in Hugging Face format."};
  Arguments arguments;
  double temperature = 1.0;
  std::int64_t top_k = 0;
  app.add_option("--model", arguments.model, "directory with config.json and model.safetensors (or shards)")->required();
  auto* prompt = app.add_option("--prompt", arguments.prompt, "prompt text, encoded with the model's tokenizer.json");
  auto* prompt_ids = app.add_option("--prompt-ids", arguments.prompt_ids, "prompt token ids, separated by spaces or commas");
  prompt->excludes(prompt_ids);
  app.add_option("--tokenizer", arguments.tokenizer, "tokenizer file (default: <model>/tokenizer.json, else the one <model>/*.tiktoken)");
  app.add_flag("--ids", arguments.print_ids, "print the generated ids rather than their text");
  app.add_option("--max-new-tokens", arguments.generation.max_new_tokens, "tokens to generate (default 32)");
  auto* temperature_option = app.add_option("--temperature", temperature, "sample at this temperature (default: greedy)");
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
