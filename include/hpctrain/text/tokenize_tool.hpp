#pragma once
// `tokenize`, the text/ layer on the command line (examples/tokenize.cpp is its main), without LibTorch:
//   tokenize encode  --tokenizer FILE [--special | --no-special] [TEXT_FILE...]
//       the ids of each input line (stdin when no file), space-separated, one output line per input line
//   tokenize decode  --tokenizer FILE [IDS_FILE...]
//       the reverse: each line of ids becomes the text it stands for
//   tokenize prepare --tokenizer FILE --out DIR [--documents fortunes|paragraphs|lines|file]
//                    [--validation FRACTION] [--seed N] [--threads N] [--end-of-text TOKEN]
//                    [--text-column NAME] TEXT_FILE...
//       writes DIR/train.tokens and DIR/val.tokens; prints token counts and MB/s. With --text-column the inputs are
//       datasets (JSONL; Parquet or save_to_disk folders where hpctrain::datasets is linked, as examples/tokenize
//       links it), each row's column NAME a document
// FILE is a Hugging Face tokenizer.json, or a tiktoken ranks file (`*.tiktoken`; cl100k/o200k in the name choose
// their pattern and specials, else GPT-2's). Special tokens are recognised as the reference does by default: always
// for tokenizer.json (HF), never for ranks (tiktoken's encode_ordinary). Bad usage exits 2 with the usage; an
// input or tokenizer that cannot be read exits 1 naming the file.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/text/prepare.hpp>
#include <hpctrain/text/tiktoken.hpp>

namespace hpctrain::text {

/// What a `tokenize` command line asks for.
struct TokenizeCommand {
  enum class Action { encode, decode, prepare };
  Action action = Action::encode;
  std::filesystem::path tokenizer;  ///< tokenizer.json or *.tiktoken
  /// encode: whether special tokens in the text are matched. Default: as the reference (HF yes, tiktoken no)
  std::optional<bool> special;
  std::filesystem::path out;                 ///< prepare: the directory of train.tokens and val.tokens
  PrepareOptions prepare;                    ///< prepare: documents, split, threads, end-of-text token
  std::vector<std::filesystem::path> files;  ///< the inputs; encode and decode read stdin without any
  std::string help;                          ///< not empty when --help was asked: the text to print
};

/// The usage lines a usage error prints.
inline constexpr const char* tokenize_usage =
    "usage: tokenize encode  --tokenizer FILE [--special | --no-special] [TEXT_FILE...]\n"
    "       tokenize decode  --tokenizer FILE [IDS_FILE...]\n"
    "       tokenize prepare --tokenizer FILE --out DIR [--documents fortunes|paragraphs|lines|file]\n"
    "                        [--validation FRACTION] [--seed N] [--threads N] [--end-of-text TOKEN]\n"
    "                        [--text-column NAME] TEXT_FILE...\n";

namespace detail {

/// `prepare`'s options, beside --tokenizer: where the files go and PrepareOptions' setters, which check the values.
inline void add_prepare_options(CLI::App& prepare, TokenizeCommand& command) {
  prepare.add_option("--out", command.out, "directory of train.tokens and val.tokens")->required()->type_name("DIR");
  const std::map<std::string, DocumentFormat> formats{{"fortunes", DocumentFormat::fortunes},
                                                      {"paragraphs", DocumentFormat::paragraphs},
                                                      {"lines", DocumentFormat::lines},
                                                      {"file", DocumentFormat::file}};
  prepare
      .add_option_function<std::string>(
          "--documents", [&command, formats](const std::string& name) { command.prepare.documents(formats.at(name)); },
          "how a file is cut into documents (default: fortunes)")
      ->check(CLI::IsMember({"fortunes", "paragraphs", "lines", "file"}));
  prepare
      .add_option_function<double>(
          "--validation", [&](double fraction) { command.prepare.validation_fraction(fraction); },
          "share of the documents that go to val.tokens (default: 0.05)")
      ->type_name("FRACTION");
  prepare.add_option_function<std::uint64_t>(
      "--seed", [&](std::uint64_t seed) { command.prepare.seed(seed); },
      "seed of the train/validation split (default: 1337)");
  prepare.add_option_function<std::string>(
      "--text-column", [&](const std::string& name) { command.prepare.text_column(name); },
      "read the inputs as datasets (JSONL, Parquet, a directory of shards, a save_to_disk folder), each row's column "
      "NAME a document");
  prepare.add_option_function<int>(
      "--threads", [&](int threads) { command.prepare.threads(threads); },
      "encoding threads (default: 0, every CPU of the task)");
  prepare
      .add_option_function<std::string>(
          "--end-of-text", [&](const std::string& token) { command.prepare.end_of_text(token); },
          "the token after each document (default: <|endoftext|>, <|end_of_text|>, </s> or <eos>)")
      ->type_name("TOKEN");
  prepare.add_option("TEXT_FILE", command.files, "text files")->required()->type_name("PATH");
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
    if (!in) throw RuntimeError(errors::runtime_text_input, fmt::format("{}: cannot open", file.string()));
    while (std::getline(in, line)) each(line);
  }
}

/// Writes `text` to `out`; RuntimeError when the stream refuses it (a full disk, a closed pipe).
inline void write_out(std::FILE* out, std::string_view text) {
  if (std::fwrite(text.data(), 1, text.size(), out) != text.size())
    throw RuntimeError(errors::runtime_io, "stdout: cannot write");
}

/// The ids of one line of `tokenize decode`'s input; RuntimeError naming the line when it holds anything else.
inline void parse_id_line(const std::string& line, std::size_t line_number, std::vector<TokenId>& ids) {
  ids.clear();
  std::size_t position = 0;
  while (position < line.size()) {
    if (line[position] == ' ') {
      ++position;
      continue;
    }
    TokenId id = 0;
    const auto [end, error] = std::from_chars(line.data() + position, line.data() + line.size(), id);
    if (error != std::errc{} || (end != line.data() + line.size() && *end != ' '))
      throw RuntimeError(errors::runtime_text_input,
                         fmt::format("line {}: {:?} is not a list of token ids", line_number, line.substr(0, 80)));
    ids.push_back(id);
    position = static_cast<std::size_t>(end - line.data());
  }
}

}  // namespace detail

