// Fills the masks of a text with a RoBERTa (or BERT) model saved in Hugging Face format, as transformers'
// pipeline("fill-mask") does, on the CPU in fp32: `./fill_mask --model DIR --text "Paris is <mask>." [--top-k 5]`.
// The text is encoded as AutoTokenizer(DIR) encodes it; for each <mask> (or [MASK]), in order, one line per candidate,
// the likeliest first: `<mask> N: PROBABILITY "TOKEN" (id ID)`, ids and probabilities as the pipeline's (tests/models).
// Bad usage, or a text without a mask, exits 2; a directory that holds no such model exits 1 naming the file.
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/models/generation/fill_mask.hpp>
#include <hpctrain/text/pretrained_tokenizer.hpp>
#include <hpctrain/text/utf8.hpp>

static int fill(const std::string& model_dir, const std::string& text, std::int64_t top_k) {
  const auto tokenizer = hpctrain::text::load_pretrained_tokenizer(model_dir);
  const auto& vocabulary = tokenizer.tokenizer();
  const auto mask = vocabulary.token_id("<mask>") ? vocabulary.token_id("<mask>") : vocabulary.token_id("[MASK]");
  if (!mask) throw hpctrain::RuntimeError(hpctrain::errors::runtime_masked_lm, model_dir + ": no <mask> or [MASK]");
  const auto encoded = tokenizer.encode(text, /*add_special_tokens=*/true);
  const std::vector<std::int64_t> ids(encoded.begin(), encoded.end());
  const auto filled = hpctrain::models::fill_mask(*hpctrain::models::load_roberta(model_dir), ids, *mask, top_k);
  if (filled.empty()) throw hpctrain::UsageError(fmt::format("--text: \"{}\" holds no <mask> to fill", text));
  for (std::size_t m = 0; m < filled.size(); ++m)
    for (const auto& candidate : filled[m]) {
      const std::vector<hpctrain::text::TokenId> token{static_cast<hpctrain::text::TokenId>(candidate.id)};
      std::cout << fmt::format("<mask> {}: {:.6f} {:?} (id {})\n", m + 1, candidate.probability,
                               hpctrain::text::utf8_lossy(tokenizer.decode(token)), candidate.id);
    }
  return hpctrain::exit_ok;
}

int main(int argc, char** argv) {
  CLI::App app{"Fills the <mask> tokens of a text with a RoBERTa or BERT model saved in Hugging Face format."};
  std::string model_dir, text;
  std::int64_t top_k = 5;
  app.add_option("--model", model_dir, "directory with config.json, model.safetensors and tokenizer.json")->required();
  app.add_option("--text", text, "text with one or more <mask> tokens")->required();
  app.add_option("--top-k", top_k, "candidates per mask (default 5)")->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? hpctrain::exit_ok : hpctrain::exit_usage;
  }
  return hpctrain::with_exit_codes([&] { return fill(model_dir, text, top_k); });
}
