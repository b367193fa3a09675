// Fuzzes encoding (text/tokenizer.hpp) with any bytes, invalid UTF-8 included: it never crashes, and
// decode(encode(x)) == x. A small byte-level BPE is built in memory (every byte, a few merges, a special
// token, GPT-2's pattern) so the target needs no file; odd-sized inputs allow special tokens.
#include <memory>
#include <string>

#include <hpctrain/text/patterns.hpp>
#include <hpctrain/text/tokenizer.hpp>

#include "fuzz_support.hpp"

namespace {
hpctrain::text::Tokenizer small_tokenizer() {
  namespace text = hpctrain::text;
  auto model = std::make_shared<text::detail::BpeModel>();
  model->source = "fuzz";
  for (int b = 0; b < 256; ++b) {
    model->bytes_of.emplace_back(1, static_cast<char>(b));
    model->id_of.emplace(model->bytes_of.back(), b);
    model->byte_token[static_cast<std::size_t>(b)] = static_cast<text::TokenId>(b);
  }
  auto merge = [&](std::string left, std::string right) {
    const auto id = static_cast<text::TokenId>(model->bytes_of.size());
    model->bytes_of.push_back(left + right);
    model->id_of.emplace(left + right, id);
    model->merges.insert(model->id_of.at(left), model->id_of.at(right), {id, id});
  };
  merge(" ", "t");
  merge("h", "e");
  merge(" t", "he");
  merge("\xC3", "\xA9");
  merge("a", "a");
  merge("aa", "aa");
  model->split.emplace(text::patterns::gpt2, text::RegexDialect::oniguruma, "fuzz");
  model->added.push_back({"<|endoftext|>", static_cast<text::TokenId>(model->bytes_of.size()), true});
  model->bytes_of.push_back("<|endoftext|>");
  text::detail::finish_model(*model, {});
  return text::Tokenizer(std::move(model));
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  static const auto tokenizer = small_tokenizer();
  static auto encoder = tokenizer.encoder();
  const auto text = hpctrain::fuzz::as_text(data, size);
  hpctrain::fuzz::expect_clean_rejection([&] {
    const auto ids = encoder.encode(text, size % 2 == 1);
    FUZZ_CHECK(encoder.decode(ids) == text);
  });
  return 0;
}
