// Token files: prepare_tokens writes train.tokens/val.tokens (header, uint16 or uint32, documents ended by
// the end-of-text token, a seeded split by document), deterministically whatever the thread count, and
// atomically; the header parser refuses what it must, naming the file.
#include <hpctrain/text/prepare.hpp>
#include <hpctrain/text/tiktoken.hpp>

#include "text_test_support.hpp"

using hpctrain::text::TokenId;

namespace {

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const hpctrain::Error& error) {
    return error.what();
  }
  return "(no error)";
}

/// The ids of a token file, read without the library's reader (an independent look at the bytes).
std::vector<TokenId> ids_in(const std::filesystem::path& file) {
  const auto content = text_test::read_file(file);
  const auto width = static_cast<unsigned char>(content[12]);
  std::vector<TokenId> ids;
  for (std::size_t i = hpctrain::text::token_file_header_size; i + width <= content.size(); i += width) {
    TokenId id = 0;
    for (std::size_t k = 0; k < width; ++k)
      id |= static_cast<TokenId>(static_cast<unsigned char>(content[i + k])) << (8 * k);
    ids.push_back(id);
  }
  return ids;
}

/// The fortune entries of `file` as prepare_tokens cuts them.
std::vector<std::string> fortune_entries(const std::filesystem::path& file) {
  std::vector<std::string> entries(1);
  std::istringstream in(text_test::read_file(file));
  for (std::string line; std::getline(in, line);) {
    if (line == "%") {
      entries.emplace_back();
    } else {
      entries.back() += line + (in.eof() ? "" : "\n");
    }
  }
  std::erase_if(entries, [](const std::string& entry) { return entry.empty(); });
  return entries;
}

/// A few fortune files: enough for several chunks of 64 kB.
std::vector<std::filesystem::path> some_fortunes() {
  const auto all = text_test::fortune_files();
  return {all.begin(), all.begin() + 6};
}

}  // namespace

TEST_CASE("prepare_tokens writes every fortune, ended by <|endoftext|>, split by document with a fixed seed",
          "[prepare]") {
  const auto dir = text_test::scratch("prepare-fortunes");
  const auto tokenizer = hpctrain::text::load_huggingface_tokenizer(text_test::fortunes_tokenizer());
  const auto inputs = some_fortunes();
  const auto result = hpctrain::text::prepare_tokens(
      inputs, tokenizer, dir,
      hpctrain::text::PrepareOptions().validation_fraction(0.2).chunk_bytes(64 << 10).threads(3));
  const TokenId end_of_text = *tokenizer.token_id("<|endoftext|>");

  std::vector<std::string> entries;
  for (const auto& input : inputs)
    for (auto& entry : fortune_entries(input)) entries.push_back(std::move(entry));
  CHECK(result.train_documents + result.validation_documents == entries.size());
  CHECK(result.validation_documents > entries.size() / 10);
  CHECK(result.validation_documents < entries.size() * 3 / 10);
  CHECK(result.token_bytes == 2);
  CHECK(result.threads == 3);

  // Each document's ids are the tokenizer's ids of that entry (HF-verified by the oracle tests), then end-of-text.
  std::vector<TokenId> train, validation;
  auto encoder = tokenizer.encoder();
  for (std::size_t d = 0; d < entries.size(); ++d) {
    auto& out = hpctrain::text::detail::goes_to_validation(1337, d, 0.2) ? validation : train;
    encoder.encode_ordinary(entries[d], out);
    out.push_back(end_of_text);
  }
  CHECK(ids_in(result.train) == train);
  CHECK(ids_in(result.validation) == validation);
  const auto header = hpctrain::text::read_token_file_header(result.train);
  CHECK(header.tokens == train.size());
  CHECK(header.fingerprint == tokenizer.fingerprint());
  CHECK(header.vocab_size == 4000);
  CHECK(header.end_of_text == end_of_text);
}

TEST_CASE("prepare_tokens writes the same bytes whatever the thread count and chunk size", "[prepare]") {
  const auto tokenizer = hpctrain::text::load_tiktoken(text_test::gpt2_ranks());
  const auto inputs = some_fortunes();
  const auto one = text_test::scratch("prepare-one-thread");
  const auto four = text_test::scratch("prepare-four-threads");
  hpctrain::text::prepare_tokens(inputs, tokenizer, one, hpctrain::text::PrepareOptions().threads(1));
  hpctrain::text::prepare_tokens(inputs, tokenizer, four,
                                 hpctrain::text::PrepareOptions().threads(4).chunk_bytes(10000));
  CHECK(text_test::read_file(one / "train.tokens") == text_test::read_file(four / "train.tokens"));
  CHECK(text_test::read_file(one / "val.tokens") == text_test::read_file(four / "val.tokens"));
}

