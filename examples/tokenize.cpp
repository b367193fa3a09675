// tokenize: the text/ layer on the command line, without LibTorch.
//
//   tokenize encode  --tokenizer FILE [--special | --no-special] [TEXT_FILE...]
//       the ids of each input line (stdin when no file), space-separated, one output line per input line
//   tokenize decode  --tokenizer FILE [IDS_FILE...]
//       the reverse: each line of ids becomes the text it stands for
//   tokenize prepare --tokenizer FILE --out DIR [--documents fortunes|paragraphs|lines|file]
//                    [--validation FRACTION] [--seed N] [--threads N] [--end-of-text TOKEN] TEXT_FILE...
//       writes DIR/train.tokens and DIR/val.tokens; prints token counts and MB/s
//
// FILE is a Hugging Face tokenizer.json, or a tiktoken ranks file (`*.tiktoken`; cl100k/o200k in the name
// choose their pattern and specials, else GPT-2's). Special tokens are recognised as the reference does by
// default: always for tokenizer.json (HF), never for ranks (tiktoken's encode_ordinary).
#include <charconv>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/text/prepare.hpp>
#include <hpctrain/text/tiktoken.hpp>

namespace {

namespace text = hpctrain::text;

constexpr const char* usage =
    "usage: tokenize encode  --tokenizer FILE [--special | --no-special] [TEXT_FILE...]\n"
    "       tokenize decode  --tokenizer FILE [IDS_FILE...]\n"
    "       tokenize prepare --tokenizer FILE --out DIR [--documents fortunes|paragraphs|lines|file]\n"
    "                        [--validation FRACTION] [--seed N] [--threads N] [--end-of-text TOKEN] TEXT_FILE...\n";

struct Arguments {
  std::string command;
  std::string tokenizer;
  std::string out;
  std::optional<bool> special;
  text::PrepareOptions prepare;
  std::vector<std::filesystem::path> files;
};

template <class T>
T parse_number(const std::string& flag, const std::string& value) {
  T number{};
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
  if (error != std::errc{} || end != value.data() + value.size())
    throw hpctrain::UsageError(fmt::format("{} {:?}: not a number", flag, value));
  return number;
}

text::DocumentFormat parse_documents(const std::string& value) {
  if (value == "fortunes") return text::DocumentFormat::fortunes;
  if (value == "paragraphs") return text::DocumentFormat::paragraphs;
  if (value == "lines") return text::DocumentFormat::lines;
  if (value == "file") return text::DocumentFormat::file;
  throw hpctrain::UsageError(fmt::format("--documents {:?}: expected fortunes, paragraphs, lines or file", value));
}

Arguments parse_arguments(int argc, char** argv) {
  if (argc < 2) throw hpctrain::UsageError("no command");
  Arguments arguments;
  arguments.command = argv[1];
  if (arguments.command != "encode" && arguments.command != "decode" && arguments.command != "prepare")
    throw hpctrain::UsageError(fmt::format("unknown command {:?}", arguments.command));
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw hpctrain::UsageError(fmt::format("{} needs a value", flag));
      return argv[++i];
    };
    if (flag == "--tokenizer") arguments.tokenizer = value();
    else if (flag == "--special") arguments.special = true;
    else if (flag == "--no-special") arguments.special = false;
    else if (flag == "--out") arguments.out = value();
    else if (flag == "--documents") arguments.prepare.documents(parse_documents(value()));
    else if (flag == "--validation") {
      const auto text_value = value();
      try {
        arguments.prepare.validation_fraction(std::stod(text_value));
      } catch (const std::logic_error&) {
        throw hpctrain::UsageError(fmt::format("--validation {:?}: not a number", text_value));
      }
    } else if (flag == "--seed") arguments.prepare.seed(parse_number<std::uint64_t>(flag, value()));
    else if (flag == "--threads") arguments.prepare.threads(parse_number<int>(flag, value()));
    else if (flag == "--end-of-text") arguments.prepare.end_of_text(value());
    else if (flag.starts_with("--")) throw hpctrain::UsageError(fmt::format("unknown option {}", flag));
    else arguments.files.emplace_back(flag);
  }
  if (arguments.tokenizer.empty()) throw hpctrain::UsageError("--tokenizer FILE is required");
  if (arguments.command == "prepare" && (arguments.out.empty() || arguments.files.empty()))
    throw hpctrain::UsageError("prepare needs --out DIR and at least one TEXT_FILE");
  return arguments;
}

