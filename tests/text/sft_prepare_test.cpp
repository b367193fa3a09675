// SFT data tokenized once per job (text/sft_prepare.hpp, text/sft_tokens.hpp): the prepared file holds, record for
// record, what a rank tokenizing the file itself gets (ids, masks, truncated / dropped / untrained), whatever the
// thread count; its name and header are keyed by every input, so a changed file, tokenizer, template, tools file
// or length is never reused; a malformed file is refused naming the file, the place and the reason; a failed
// preparation leaves nothing behind.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <hpctrain/text/sft_prepare.hpp>
#include <hpctrain/text/sft_tokens.hpp>

#include "text_test_support.hpp"

namespace tx = hpctrain::text;

namespace {
/// pretrained_oracle.py's llama3 tokenizer directory (made once per build tree; sft_data_test.cpp makes the same).
std::filesystem::path sft_tokenizer_dir() {
  const auto dir = text_test::cache_dir() / "pretrained";
  if (!std::filesystem::exists(dir / "expected.json")) {
    std::filesystem::create_directories(dir);
    text_test::run(fmt::format("'{}' '{}/tests/text/pretrained_oracle.py' make '{}' > '{}/make.log' 2>&1",
                               text_test::python(), text_test::source_dir().string(), dir.string(), dir.string()));
  }
  return dir / "llama3";
}

/// 60 conversations of growing length, some calling the file's tool, the last ones with a long system prompt
/// (untrained once cut); with a tools file and a template that renders tools and marks the assistant's turns.
struct SftFixture {
  std::filesystem::path dir = text_test::scratch("sft-prepare");
  tx::SftRecipe recipe;

  SftFixture() {
    std::string lines;
    for (int i = 0; i < 60; ++i) {
      std::string user = "Question " + std::to_string(i) + ":";
      for (int w = 0; w < i % 17; ++w) user += " word" + std::to_string(w);
      const std::string system = i >= 55 ? std::string(3000, 'x') : std::string("Be brief.");
      if (i % 5 == 0) {
        lines +=
            R"({"messages": [{"role": "system", "content": ")" + system + R"("}, {"role": "user", "content": ")" +
            user +
            R"("}, {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"location": "Oslo"}}}]}, )"
            R"({"role": "tool", "content": "12 °C"}, {"role": "assistant", "content": "It is 12 °C — ünïcödé."}]})"
            "\n";
      } else {
        lines += R"({"messages": [{"role": "system", "content": ")" + system + R"("}, {"role": "user", "content": ")" +
                 user + R"("}, {"role": "assistant", "content": "Answer )" + std::to_string(i * 7) + R"(."}]})" + "\n";
      }
      if (i == 30) lines += "\n";  // a blank line is no record
    }
    recipe.jsonl = dir / "train.jsonl";
    text_test::write_file(recipe.jsonl, lines);
    recipe.tools = dir / "tools.json";
    text_test::write_file(*recipe.tools,
                          R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather.", )"
                          R"("parameters": {"type": "object", "properties": {"location": {"type": "string"}}}}}])");
    recipe.tokenizer_dir = sft_tokenizer_dir();
    recipe.chat_template = text_test::source_dir() / "tests/data/chat_templates/chatml-tools-generation.jinja";
    // The length: the median of the first 55 conversations' (the long prompts' are far longer), so that about half
    // of them are cut.
    recipe.max_length = std::int64_t{1} << 30;
    std::vector<std::size_t> lengths;
    for (const auto& example : in_process()) lengths.push_back(example.ids.size());
    lengths.resize(55);
    std::sort(lengths.begin(), lengths.end());
    recipe.max_length = static_cast<std::int64_t>(lengths[lengths.size() / 2]);
  }

  /// What a rank that tokenizes the file itself gets, record by record.
  std::vector<tx::SftCutExample> in_process() const {
    const auto tokenizer = tx::load_pretrained_tokenizer(recipe.tokenizer_dir);
    const auto render = tx::sft_renderer(tokenizer, recipe.chat_template);
    tx::SftReader reader(recipe.jsonl, tx::SftJsonlOptions{recipe.tools});
    std::vector<tx::SftCutExample> out;
    for (tx::SftRecord record; reader.next(record);)
      out.push_back(
          tx::cut_sft_example(tx::tokenize_sft(record, tokenizer, &*render), recipe.max_length, recipe.drop_overlong));
    return out;
  }
};

std::string bytes_of(const std::filesystem::path& file) { return text_test::read_file(file); }

