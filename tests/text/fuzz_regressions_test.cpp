// Regression tests for what the fuzz targets of tests/fuzz found in the text layer; each test is named
// after what broke, and its input also lives in the target's corpus (tests/fuzz/corpus/<target>/).
#include <string>
#include <tuple>

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <hpctrain/text/chat_template.hpp>
#include <hpctrain/text/post_processor.hpp>
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

TEST_CASE("A template's indent beyond memory is refused, and repeating nothing any number of times is nothing",
          "[fuzz_regression]") {
  // Reading the renderer after fuzz_sft_jsonl's finding: indent(99999999999) and tojson(indent=99999999999) asked
  // for 100 GB of spaces (AddressSanitizer: out of memory); "" * 99999999999 looped forever growing nothing, and
  // "a" * 99999999999 took 50 s (ASan, -O0) to reach the 64 MiB bound a byte at a time.
  hpctrain::text::ChatRenderOptions options;
  const auto render = [&](const std::string& source) {
    return hpctrain::text::ChatTemplate::parse(source, "t").render(nlohmann::json::array(), options);
  };
  for (const auto* source : {"{{ 'a\nb'|indent(99999999999) }}", "{{ {'a': 1}|tojson(indent=99999999999) }}",
                             "{{ 'a' * 99999999999 }}", "{{ ([1] * 99999999999)|length }}"}) {
    CAPTURE(source);
    CHECK_THROWS_WITH(render(source), Catch::StartsWith("[hpctrain.") &&
                                          (Contains("exceeds 64 MiB") || Contains("the list is too long")));
  }
  CHECK(render("[{{ '' * 99999999999 }}] {{ ([] * 99999999999)|length }}") == "[] 0");
  // Repetition still repeats (jinja2: 'ab' * 3, [1, 2] * 2, and nothing for a count of 0 or below).
  CHECK(render("{{ 'ab' * 3 }} {{ [1, 2] * 2 }} [{{ 'x' * 0 }}{{ 'x' * -2 }}] {{ ('abc' * 5)|length }}") ==
        "ababab [1, 2, 1, 2] [] 15");
  CHECK(render("{{ 'a\nb'|indent(3) }}|{{ {'a': 1}|tojson(indent=2) }}") == "a\n   b|{\n  \"a\": 1\n}");
}

TEST_CASE(
    "A post-processor's id beyond 32 bits, negative or fractional, or a piece of the wrong type, is refused "
    "naming the JSON path",
    "[fuzz_regression]") {
  const auto file = text_test::scratch("bad-post-processor-ids") / "tokenizer.json";
  using Row = std::tuple<std::string, std::string>;
  auto [json, where] = GENERATE(table<std::string, std::string>({
      // 46 digits read as a double: converting it to an id was undefined (fuzz_sft_jsonl, CI's smoke run).
      Row{R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}],
              "special_tokens": {"<s>": {"ids": [7777777777777777777777777777777777777777777771]}}})",
          R"(post_processor.special_tokens["<s>"].ids[0])"},
      Row{R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}],
              "special_tokens": {"<s>": {"ids": [1, 4294967296]}}})",
          R"(post_processor.special_tokens["<s>"].ids[1])"},
      Row{R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": 5}}]})",
          "post_processor.single[0].SpecialToken"},
      Row{R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}], "special_tokens": 3})",
          "post_processor.special_tokens"},
      Row{R"({"type": "Sequence", "processors": {"a": 1}})", "post_processor.processors"},
      Row{R"({"type": "RobertaProcessing", "cls": ["<s>", -1], "sep": ["</s>", 2]})", "post_processor.cls[1]"},
      Row{R"({"type": "BertProcessing", "cls": ["[CLS]", 101], "sep": ["[SEP]", 1.5]})", "post_processor.sep[1]"},
  }));
  CAPTURE(json);
  CHECK_THROWS_WITH(
      hpctrain::text::PostProcessor::from_json(nlohmann::json::parse(json), file),
      Catch::StartsWith("[hpctrain.runtime.text.tokenizer]") && Contains(file.string()) && Contains(where));
}
