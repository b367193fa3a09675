// Encode speed of text/ on a corpus, single-threaded, and prepare_tokens speed on every core of the task.
// bench/tokenize_bench runs it beside tiktoken and HF tokenizers (bench/tokenize_peer.py) on the same files.
//
//   hpctrain_tokenize_bench --tokenizer FILE [--repeat N] [--prepare-out DIR] TEXT_FILE...
//
// Each file is encoded as one string (so per-call overhead is nothing for anyone); each repetition starts
// with a fresh Encoder, so the piece cache is cold at the start of every timed run. Prints one line per
// measurement: `hpctrain encode <MB/s> <tokens>` and `hpctrain prepare <MB/s> <threads>`.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/text/prepare.hpp>
#include <hpctrain/text/tiktoken.hpp>

int main(int argc, char** argv) {
  std::string tokenizer_file, prepare_out;
  int repeat = 3;
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    if (argument == "--tokenizer" && i + 1 < argc) tokenizer_file = argv[++i];
    else if (argument == "--repeat" && i + 1 < argc) repeat = std::stoi(argv[++i]);
    else if (argument == "--prepare-out" && i + 1 < argc) prepare_out = argv[++i];
    else files.emplace_back(argument);
  }
  if (tokenizer_file.empty() || files.empty()) {
    fmt::print(stderr,
               "usage: hpctrain_tokenize_bench --tokenizer FILE [--repeat N] [--prepare-out DIR] TEXT_FILE...\n");
    return 2;
  }
  try {
    const auto tokenizer = hpctrain::text::load_tokenizer(tokenizer_file);
    std::vector<std::string> texts;
    std::size_t bytes = 0;
    for (const auto& file : files) {
      std::ifstream in(file, std::ios::binary);
      std::ostringstream content;
      content << in.rdbuf();
      texts.push_back(std::move(content).str());
      bytes += texts.back().size();
    }
    double best = 1e30;
    std::size_t tokens = 0;
    for (int r = 0; r < repeat; ++r) {
      auto encoder = tokenizer.encoder();  // cold cache every repetition
      std::vector<hpctrain::text::TokenId> ids;
      const auto start = std::chrono::steady_clock::now();
      for (const auto& text : texts) encoder.encode_ordinary(text, ids);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      best = std::min(best, seconds);
      tokens = ids.size();
    }
    fmt::print("hpctrain encode {:.2f} {}\n", bytes / 1e6 / best, tokens);
    if (!prepare_out.empty()) {
      const auto result = hpctrain::text::prepare_tokens(files, tokenizer, prepare_out,
                                                         hpctrain::text::PrepareOptions().chunk_bytes(256 << 10));
      fmt::print("hpctrain prepare {:.2f} {}\n", result.megabytes_per_second(), result.threads);
    }
  } catch (const std::exception& error) {
    fmt::print(stderr, "{}\n", error.what());
    return 1;
  }
  return 0;
}