/// The prepared file's records as cut examples.
std::vector<tx::SftCutExample> read_back(const std::filesystem::path& file) {
  const tx::SftTokensFile prepared(file);
  const auto& view = prepared.view();
  std::vector<tx::SftCutExample> out;
  for (std::uint64_t r = 0; r < view.records(); ++r) {
    const auto record = view.record(r);
    tx::SftCutExample example;
    example.flags = record.flags;
    for (auto i = record.first; i < record.first + record.count; ++i) {
      example.ids.push_back(view.id(i));
      example.trained.push_back(view.trained(i));
    }
    out.push_back(example);
  }
  return out;
}

void check_same(const std::vector<tx::SftCutExample>& prepared, const std::vector<tx::SftCutExample>& expected) {
  REQUIRE(prepared.size() == expected.size());
  for (std::size_t r = 0; r < expected.size(); ++r) {
    CAPTURE(r);
    CHECK(prepared[r].flags == expected[r].flags);
    CHECK(prepared[r].ids == expected[r].ids);
    CHECK(prepared[r].trained == expected[r].trained);
  }
}

int count_flag(const std::vector<tx::SftCutExample>& examples, std::uint32_t flag) {
  return static_cast<int>(
      std::count_if(examples.begin(), examples.end(), [flag](const auto& e) { return (e.flags & flag) != 0; }));
}

/// Files of `dir` whose name starts with '.' (the writer's temporaries).
int temporaries(const std::filesystem::path& dir) {
  int found = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    found += entry.path().filename().string().starts_with(".");
  return found;
}
}  // namespace

TEST_CASE(
    "A prepared SFT file holds what a rank tokenizing the file itself gets, record for record, on any number of "
    "threads",
    "[text][sft][prepare]") {
  SftFixture fixture;
  const auto expected = fixture.in_process();
  // The fixture reaches every rule: kept, truncated, untrained once cut (a prompt longer than the length).
  const auto truncated = count_flag(expected, tx::sft_truncated), untrained = count_flag(expected, tx::sft_untrained);
  CAPTURE(truncated, untrained);
  REQUIRE(expected.size() == 60);
  CHECK(truncated >= 5 + 20);  // the long prompts and about half of the others
  CHECK(untrained >= 5);
  CHECK(count_flag(expected, tx::sft_dropped) == 0);

  const auto one = fixture.dir / "out1" / "one.sfttokens", three = fixture.dir / "out3" / "three.sfttokens";
  const auto result = tx::prepare_sft_tokens(fixture.recipe, one, 1);
  CHECK(result.records == 60);
  CHECK(result.threads == 1);
  CHECK(result.input_bytes == std::filesystem::file_size(fixture.recipe.jsonl));
  check_same(read_back(one), expected);
  // Three threads, two records each at a time: ten rounds, the last one short. The same bytes.
  tx::prepare_sft_tokens(fixture.recipe, three, 3, 2);
  CHECK(bytes_of(three) == bytes_of(one));
  CHECK(temporaries(fixture.dir / "out3") == 0);

  // Overlong::drop: the long ones left out, none truncated; the same on both paths.
  fixture.recipe.drop_overlong = true;
  const auto dropped_expected = fixture.in_process();
  CHECK(count_flag(dropped_expected, tx::sft_dropped) == truncated);
  CHECK(count_flag(dropped_expected, tx::sft_truncated) == 0);
  tx::prepare_sft_tokens(fixture.recipe, fixture.dir / "drop.sfttokens", 2);
  check_same(read_back(fixture.dir / "drop.sfttokens"), dropped_expected);
}

