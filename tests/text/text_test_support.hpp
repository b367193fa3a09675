#pragma once
// Shared by tests/text: the fortunes corpus, the reference tokenizers (oracle.py in the venv) and the
// tokenizer files they use, made at test time and cached under the build directory (never in git).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>  // getpid

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <hpctrain/text/tokenizer.hpp>

namespace text_test {

inline std::filesystem::path source_dir() { return std::getenv("HPCTRAIN_SOURCE_DIR"); }
inline std::filesystem::path build_dir() { return std::getenv("HPCTRAIN_BUILD_DIR"); }

/// A fresh scratch directory under the build tree.
inline std::filesystem::path scratch(const std::string& name) {
  const auto dir = build_dir() / "test-scratch" / "text" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

/// The cache of made tokenizer files (kept between runs: training one takes seconds).
inline std::filesystem::path cache_dir() {
  const auto dir = build_dir() / "text-cache";
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::string python() {
  if (const char* python = std::getenv("HPCTRAIN_PYTHON"); python != nullptr && *python != '\0') return python;
  return fmt::format("{}/.cache/hpctrain/venv/bin/python", std::getenv("HOME"));
}

inline std::filesystem::path oracle_script() { return source_dir() / "tests" / "text" / "oracle.py"; }

/// The fortune files (entries separated by `%` lines) that make up the test corpus.
inline std::vector<std::filesystem::path> fortune_files() {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator("/usr/share/games/fortunes"))
    if (entry.is_regular_file() && !entry.path().has_extension()) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream content;
  content << in.rdbuf();
  return std::move(content).str();
}

inline void write_file(const std::filesystem::path& path, std::string_view content) {
  std::ofstream(path, std::ios::binary) << content;
}

inline void run(const std::string& command) {
  INFO(command);
  REQUIRE(std::system(command.c_str()) == 0);
}

/// A tokenizer.json trained by HF `tokenizers` on fortunes (vocab 4000), made once by oracle.py `command`.
inline std::filesystem::path trained_tokenizer(const std::string& command_name, const std::string& file_name) {
  const auto path = cache_dir() / file_name;
  if (!std::filesystem::exists(path)) {
    // A temporary per process: ctest may run two tests that both want it.
    const auto temporary = fmt::format("{}.tmp.{}", path.string(), ::getpid());
    std::string command = fmt::format("{} {} {} {}", python(), oracle_script().string(), command_name, temporary);
    for (const auto& file : fortune_files()) command += " " + file.string();
    run(command);
    std::filesystem::rename(temporary, path);
  }
  return path;
}

/// GPT-2 shaped: ByteLevel(use_regex=true) pre-tokenizer, `<|endoftext|>` = 0.
inline std::filesystem::path fortunes_tokenizer() { return trained_tokenizer("train", "fortunes-bpe.json"); }

/// Llama 3 shaped: Split(Llama 3's regex) then ByteLevel(use_regex=false), ignore_merges, two specials.
inline std::filesystem::path fortunes_split_tokenizer() {
  return trained_tokenizer("train-split", "fortunes-bpe-split.json");
}

/// GPT-2's ranks (scripts/setup extracts them from the openai-whisper sdist).
inline std::filesystem::path gpt2_ranks() {
  return fmt::format("{}/.cache/hpctrain/gpt2.tiktoken", std::getenv("HOME"));
}

inline std::string hex(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) out += fmt::format("{:02x}", static_cast<unsigned char>(c));
  return out;
}

/// The reference's ids for each input (kind: "hf", "tiktoken" or "tiktoken-special").
inline std::vector<std::string> oracle_ids(const std::string& kind, const std::filesystem::path& tokenizer,
                                           const std::vector<std::string>& inputs, const std::filesystem::path& dir) {
  std::string hexed;
  for (const auto& input : inputs) hexed += hex(input) + "\n";
  write_file(dir / "oracle-in.txt", hexed);
  run(fmt::format("{} {} encode {} {} {} {}", python(), oracle_script().string(), kind, tokenizer.string(),
                  (dir / "oracle-in.txt").string(), (dir / "oracle-out.txt").string()));
  std::vector<std::string> lines;
  std::istringstream out(read_file(dir / "oracle-out.txt"));
  for (std::string line; std::getline(out, line);) lines.push_back(line);
  return lines;
}

inline std::string joined(const std::vector<hpctrain::text::TokenId>& ids) {
  return fmt::format("{}", fmt::join(ids, " "));
}

/// Every line of every fortune file (without its newline).
inline std::vector<std::string> fortune_lines() {
  std::vector<std::string> lines;
  for (const auto& file : fortune_files()) {
    std::istringstream in(read_file(file));
    for (std::string line; std::getline(in, line);) lines.push_back(line);
  }
  return lines;
}

/// Strings that break naive tokenizers.
inline std::vector<std::string> hostile_strings() {
  std::vector<std::string> strings = {
      "",
      " ",
      "e\xCC\x81t\xC3\xA9 a\xCC\x8A\xCC\x81",                                                   // combining marks
      "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 family",        // emoji ZWJ
      "\xE6\xBC\xA2\xE5\xAD\x97\xE3\x81\xA8\xE3\x81\x8B\xE3\x81\xAA \xED\x95\x9C\xEA\xB8\x80",  // CJK, Hangul
      "\xD7\xA9\xD7\x9C\xD7\x95\xD7\x9D \xD8\xB3\xD9\x84\xD8\xA7\xD9\x85 \xE2\x80\x8F!",        // RTL, RLM
      "line one\r\nline two\r\n\r\n",
      "\ttab\t\tand  spaces   \t ",
      std::string("nul\0inside\0", 11),
      "\xFF\xFE invalid \xC3 utf8 \xE2\x82 end \xF0\x9F",  // invalid UTF-8
      "\x80\x80\x80",
      "a\xC0\xAF"
      "b\xED\xA0\x80"
      "c",  // overlong, surrogate
      std::string(10000, 'a'),
      std::string(10000, ' '),
      "I's it't we're they've I'm we'll he'd",
      "I'S IT'T WE'RE THEY'VE I'M WE'LL HE'D",
      "don't DON'T Don'T 'tis ''s",
      "numbers 1234567 3.14159 1,000,000 \xD9\xA3\xD9\xA4",
      "next\xC2\x85line no\xC2\xA0"
      "break \xE3\x80\x80ideographic",  // U+0085, U+00A0, U+3000
      "trailing spaces   \n   ",
      "   leading",
      "<|endoftext|> between <|endoftext|>",
      "x<|endoftext|>y <|endoftext",
      "\xFF<|endoftext|>\xFE x\xC3<|endoftext|>",  // invalid bytes around a special token
      "\xE2\x80\xA8sep\xE2\x80\xA9para",
      "ﬁ ligature ＡＢＣ fullwidth \xF0\x9D\x90\x80 math",
  };
  return strings;
}

}  // namespace text_test