/// The command line `tokenize ARGS...`; UsageError (exit 2) for bad usage, SpecError for a bad prepare option.
inline TokenizeCommand parse_tokenize_command(int argc, const char* const* argv) {
  using Action = TokenizeCommand::Action;
  TokenizeCommand command;
  CLI::App app{"Encodes, decodes and prepares text with a tokenizer.json or *.tiktoken file, without LibTorch.",
               "tokenize"};
  app.require_subcommand(1);
  std::vector<std::string_view> names;
  const auto add_command = [&](const char* name, Action action, const char* description) {
    names.push_back(name);
    auto* subcommand = app.add_subcommand(name, description);
    subcommand->callback([&command, action] { command.action = action; });
    subcommand->add_option("--tokenizer", command.tokenizer, "tokenizer.json, or a *.tiktoken ranks file")
        ->required()
        ->type_name("FILE");
    return subcommand;
  };
  auto* encode = add_command("encode", Action::encode, "the ids of each input line (stdin without files)");
  encode
      ->add_flag_callback(
          "--special", [&] { command.special = true; }, "match special tokens written in the text")
      ->excludes(encode->add_flag_callback(
          "--no-special", [&] { command.special = false; }, "encode special tokens as plain text"));
  encode->add_option("TEXT_FILE", command.files, "text files (default: stdin)")->type_name("PATH");
  auto* decode = add_command("decode", Action::decode, "the text of each input line of ids (stdin without files)");
  decode->add_option("IDS_FILE", command.files, "files of space-separated ids (default: stdin)")->type_name("PATH");
  detail::add_prepare_options(*add_command("prepare", Action::prepare,
                                           "DIR/train.tokens and DIR/val.tokens from "
                                           "text files"),
                              command);
  // CLI11 would answer a misspelt command with "A subcommand is required": name it instead.
  if (const std::string_view first = argc > 1 ? argv[1] : "-";
      !first.starts_with('-') && std::ranges::find(names, first) == names.end())
    throw UsageError(fmt::format("unknown command {:?}: encode, decode or prepare", first));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    command.help = app.help();
  } catch (const CLI::ParseError& error) {
    throw UsageError(error.what());
  }
  return command;
}