TEST_CASE("A vocabulary larger than 65,536 ids is written as uint32", "[prepare]") {
  const auto dir = text_test::scratch("prepare-uint32");
  // GPT-2's ranks with the end-of-text token where Llama 3 keeps its specials: 128,001 ids.
  auto options = hpctrain::text::TiktokenOptions::gpt2();
  options.special_tokens = {{"<|end_of_text|>", 128000}};
  const auto tokenizer = hpctrain::text::load_tiktoken(text_test::gpt2_ranks(), options);
  const auto inputs = some_fortunes();
  const auto result = hpctrain::text::prepare_tokens(inputs, tokenizer, dir);
  CHECK(result.token_bytes == 4);
  const auto ids = ids_in(result.train);
  CHECK(std::count(ids.begin(), ids.end(), 128000u) == static_cast<std::ptrdiff_t>(result.train_documents));
  CHECK(hpctrain::text::read_token_file_header(result.train).token_bytes == 4);
}

TEST_CASE("A failed preparation leaves the previous token files and no temporaries", "[prepare]") {
  const auto dir = text_test::scratch("prepare-atomic");
  const auto tokenizer = hpctrain::text::load_tiktoken(text_test::gpt2_ranks());
  const auto inputs = some_fortunes();
  hpctrain::text::prepare_tokens(inputs, tokenizer, dir);
  const auto before = text_test::read_file(dir / "train.tokens");
  CHECK(hpctrain::text::tokens_prepared(inputs, tokenizer, dir));
  CHECK_FALSE(hpctrain::text::tokens_prepared(inputs, tokenizer, dir, hpctrain::text::PrepareOptions().seed(7)));

  auto with_missing = inputs;
  with_missing.push_back(dir / "missing.txt");
  CHECK(error_of([&] { hpctrain::text::prepare_tokens(with_missing, tokenizer, dir); }) ==
        fmt::format("[hpctrain.runtime.text.prepare] {}: not a readable file", (dir / "missing.txt").string()));
  CHECK(error_of([&] {
          hpctrain::text::prepare_tokens(inputs, tokenizer, dir,
                                         hpctrain::text::PrepareOptions().end_of_text("<|nope|>"));
        }) == fmt::format("[hpctrain.runtime.text.prepare] {}: has no token \"<|nope|>\" to end documents with",
                          text_test::gpt2_ranks().string()));
  CHECK(text_test::read_file(dir / "train.tokens") == before);
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir)) ++files;
  CHECK(files == 2);
}

TEST_CASE("A token-file header that is wrong is refused, naming the file and the reason", "[token_file]") {
  const std::filesystem::path file = "some/train.tokens";
  hpctrain::text::TokenFileHeader header;
  header.tokens = 10;
  header.vocab_size = 50257;
  header.fingerprint = 0xABCDEF;
  auto good = hpctrain::text::encode_token_file_header(header);
  const std::uint64_t good_size = 64 + 20;
  auto parse = [&](std::array<char, 64> bytes, std::uint64_t size, hpctrain::text::TokenFileExpectation expect = {}) {
    return error_of([&] { hpctrain::text::parse_token_file_header(bytes, size, file, expect); });
  };
  const std::string prefix = "[hpctrain.runtime.text.token_file] some/train.tokens: ";
  CHECK(parse(good, good_size) == "(no error)");
  CHECK(parse(good, good_size + 1) ==
        prefix + "the header counts 10 tokens of 2 bytes but the file holds 21 bytes after it");
  CHECK(parse(good, 30) == prefix + "30 bytes is shorter than the 64-byte header");
  CHECK(parse(good, good_size, {0x1234, std::nullopt}) ==
        prefix +
            "made by the tokenizer with fingerprint 0000000000abcdef, expected 0000000000001234 (another tokenizer)");
  CHECK(parse(good, good_size, {std::nullopt, 4}) == prefix + "2 bytes per token, expected 4");
  auto bad_magic = good;
  bad_magic[0] = 'X';
  CHECK(parse(bad_magic, good_size) == prefix + "no \"HPCTOKEN\" magic: not an hpctrain token file");
  auto bad_version = good;
  bad_version[8] = 9;
  CHECK(parse(bad_version, good_size) == prefix + "version 9 (this hpctrain reads version 1)");
  auto bad_width = good;
  bad_width[12] = 3;
  CHECK(parse(bad_width, good_size) == prefix + "3 bytes per token (2 or 4)");
  header.vocab_size = 70000;
  CHECK(parse(hpctrain::text::encode_token_file_header(header), good_size) ==
        prefix + "a vocabulary of 70000 ids does not fit 2 bytes per token");
  header.tokens = ~std::uint64_t{0} / 2;  // a count whose byte size overflows
  header.token_bytes = 4;
  CHECK(parse(hpctrain::text::encode_token_file_header(header), good_size) ==
        prefix + "the header counts 9223372036854775807 tokens of 4 bytes but the file holds 20 bytes after it");
}
