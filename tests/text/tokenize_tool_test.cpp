// The `tokenize` command line (text/tokenize_tool.hpp) parsed as examples/tokenize.cpp parses it: each flag lands in
// its field, bad usage is a UsageError naming the flag or command (exit 2), a bad prepare value the option's
// SpecError. tool_test.cpp runs the built program end to end.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <hpctrain/text/tokenize_tool.hpp>

namespace {

namespace text = hpctrain::text;

/// parse_tokenize_command over `arguments` (after the program's name).
text::TokenizeCommand parse(const std::vector<std::string>& arguments) {
  std::vector<const char*> argv{"tokenize"};
  for (const auto& argument : arguments) argv.push_back(argument.c_str());
  return text::parse_tokenize_command(static_cast<int>(argv.size()), argv.data());
}

/// The message of the UsageError that parsing `arguments` throws ("" when it throws none).
std::string usage_error(const std::vector<std::string>& arguments) {
  try {
    parse(arguments);
  } catch (const hpctrain::UsageError& error) {
    CHECK(error.exit_code() == hpctrain::exit_usage);
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("tokenize's command line puts each flag in its field", "[tool]") {
  using Action = text::TokenizeCommand::Action;
  auto encode = parse({"encode", "--tokenizer", "t.json", "a.txt", "b.txt"});
  CHECK(encode.action == Action::encode);
  CHECK(encode.tokenizer == "t.json");
  CHECK_FALSE(encode.special.has_value());  // as the reference does: decided by the tokenizer's kind
  CHECK(encode.files == std::vector<std::filesystem::path>{"a.txt", "b.txt"});
  CHECK(parse({"encode", "--no-special", "--tokenizer", "r.tiktoken"}).special == false);
  CHECK(parse({"encode", "--tokenizer", "r.tiktoken", "--special"}).special == true);

  const auto decode = parse({"decode", "--tokenizer", "r.tiktoken"});
  CHECK(decode.action == Action::decode);
  CHECK(decode.files.empty());  // stdin

  const auto prepare =
      parse({"prepare", "--tokenizer", "t.json", "--out", "data", "--documents", "paragraphs", "--validation", "0.25",
             "--seed", "7", "--threads", "3", "--end-of-text", "</s>", "x.txt"});
  CHECK(prepare.action == Action::prepare);
  CHECK(prepare.out == "data");
  CHECK(prepare.files == std::vector<std::filesystem::path>{"x.txt"});
  CHECK(prepare.prepare.documents_ == text::DocumentFormat::paragraphs);
  CHECK(prepare.prepare.validation_fraction_ == 0.25);
  CHECK(prepare.prepare.seed_ == 7);
  CHECK(prepare.prepare.threads_ == 3);
  CHECK(prepare.prepare.end_of_text_ == "</s>");
  const auto defaults = parse({"prepare", "--tokenizer", "t.json", "--out", "data", "x.txt"});
  CHECK(defaults.prepare.documents_ == text::PrepareOptions().documents_);
  CHECK(defaults.prepare.seed_ == text::PrepareOptions().seed_);
  CHECK(defaults.help.empty());
}

TEST_CASE("tokenize's bad usage is a UsageError naming the command or flag", "[tool]") {
  const auto [arguments, expected] = GENERATE(table<std::vector<std::string>, std::string>({
      {std::vector<std::string>{}, "[hpctrain.usage] A subcommand is required"},
      {{"frobnicate", "--tokenizer", "t.json"},
       "[hpctrain.usage] unknown command \"frobnicate\": encode, decode or prepare"},
      {{"encode"}, "[hpctrain.usage] --tokenizer is required"},
      {{"prepare", "--tokenizer", "t.json", "x.txt"}, "[hpctrain.usage] --out is required"},
      {{"prepare", "--tokenizer", "t.json", "--out", "data"}, "[hpctrain.usage] TEXT_FILE is required"},
      {{"prepare", "--tokenizer", "t.json", "--out", "d", "--documents", "novels", "x"},
       "[hpctrain.usage] --documents: novels not in {fortunes,paragraphs,lines,file}"},
      {{"prepare", "--tokenizer", "t.json", "--out", "d", "--seed", "abc", "x"},
       "[hpctrain.usage] Could not convert: --seed = abc"},
      {{"encode", "--special", "--no-special", "--tokenizer", "t.json"},
       "[hpctrain.usage] --special excludes --no-special"},
      {{"decode", "--tokenizer", "t.json", "--special"},
       "[hpctrain.usage] The following argument was not expected: --special"},
  }));
  CAPTURE(arguments);
  CHECK(usage_error(arguments) == expected);
}

TEST_CASE("tokenize prepare's values are checked by PrepareOptions, naming the option", "[tool]") {
  CHECK_THROWS_WITH(parse({"prepare", "--tokenizer", "t.json", "--out", "d", "--threads", "-1", "x"}),
                    "[hpctrain.spec.prepare.threads] prepare.threads = -1: must be 0 (all cores of the task) or more");
  CHECK_THROWS_WITH(parse({"prepare", "--tokenizer", "t.json", "--out", "d", "--validation", "1", "x"}),
                    "[hpctrain.spec.prepare.validation_fraction] prepare.validation_fraction = 1: must be in [0, 1)");
}

TEST_CASE("tokenize --help describes the command asked about", "[tool]") {
  CHECK_THAT(parse({"--help"}).help, Catch::Contains("Subcommands:") && Catch::Contains("prepare"));
  const auto prepare = parse({"prepare", "--help"}).help;
  CHECK_THAT(prepare, Catch::Contains("tokenize prepare") && Catch::Contains("--end-of-text TOKEN"));
}
