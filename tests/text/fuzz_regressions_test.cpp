// Regression tests for what the fuzz targets of tests/fuzz found in the text layer; each test is named
// after what broke, and its input also lives in the target's corpus (tests/fuzz/corpus/<target>/).
#include <catch2/catch.hpp>

#include <hpctrain/text/chat_template.hpp>
#include <hpctrain/text/tiktoken.hpp>

#include "text_test_support.hpp"

using Catch::Matchers::Contains;

TEST_CASE("A tiktoken rank far beyond the file's lines is refused before the vocabulary grows to it",
          "[fuzz_regression]") {
  // fuzz_tiktoken: rank 4294967294 on line 2 resized the vocabulary to 4 billion strings (an allocation of 128 GB).
  const auto path = text_test::scratch("fuzz-rank-beyond") / "ranks.tiktoken";
  text_test::write_file(path, "IQ== 0\nIg== 4294967294\n");
  CHECK_THROWS_WITH(hpctrain::text::load_tiktoken(path),
                    Contains("[hpctrain.runtime.text.tokenizer]") && Contains(path.string() + ":2") &&
                        Contains("rank 4294967294 leaves more than 2^20 ids unused"));
}

TEST_CASE("A tokenizer.json with a number beyond a double is an hpctrain error naming the file", "[fuzz_regression]") {
  // fuzz_tokenizer_json: nlohmann throws out_of_range.406 (not parse_error) for `75e545` while parsing, and it
  // escaped load_huggingface_tokenizer as a JSON library exception.
  const auto path = text_test::scratch("fuzz-number-overflow") / "tokenizer.json";
  text_test::write_file(path, R"({"model": {"type": "BPE", "vocab": {"a": 1e999}}})");
  CHECK_THROWS_WITH(hpctrain::text::load_huggingface_tokenizer(path), Contains("[hpctrain.runtime.text.tokenizer]") &&
                                                                          Contains(path.string()) &&
                                                                          Contains("not valid JSON"));
}

TEST_CASE("A template's integer beyond 64 bits is a syntax error naming the place, and int of a huge number is 0",
          "[fuzz_regression]") {
  // fuzz_chat_template: `{% if 3333...3 %}` (48 digits) let std::stoll's out_of_range escape the parser (uncaught:
  // abort).
  CHECK_THROWS_WITH(hpctrain::text::ChatTemplate::parse(
                        "x\n{% if 333333333333333333333333333333333333333333333333 %}{% endif %}", "t"),
                    Contains("[hpctrain.spec.chat_template]") && Contains("t:2:7") && Contains("does not fit 64 bits"));
  // The largest 64-bit integer still parses; a float string beyond 64 bits (or a double) converts to int's default.
  hpctrain::text::ChatRenderOptions options;
  CHECK(
      hpctrain::text::ChatTemplate::parse("{{ 9223372036854775807 }}", "t").render(nlohmann::json::array(), options) ==
      "9223372036854775807");
  CHECK(hpctrain::text::ChatTemplate::parse("{{ '1e999'|int }} {{ '1e999'|float > 1 }}", "t")
            .render(nlohmann::json::array(), options) == "0 True");
}