TEST_CASE("A prepared SFT file is keyed by every input: the file, tokenizer, template, tools and length rule",
          "[text][sft][prepare]") {
  SftFixture fixture;
  const auto tokenizer = tx::load_pretrained_tokenizer(fixture.recipe.tokenizer_dir);
  const auto digest = tx::sft_source_digest(fixture.recipe, tokenizer);
  CHECK(tx::sft_source_digest(fixture.recipe, tokenizer) == digest);  // a pure function of the inputs
  const auto file = tx::sft_tokens_path(fixture.dir / "prepare", digest);
  CHECK(file == fixture.dir / "prepare" / "sft" / fmt::format("{:016x}.sfttokens", digest));
  CHECK_FALSE(tx::sft_tokens_prepared(file, digest, tokenizer));
  tx::prepare_sft_tokens(fixture.recipe, file);
  CHECK(tx::sft_tokens_prepared(file, digest, tokenizer));
  CHECK(tx::SftTokensFile(file).view().header().source_digest == digest);
  CHECK(tx::SftTokensFile(file).view().header().fingerprint == tokenizer.tokenizer().fingerprint());

  auto changed = [&](auto change) {
    auto recipe = fixture.recipe;
    change(recipe);
    return tx::sft_source_digest(recipe, tokenizer);
  };
  CHECK(changed([](tx::SftRecipe& r) { r.max_length += 1; }) != digest);
  CHECK(changed([](tx::SftRecipe& r) { r.drop_overlong = true; }) != digest);
  CHECK(changed([](tx::SftRecipe& r) { r.tools.reset(); }) != digest);
  CHECK(changed([&](tx::SftRecipe& r) {
          r.chat_template = text_test::source_dir() / "tests/data/chat_templates/qwen2.5.jinja";
        }) != digest);
  CHECK(changed([](tx::SftRecipe& r) { r.chat_template.reset(); }) != digest);
  // The same bytes under another name are another tools file's digest only if the bytes differ.
  const auto tools_copy = fixture.dir / "tools-copy.json";
  std::filesystem::copy_file(*fixture.recipe.tools, tools_copy);
  CHECK(changed([&](tx::SftRecipe& r) { r.tools = tools_copy; }) == digest);
  text_test::write_file(tools_copy, text_test::read_file(tools_copy) + " ");
  CHECK(changed([&](tx::SftRecipe& r) { r.tools = tools_copy; }) != digest);
  // Another tokenizer directory: another tokenizer.json.
  CHECK(tx::sft_source_digest(fixture.recipe,
                              tx::load_pretrained_tokenizer(sft_tokenizer_dir().parent_path() / "plain")) != digest);
  // The JSONL file edited (a line more): another digest, and the old file is not taken for it.
  {
    std::ofstream(fixture.recipe.jsonl, std::ios::app)
        << R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})"
        << "\n";
  }
  const auto edited = tx::sft_source_digest(fixture.recipe, tokenizer);
  CHECK(edited != digest);
  CHECK_FALSE(tx::sft_tokens_prepared(file, edited, tokenizer));
}

TEST_CASE("A malformed prepared SFT file is refused naming the file, the place and the reason",
          "[text][sft][prepare]") {
  SftFixture fixture;
  const auto file = fixture.dir / "good.sfttokens";
  const auto result = tx::prepare_sft_tokens(fixture.recipe, file, 2);
  const auto good = bytes_of(file);
  const auto tokens = result.tokens;
  REQUIRE(good.size() == 64 + 5 * tokens + 16 * result.records);
  const auto bad = fixture.dir / "bad.sfttokens";
  auto refused = [&](std::string bytes, const std::string& message) {
    text_test::write_file(bad, bytes);
    CAPTURE(message);
    CHECK_THROWS_WITH(tx::SftTokensFile(bad),
                      Catch::StartsWith("[hpctrain.runtime.text.sft_tokens] " + bad.string() + ": " + message));
  };
  refused(good.substr(0, 40), "header: 40 bytes is shorter than the 64-byte header");
  refused("HPCTOKEN" + good.substr(8), "header: no \"HPCSFTOK\" magic");
  auto version = good;
  version[8] = 2;
  refused(version, "header: version 2 (this hpctrain reads version 1)");
  refused(good.substr(0, good.size() - 1),
          fmt::format("header: {} records and {} tokens need", result.records, tokens));
  auto id = good;
  for (int k = 0; k < 4; ++k) id[64 + 4 * 3 + k] = static_cast<char>(0x7F);  // id 3: 0x7F7F7F7F
  refused(id, "id 3: 2139062143 is outside the vocabulary of 400");
  auto mask = good;
  mask[64 + 4 * tokens + 5] = 2;
  refused(mask, "mask 5: 2 (0 or 1)");
  auto flags = good;
  flags[64 + 5 * tokens + 16 * 1 + 12] = 8;
  refused(flags, "record 1: unknown flags 0x8");
  auto order = good;
  order[64 + 5 * tokens + 16 * 2] ^= 1;  // record 2 starts one id off
  refused(order, "record 2: starts at id");
  CHECK_NOTHROW(tx::SftTokensFile(file));
  // A file that does not parse is never taken for prepared: the step makes it again.
  const auto tokenizer = tx::load_pretrained_tokenizer(fixture.recipe.tokenizer_dir);
  CHECK_FALSE(tx::sft_tokens_prepared(bad, tx::sft_source_digest(fixture.recipe, tokenizer), tokenizer));
}

TEST_CASE("A preparation that fails on a bad record names its line and leaves no file, not even a temporary",
          "[text][sft][prepare]") {
  SftFixture fixture;
  {
    std::ofstream(fixture.recipe.jsonl, std::ios::app) << R"({"messages": [{"role": "user", "content": "no reply"}]})"
                                                       << "\n";
  }
  const auto out = fixture.dir / "out" / "x.sfttokens";
  CHECK_THROWS_WITH(tx::prepare_sft_tokens(fixture.recipe, out, 3, 4),
                    Catch::StartsWith("[hpctrain.spec.data.jsonl] " + fixture.recipe.jsonl.string() + ":62: "));
  CHECK_FALSE(std::filesystem::exists(out));
  CHECK(temporaries(fixture.dir / "out") == 0);
}
