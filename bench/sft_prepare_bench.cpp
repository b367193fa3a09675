// The SFT preparation step's speed (text/sft_prepare.hpp): one JSONL file rendered with a chat template,
// tokenized and masked on N threads into a prepared file. bench/sft_prepare_bench runs it beside `datasets.map`
// (bench/sft_prepare_peer.py) on the same file and tokenizer.
//   hpctrain_sft_prepare_bench --jsonl F --tokenizer-dir D --chat-template T --threads N --out FILE [--repeat R]
// prints "hpctrain sft_prepare <MB/s> <examples/s> <threads> <ids> <trained ids>" (the best of R runs).
#include <cstdio>
#include <cstdlib>
#include <string>

#include <hpctrain/text/sft_prepare.hpp>

namespace tx = hpctrain::text;

int main(int argc, char** argv) {
  tx::SftRecipe recipe;
  recipe.max_length = std::int64_t{1} << 30;  // nothing cut: every id of every record, as the peer keeps them
  std::filesystem::path out;
  int threads = 0, repeat = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--jsonl") recipe.jsonl = value;
    else if (flag == "--tokenizer-dir") recipe.tokenizer_dir = value;
    else if (flag == "--chat-template") recipe.chat_template = std::filesystem::path(value);
    else if (flag == "--threads") threads = std::atoi(value.c_str());
    else if (flag == "--out") out = value;
    else if (flag == "--repeat") repeat = std::atoi(value.c_str());
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  tx::SftPrepareResult best;
  for (int r = 0; r < repeat; ++r) {
    const auto result = tx::prepare_sft_tokens(recipe, out, threads);
    if (r == 0 || result.seconds < best.seconds) best = result;
  }
  const tx::SftTokensFile prepared(out);
  std::uint64_t trained = 0;
  for (std::uint64_t i = 0; i < prepared.view().header().tokens; ++i) trained += prepared.view().trained(i);
  std::printf("hpctrain sft_prepare %.3f %.1f %d %llu %llu\n", best.megabytes_per_second(), best.examples_per_second(),
              best.threads, static_cast<unsigned long long>(best.tokens), static_cast<unsigned long long>(trained));
}
