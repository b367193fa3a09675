// build/examples/tokenize, run as a user runs it: encode agrees with HF tokenizers on text no other test
// uses, decode gives the text back, a malformed tokenizer exits non-zero naming the file, prepare writes
// the token files and says how many tokens.
#include <sys/wait.h>

#include "text_test_support.hpp"

namespace {

std::filesystem::path tool() { return text_test::build_dir() / "examples" / "tokenize"; }

/// Runs `arguments` through sh; returns the exit status.
int run_tool(const std::string& arguments) {
  const int status = std::system(fmt::format("{} {}", tool().string(), arguments).c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/// Unicode-rich lines no other test encodes.
std::string unseen_text() {
  return "Über naïve façades, the cafés' crème brûlée — ça va?\n"
         "Ελληνικά κείμενα και αριθμοί 12345 678\n"
         "Русский текст: «Привет, мир!» — 2024 г.\n"
         "日本語の文章です。中文句子，还有标点。한국어 문장입니다.\n"
         "עברית ومعها العربية 123 \xE2\x80\x8Fmixed\n"
         "emoji \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD and flags \xF0\x9F\x87\xAB\xF0\x9F\x87\xB7 \xE2\x9D\xA4\xEF\xB8\x8F\n"
         "    indented\tcode(x) { return x**2; } // YOU'LL SEE, it'd work\n"
         "\n"
         "trailing   \n"
         "<|end_of_text|> inside a line, and <|begin_of_text|>\n";
}

}  // namespace

TEST_CASE("tokenize encode agrees with HF tokenizers on unseen Unicode-rich text, and decode inverts it", "[tool]") {
  if (!std::filesystem::exists(tool())) {
    WARN("build/examples/tokenize is not built (cmake --build build --target tokenize); not checked");
    return;
  }
  const auto dir = text_test::scratch("tool-encode");
  const auto tokenizer = text_test::fortunes_split_tokenizer();
  text_test::write_file(dir / "input.txt", unseen_text());
  REQUIRE(run_tool(fmt::format("encode --tokenizer {} {} > {}", tokenizer.string(), (dir / "input.txt").string(),
                               (dir / "ids.txt").string())) == 0);
  std::vector<std::string> lines;
  std::istringstream in(unseen_text());
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  const auto expected = text_test::oracle_ids("hf", tokenizer, lines, dir);
  std::string expected_output;
  for (const auto& ids : expected) expected_output += ids + "\n";
  CHECK(text_test::read_file(dir / "ids.txt") == expected_output);

  REQUIRE(run_tool(fmt::format("decode --tokenizer {} < {} > {}", tokenizer.string(), (dir / "ids.txt").string(),
                               (dir / "decoded.txt").string())) == 0);
  CHECK(text_test::read_file(dir / "decoded.txt") == unseen_text());
}

TEST_CASE("tokenize exits non-zero naming the file for a malformed tokenizer, 2 for bad usage", "[tool]") {
  if (!std::filesystem::exists(tool())) {
    WARN("build/examples/tokenize is not built; not checked");
    return;
  }
  const auto dir = text_test::scratch("tool-errors");
  text_test::write_file(dir / "broken.json",
                        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}");
  CHECK(run_tool(fmt::format("encode --tokenizer {} < /dev/null 2> {}", (dir / "broken.json").string(),
                             (dir / "stderr.txt").string())) == 1);
  CHECK(text_test::read_file(dir / "stderr.txt") ==
        fmt::format("tokenize: [hpctrain.runtime.text.tokenizer] {}: model.merges[0]: the right token \"b\" is not in "
                    "model.vocab\n",
                    (dir / "broken.json").string()));
  CHECK(run_tool(fmt::format("prepare --tokenizer {} 2> /dev/null", (dir / "broken.json").string())) == 2);
  CHECK(run_tool("frobnicate 2> /dev/null") == 2);
}

TEST_CASE("tokenize prepare writes train.tokens and val.tokens and prints their token counts", "[tool]") {
  if (!std::filesystem::exists(tool())) {
    WARN("build/examples/tokenize is not built; not checked");
    return;
  }
  const auto dir = text_test::scratch("tool-prepare");
  REQUIRE(run_tool(fmt::format("prepare --tokenizer {} --out {} --threads 2 /usr/share/games/fortunes/computers "
                               "/usr/share/games/fortunes/science > {}",
                               text_test::gpt2_ranks().string(), (dir / "out").string(),
                               (dir / "stdout.txt").string())) == 0);
  const auto output = text_test::read_file(dir / "stdout.txt");
  CAPTURE(output);
  const auto header = [&](const char* name) {
    const auto content = text_test::read_file(dir / "out" / name);
    std::uint64_t tokens = 0;
    for (int k = 0; k < 8; ++k) tokens |= std::uint64_t{static_cast<unsigned char>(content[16 + k])} << (8 * k);
    return tokens;
  };
  CHECK_THAT(output, Catch::Contains(fmt::format("train.tokens: {} tokens in", header("train.tokens"))));
  CHECK_THAT(output, Catch::Contains(fmt::format("val.tokens: {} tokens in", header("val.tokens"))));
  CHECK_THAT(output, Catch::Contains("MB/s on 2 threads"));
  CHECK(header("train.tokens") > 10000);
}
