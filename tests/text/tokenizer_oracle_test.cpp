// Oracle tests: ids identical to Hugging Face `tokenizers` (tokenizer.json) and to `tiktoken` (ranks) on
// the whole fortunes corpus, line by line, and on a table of hostile strings; decode(encode(x)) == x.
#include <nlohmann/json.hpp>

#include <hpctrain/text/tiktoken.hpp>

#include "text_test_support.hpp"

using hpctrain::text::Tokenizer;

namespace {

/// Compares our ids with the reference's, input by input, and checks the round trip.
void check_against_oracle(const Tokenizer& tokenizer, const std::string& kind, const std::filesystem::path& file,
                          const std::vector<std::string>& inputs, bool allow_special, const std::string& scratch_name,
                          bool adds_prefix_space = false) {
  const auto expected = text_test::oracle_ids(kind, file, inputs, text_test::scratch(scratch_name));
  REQUIRE(expected.size() == inputs.size());
  auto encoder = tokenizer.encoder();
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const auto ids = encoder.encode(inputs[i], allow_special);
    if (text_test::joined(ids) != expected[i] && ++mismatches <= 5) {
      CAPTURE(i, text_test::hex(inputs[i]).substr(0, 200), expected[i].substr(0, 300));
      CHECK(text_test::joined(ids).substr(0, 300) == expected[i].substr(0, 300));
    }
    // add_prefix_space puts a space before text that has none (HF's decode keeps it too).
    const bool prefixed = adds_prefix_space && !inputs[i].empty() && inputs[i][0] != ' ';
    const auto original = prefixed ? " " + inputs[i] : inputs[i];
    if (encoder.decode(ids) != original && ++mismatches <= 5) {
      CAPTURE(i, text_test::hex(original).substr(0, 200));
      CHECK(text_test::hex(encoder.decode(ids)).substr(0, 200) == text_test::hex(original).substr(0, 200));
    }
  }
  CHECK(mismatches == 0);
}

/// The same tokenizer.json with its merges rewritten in the older "a b" string form and ignore_merges on.
std::filesystem::path string_merges_variant() {
  const auto path = text_test::cache_dir() / "fortunes-bpe-string-merges.json";
  auto root = nlohmann::json::parse(text_test::read_file(text_test::fortunes_tokenizer()));
  for (auto& merge : root["model"]["merges"]) merge = merge[0].get<std::string>() + " " + merge[1].get<std::string>();
  root["model"]["ignore_merges"] = true;
  text_test::write_file(path, root.dump());
  return path;
}

/// The same tokenizer.json with ByteLevel(add_prefix_space=true), as RoBERTa-style tokenizers have it.
std::filesystem::path prefix_space_variant() {
  const auto path = text_test::cache_dir() / "fortunes-bpe-prefix-space.json";
  auto root = nlohmann::json::parse(text_test::read_file(text_test::fortunes_tokenizer()));
  root["pre_tokenizer"]["add_prefix_space"] = true;
  text_test::write_file(path, root.dump());
  return path;
}

}  // namespace

TEST_CASE("A tokenizer.json with add_prefix_space encodes the fortunes corpus as HF does", "[oracle][hf]") {
  const auto file = prefix_space_variant();
  check_against_oracle(hpctrain::text::load_huggingface_tokenizer(file), "hf", file, text_test::fortune_lines(), true,
                       "hf-prefix-space", true);
}

TEST_CASE("A tokenizer.json trained by HF tokenizers encodes the whole fortunes corpus as HF does", "[oracle][hf]") {
  const auto file = text_test::fortunes_tokenizer();
  check_against_oracle(hpctrain::text::load_huggingface_tokenizer(file), "hf", file, text_test::fortune_lines(), true,
                       "hf-fortunes");
}

TEST_CASE("A Llama 3 shaped tokenizer.json (Split regex, ignore_merges) encodes the fortunes corpus as HF does",
          "[oracle][hf]") {
  const auto file = text_test::fortunes_split_tokenizer();
  check_against_oracle(hpctrain::text::load_huggingface_tokenizer(file), "hf", file, text_test::fortune_lines(), true,
                       "hf-split-fortunes");
}

TEST_CASE("A tokenizer.json encodes hostile strings as HF does, in both merge forms and both pre-tokenizer shapes",
          "[oracle][hf]") {
  const auto file =
      GENERATE(text_test::fortunes_tokenizer(), string_merges_variant(), text_test::fortunes_split_tokenizer());
  CAPTURE(file);
  check_against_oracle(hpctrain::text::load_huggingface_tokenizer(file), "hf", file, text_test::hostile_strings(), true,
                       "hf-hostile");
}

TEST_CASE("GPT-2's tiktoken ranks encode the whole fortunes corpus as tiktoken does", "[oracle][tiktoken]") {
  const auto file = text_test::gpt2_ranks();
  check_against_oracle(hpctrain::text::load_tiktoken(file), "tiktoken", file, text_test::fortune_lines(), false,
                       "tiktoken-fortunes");
}

TEST_CASE("GPT-2's ranks encode hostile strings as tiktoken does, special tokens only when allowed",
          "[oracle][tiktoken]") {
  const auto file = text_test::gpt2_ranks();
  const auto tokenizer = hpctrain::text::load_tiktoken(file);
  check_against_oracle(tokenizer, "tiktoken", file, text_test::hostile_strings(), false, "tiktoken-hostile");
  check_against_oracle(tokenizer, "tiktoken-special", file, text_test::hostile_strings(), true, "tiktoken-special");
  CHECK(tokenizer.encode("<|endoftext|>", true) == std::vector<hpctrain::text::TokenId>{50256});
  CHECK(tokenizer.encode("<|endoftext|>", false).size() > 1);
}