/// Calls `each` with every line of the files (or of stdin), without its '\n'.
template <class Each>
void for_each_line(const std::vector<std::filesystem::path>& files, Each each) {
  std::string line;
  if (files.empty()) {
    while (std::getline(std::cin, line)) each(line);
    return;
  }
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw hpctrain::RuntimeError("text.input", fmt::format("{}: cannot open", file.string()));
    while (std::getline(in, line)) each(line);
  }
}

int encode(const Arguments& arguments) {
  const auto tokenizer = text::load_tokenizer(arguments.tokenizer);
  const bool ranks = std::filesystem::path(arguments.tokenizer).extension() == ".tiktoken";
  const bool special = arguments.special.value_or(!ranks);  // as the reference does: HF yes, tiktoken's ranks no
  auto encoder = tokenizer.encoder();
  std::vector<text::TokenId> ids;
  std::string out;
  for_each_line(arguments.files, [&](const std::string& line) {
    ids.clear();
    encoder.encode(line, ids, special);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) out += ' ';
      char digits[16];
      out.append(digits, std::to_chars(digits, digits + sizeof digits, ids[i]).ptr);
    }
    out += '\n';
    if (out.size() > (1 << 16)) {
      std::fwrite(out.data(), 1, out.size(), stdout);
      out.clear();
    }
  });
  std::fwrite(out.data(), 1, out.size(), stdout);
  return std::fflush(stdout) == 0 ? hpctrain::exit_ok : hpctrain::exit_failure;
}

int decode(const Arguments& arguments) {
  const auto tokenizer = text::load_tokenizer(arguments.tokenizer);
  auto encoder = tokenizer.encoder();
  std::vector<text::TokenId> ids;
  std::size_t line_number = 0;
  for_each_line(arguments.files, [&](const std::string& line) {
    ++line_number;
    ids.clear();
    std::size_t position = 0;
    while (position < line.size()) {
      if (line[position] == ' ') {
        ++position;
        continue;
      }
      text::TokenId id = 0;
      const auto [end, error] = std::from_chars(line.data() + position, line.data() + line.size(), id);
      if (error != std::errc{} || (end != line.data() + line.size() && *end != ' '))
        throw hpctrain::RuntimeError("text.input", fmt::format("line {}: {:?} is not a list of token ids", line_number,
                                                               line.substr(0, 80)));
      ids.push_back(id);
      position = static_cast<std::size_t>(end - line.data());
    }
    const auto text_out = encoder.decode(ids) + "\n";
    std::fwrite(text_out.data(), 1, text_out.size(), stdout);
  });
  return std::fflush(stdout) == 0 ? hpctrain::exit_ok : hpctrain::exit_failure;
}

int prepare(const Arguments& arguments) {
  const auto tokenizer = text::load_tokenizer(arguments.tokenizer);
  const auto result = text::prepare_tokens(arguments.files, tokenizer, arguments.out, arguments.prepare);
  fmt::print("{}: {} tokens in {} documents ({} bytes per token)\n", result.train.string(), result.train_tokens,
             result.train_documents, result.token_bytes);
  fmt::print("{}: {} tokens in {} documents\n", result.validation.string(), result.validation_tokens,
             result.validation_documents);
  fmt::print("{:.1f} MB of text in {:.2f} s: {:.1f} MB/s on {} threads\n", result.input_bytes / 1e6, result.seconds,
             result.megabytes_per_second(), result.threads);
  return hpctrain::exit_ok;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto arguments = parse_arguments(argc, argv);
    if (arguments.command == "encode") return encode(arguments);
    if (arguments.command == "decode") return decode(arguments);
    return prepare(arguments);
  } catch (const hpctrain::UsageError& error) {
    fmt::print(stderr, "tokenize: {}\n{}", error.what(), usage);
    return hpctrain::exit_usage;
  } catch (const hpctrain::SpecError& error) {
    fmt::print(stderr, "tokenize: {}\n", error.what());
    return hpctrain::exit_usage;
  } catch (const std::exception& error) {
    fmt::print(stderr, "tokenize: {}\n", error.what());
    return hpctrain::exit_failure;
  }
}