/// `tokenize encode`: the ids of each input line, space-separated, one line each, to `out` (64 KiB at a time).
inline void encode_lines(const TokenizeCommand& command, std::FILE* out) {
  const auto tokenizer = load_tokenizer(command.tokenizer);
  const bool ranks = command.tokenizer.extension() == ".tiktoken";
  const bool special = command.special.value_or(!ranks);  // as the reference does: HF yes, tiktoken's ranks no
  auto encoder = tokenizer.encoder();
  std::vector<TokenId> ids;
  std::string text;
  detail::for_each_line(command.files, [&](const std::string& line) {
    ids.clear();
    encoder.encode(line, ids, special);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) text += ' ';
      char digits[16];
      text.append(digits, std::to_chars(digits, digits + sizeof digits, ids[i]).ptr);
    }
    text += '\n';
    if (text.size() > (1 << 16)) {
      detail::write_out(out, text);
      text.clear();
    }
  });
  detail::write_out(out, text);
}

/// `tokenize decode`: the text of each input line of ids, one line each, to `out`.
inline void decode_lines(const TokenizeCommand& command, std::FILE* out) {
  const auto tokenizer = load_tokenizer(command.tokenizer);
  auto encoder = tokenizer.encoder();
  std::vector<TokenId> ids;
  std::size_t line_number = 0;
  detail::for_each_line(command.files, [&](const std::string& line) {
    detail::parse_id_line(line, ++line_number, ids);
    detail::write_out(out, encoder.decode(ids) + "\n");
  });
}

/// `tokenize prepare`: the token files, and to `out` their token and document counts and the speed.
inline PrepareResult prepare_files(const TokenizeCommand& command, std::FILE* out) {
  const auto tokenizer = load_tokenizer(command.tokenizer);
  const auto result = prepare_tokens(command.files, tokenizer, command.out, command.prepare);
  fmt::print(out, "{}: {} tokens in {} documents ({} bytes per token)\n", result.train.string(), result.train_tokens,
             result.train_documents, result.token_bytes);
  fmt::print(out, "{}: {} tokens in {} documents\n", result.validation.string(), result.validation_tokens,
             result.validation_documents);
  fmt::print(out, "{:.1f} MB of text in {:.2f} s: {:.1f} MB/s on {} threads\n", result.input_bytes / 1e6,
             result.seconds, result.megabytes_per_second(), result.threads);
  return result;
}

/// The `tokenize` program: parses the command line, runs the command on stdout. Exit codes as every hpctrain
/// program's: 0, 2 for bad usage (the message and the usage on stderr), 1 when a file cannot be read or written.
inline int tokenize_main(int argc, const char* const* argv) {
  try {
    const auto command = parse_tokenize_command(argc, argv);
    if (!command.help.empty()) {
      std::fputs(command.help.c_str(), stdout);
      return exit_ok;
    }
    using Action = TokenizeCommand::Action;
    if (command.action == Action::encode) encode_lines(command, stdout);
    else if (command.action == Action::decode) decode_lines(command, stdout);
    else prepare_files(command, stdout);
    if (std::fflush(stdout) != 0) throw RuntimeError(errors::runtime_io, "stdout: cannot write");
    return exit_ok;
  } catch (const UsageError& error) {
    fmt::print(stderr, "tokenize: {}\n{}", error.what(), tokenize_usage);
    return exit_usage;
  } catch (const std::exception& error) {
    fmt::print(stderr, "tokenize: {}\n", error.what());
    return exit_code_of(error);
  }
}

}  // namespace hpctrain::text
