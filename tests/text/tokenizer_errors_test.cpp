// A bad tokenizer file fails to load with an error naming the file, the place and the reason; a loader
// returns a Tokenizer only once everything was read and checked, so nothing half-loaded is ever used.
#include <nlohmann/json.hpp>

#include <hpctrain/text/tiktoken.hpp>

#include "text_test_support.hpp"

namespace {

std::string load_error(const std::function<void()>& load) {
  try {
    load();
  } catch (const hpctrain::Error& error) {
    return error.what();
  }
  return "(no error)";
}

/// The fortunes tokenizer.json with `edit` applied.
std::filesystem::path edited_tokenizer(const std::filesystem::path& dir,
                                       const std::function<void(nlohmann::json&)>& edit) {
  auto root = nlohmann::json::parse(text_test::read_file(text_test::fortunes_tokenizer()));
  edit(root);
  const auto path = dir / "tokenizer.json";
  text_test::write_file(path, root.dump());
  return path;
}

}  // namespace

TEST_CASE("A tokenizer.json hpctrain would not encode as HF does is refused, naming the file, the place and the reason",
          "[errors][hf]") {
  const auto dir = text_test::scratch("errors-hf");
  using Edit = std::function<void(nlohmann::json&)>;
  const auto [edit, expected] = GENERATE(table<Edit, std::string>({
      {[](nlohmann::json& j) {
         j["model"] = {{"type", "WordPiece"}, {"vocab", nlohmann::json::object()}};
       },
       "model.type: model type \"WordPiece\" is not supported (byte-level BPE only)"},
      {[](nlohmann::json& j) {
         j["model"] = {{"type", "Unigram"}, {"vocab", nlohmann::json::array()}};
       },
       "model.type: model type \"Unigram\" is not supported (byte-level BPE only)"},
      {[](nlohmann::json& j) {
         j["model"]["merges"][3] = {"\xC4\xA0", "zzz"};
       },
       "model.merges[3]: the right token \"zzz\" is not in model.vocab"},
      {[](nlohmann::json& j) { j["model"]["merges"][5] = "a"; },
       "model.merges[5]: \"a\" is not two tokens separated by one space"},
      {[](nlohmann::json& j) { j["model"]["merges"][7] = 12; },
       "model.merges[7]: expected \"a b\" or [\"a\", \"b\"], got 12"},
      {[](nlohmann::json& j) { j["model"]["vocab"]["oops"] = -1; }, "model.vocab[\"oops\"]: id -1 is not a token id"},
      {[](nlohmann::json& j) { j["model"].erase("vocab"); }, "model.vocab: missing or not an object"},
      {[](nlohmann::json& j) { j["model"]["vocab"]["far"] = 4000000000u; },
       "model.vocab[\"far\"]: id 4000000000 leaves more than 2^20 ids unused (ids count tokens from 0)"},
      {[](nlohmann::json& j) { j["added_tokens"][0]["id"] = 3000000000u; },
       "added_tokens[0]: id 3000000000 leaves more than 2^20 ids unused (ids count tokens from 0)"},
      {[](nlohmann::json& j) { j["model"]["byte_fallback"] = true; },
       "model.byte_fallback: byte_fallback (SentencePiece-style BPE) is not supported"},
      {[](nlohmann::json& j) {
         j["normalizer"] = {{"type", "NFC"}};
       },
       "normalizer: normalizer NFC is not supported (byte-level BPE takes the text as it is)"},
      {[](nlohmann::json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "pre_tokenizer: pre-tokenizer type \"Whitespace\" is not supported (ByteLevel, Split, Sequence)"},
      {[](nlohmann::json& j) { j["pre_tokenizer"] = nullptr; },
       "pre_tokenizer: no ByteLevel pre-tokenizer: not a byte-level BPE"},
      {[](nlohmann::json& j) {
         j["pre_tokenizer"] = {
             {"type", "Sequence"},
             {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Removed"}}}}};
       },
       "pre_tokenizer.pretokenizers[0]: Split behavior \"Removed\" is not supported (only \"Isolated\")"},
      {[](nlohmann::json& j) { j["added_tokens"][0]["lstrip"] = true; },
       "added_tokens[0]: lstrip = true is not supported for added tokens"},
  }));
  const auto path = edited_tokenizer(dir, edit);
  CHECK(load_error([&] { hpctrain::text::load_huggingface_tokenizer(path); }) ==
        fmt::format("[hpctrain.runtime.text.tokenizer] {}: {}", path.string(), expected));
}

TEST_CASE("A truncated or malformed tokenizer.json names the file and the byte where JSON breaks", "[errors][hf]") {
  const auto dir = text_test::scratch("errors-json");
  const auto path = dir / "truncated.json";
  text_test::write_file(path, text_test::read_file(text_test::fortunes_tokenizer()).substr(0, 700));
  CHECK_THAT(
      load_error([&] { hpctrain::text::load_huggingface_tokenizer(path); }),
      Catch::StartsWith(fmt::format("[hpctrain.runtime.text.tokenizer] {}: byte 701: not valid JSON", path.string())));
  text_test::write_file(path, "[1, 2]");
  CHECK(load_error([&] { hpctrain::text::load_huggingface_tokenizer(path); }) ==
        fmt::format("[hpctrain.runtime.text.tokenizer] {}: not a tokenizer.json (the top level is not an object)",
                    path.string()));
  CHECK(load_error([&] { hpctrain::text::load_huggingface_tokenizer(dir / "missing.json"); }) ==
        fmt::format("[hpctrain.runtime.text.tokenizer] {}: cannot open: No such file or directory",
                    (dir / "missing.json").string()));
  const auto bad_regex = edited_tokenizer(dir, [](nlohmann::json& j) {
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}},
                            {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  });
  CHECK_THAT(
      load_error([&] { hpctrain::text::load_huggingface_tokenizer(bad_regex); }),
      Catch::StartsWith(fmt::format(
          "[hpctrain.runtime.text.regex] {}: pre_tokenizer: the pattern \"(unclosed\" does not compile at offset 9",
          bad_regex.string())));
}

TEST_CASE("A tiktoken ranks file with a bad line is refused, naming the file and the line", "[errors][tiktoken]") {
  const auto dir = text_test::scratch("errors-ranks");
  // Every byte with its own rank, then the line under test.
  std::string all_bytes;
  static const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int b = 0; b < 256; ++b) all_bytes += fmt::format("{}{}== {}\n", alphabet[b >> 2], alphabet[(b & 3) << 4], b);
  const auto [line, expected] = GENERATE(table<std::string, std::string>({
      {"aGk=", "257: \"aGk=\" is not `base64 rank`"},
      {"aGk= 300 1", "257: \"aGk= 300 1\" is not `base64 rank`"},
      {"a*k= 300", "257: \"a*k=\" is not base64"},
      {"aGk= three", "257: rank \"three\" is not a token id"},
      {"aGk= 7", "257: rank 7 appears twice"},
      {"QQ== 300", "257: the token \"A\" appears twice"},
  }));
  const auto path = dir / "bad.tiktoken";
  text_test::write_file(path, all_bytes + line + "\n");
  CHECK(load_error([&] { hpctrain::text::load_tiktoken(path); }) ==
        fmt::format("[hpctrain.runtime.text.tokenizer] {}:{}", path.string(), expected));
}

TEST_CASE("A ranks file without every single byte, or a special token on a rank, is refused", "[errors][tiktoken]") {
  const auto dir = text_test::scratch("errors-ranks-bytes");
  const auto path = dir / "few.tiktoken";
  text_test::write_file(path, "QQ== 0\nQg== 1\n");
  CHECK(load_error([&] { hpctrain::text::load_tiktoken(path); }) ==
        fmt::format("[hpctrain.runtime.text.tokenizer] {}: the single byte 0x00 has no rank: every byte must",
                    path.string()));
  auto options = hpctrain::text::TiktokenOptions::gpt2();
  options.special_tokens["<|x|>"] = 100;
  CHECK(load_error([&] { hpctrain::text::load_tiktoken(text_test::gpt2_ranks(), options); }) ==
        fmt::format(
            "[hpctrain.runtime.text.tokenizer] {}: special token \"<|x|>\" has id 100, which is a rank in the file",
            text_test::gpt2_ranks().string()));
}

TEST_CASE("Decoding an id outside the vocabulary names the id", "[errors]") {
  const auto tokenizer = hpctrain::text::load_tiktoken(text_test::gpt2_ranks());
  const std::vector<hpctrain::text::TokenId> ids{31373, 50300};
  CHECK(load_error([&] { tokenizer.decode(ids); }) ==
        fmt::format("[hpctrain.runtime.text.decode] {}: token id 50300 is not in the vocabulary (size 50257)",
                    text_test::gpt2_ranks().string()));
}
