// The torch reader of token files made by text/prepare.hpp: uint32 ids (a vocabulary over 65,536) come
// back intact, a file from another tokenizer or width is refused naming the file.
#include <catch2/catch.hpp>

#include "train_test_support.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include <hpctrain/text/prepare.hpp>
#include <hpctrain/text/tiktoken.hpp>
#include <hpctrain/train/data/tokens.hpp>

namespace {
std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream content;
  content << in.rdbuf();
  return std::move(content).str();
}
std::filesystem::path gpt2_ranks() { return fmt::format("{}/.cache/hpctrain/gpt2.tiktoken", std::getenv("HOME")); }
}  // namespace

TEST_CASE("Tokens prepared with a vocabulary over 65,536 ids are read back as uint32 by the dataset", "[tokens]") {
  const auto dir = train_test::scratch("prepared-uint32");
  auto options = hpctrain::text::TiktokenOptions::gpt2();
  options.special_tokens = {{"<|end_of_text|>", 128000}};  // where Llama 3 keeps its specials
  const auto tokenizer = hpctrain::text::load_tiktoken(gpt2_ranks(), options);
  const std::vector<std::filesystem::path> inputs{"/usr/share/games/fortunes/computers"};
  const auto result =
      hpctrain::text::prepare_tokens(inputs, tokenizer, dir, hpctrain::text::PrepareOptions().threads(2));
  REQUIRE(result.token_bytes == 4);

  const std::int64_t context = 64;
  const auto loaded =
      hpctrain::data::tokens(result.train, context,
                             hpctrain::data::TokenFileOptions().fingerprint(tokenizer.fingerprint()).token_bytes(4))
          .load();
  const auto& dataset = dynamic_cast<const hpctrain::data::TokenDataset&>(*loaded);
  CHECK(dataset.tokens() == static_cast<std::int64_t>(result.train_tokens));
  std::vector<std::int64_t> all(static_cast<std::size_t>(dataset.size()));
  std::iota(all.begin(), all.end(), 0);
  const auto batch = dataset.batch(all);
  CHECK(batch.inputs.max().item<std::int64_t>() == 128000);
  CHECK(torch::equal(batch.inputs.flatten().slice(0, 1), batch.targets.flatten().slice(0, 0, -1)));
  // The windows decode back to the text: the first document is the first fortune of the file.
  std::vector<hpctrain::text::TokenId> first;
  for (std::int64_t i = 0; i < context; ++i)
    first.push_back(static_cast<hpctrain::text::TokenId>(batch.inputs[0][i].item<std::int64_t>()));
  const auto text = tokenizer.decode(first);
  CHECK(text.substr(0, 20) == read_text("/usr/share/games/fortunes/computers").substr(0, 20));

  CHECK(train_test::run_error([&] {
          hpctrain::data::tokens(result.train, context, hpctrain::data::TokenFileOptions().fingerprint(42)).load();
        }) ==
        fmt::format("[hpctrain.runtime.text.token_file] {}: made by the tokenizer with fingerprint {:016x}, expected "
                    "000000000000002a (another tokenizer)",
                    result.train.string(), tokenizer.fingerprint()));
  CHECK(train_test::run_error([&] {
          hpctrain::data::tokens(result.train, context, hpctrain::data::TokenFileOptions().token_bytes(2)).load();
        }) ==
        fmt::format("[hpctrain.runtime.text.token_file] {}: 4 bytes per token, expected 2", result.train.string()));
}
