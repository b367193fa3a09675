#pragma once
// The lexer of the Jinja subset Hugging Face chat templates use (text/chat_template.hpp): the template is
// split into text, `{{ expression }}`, `{% statement %}` and `{# comment #}`, its newlines written as \n and one
// at the very end dropped, with jinja2's whitespace control as transformers configures it (trim_blocks: the
// first newline after a block or comment tag goes; lstrip_blocks: spaces and tabs before a block tag on its
// line go; `{%-`, `-%}`, `{{-`, `-}}` strip all whitespace on that side). Inside tags, tokens carry their line
// and column for error messages. Torch-free.
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>

namespace hpctrain::text::jinja {

/// Where something is in the template source (1-based).
struct Position {
  std::size_t line = 1, column = 1;
};

/// A token of an expression or statement.
struct Token {
  enum class Kind { name, string, integer, number, op, end };
  Kind kind = Kind::end;
  std::string text;
  Position at;
};

/// One piece of the template: literal text, or the tokens of an output tag or a statement tag.
struct Piece {
  enum class Kind { text, output, statement };
  Kind kind = Kind::text;
  std::string text;           ///< text pieces
  std::vector<Token> tokens;  ///< output and statement pieces (ending with Kind::end)
  Position at;
};

/// SpecError `[hpctrain.spec.chat_template]` naming `origin:line:column`.
[[noreturn]] inline void syntax_error(const std::string& origin, Position at, const std::string& reason) {
  throw SpecError(errors::spec_chat_template, fmt::format("{}:{}:{}", origin, at.line, at.column), reason);
}

namespace detail {
inline Position position_of(std::string_view source, std::size_t offset) {
  Position at;
  for (std::size_t i = 0; i < offset && i < source.size(); ++i) {
    if (source[i] == '\n') {
      ++at.line;
      at.column = 1;
    } else {
      ++at.column;
    }
  }
  return at;
}

/// `code_point` as UTF-8.
inline void append_utf8(std::string& out, std::uint32_t code_point) {
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

/// The value of a string literal's inside, as jinja2's lexer makes it: `\r\n` and `\r` become `\n`, then Python's
/// `unicode_escape` decoding — `\` followed by a newline is dropped (a literal continued over lines), `\n \t
/// \r \a \b \f \v \0`-`\777` (octal, up to three digits), `\xhh`, `\uhhhh`, `\Uhhhhhhhh` give their
/// characters, `\\ \' \"` the character itself, and any other backslash stays with its character (`\d`).
/// `\N{NAME}` (Unicode names) is refused: hpctrain carries no name table. A truncated escape is a syntax
/// error, as in jinja2.
inline std::string string_literal(std::string_view raw, Position at, const std::string& origin) {
  std::string out;
  const auto hex = [&](std::size_t from, std::size_t digits) {
    std::uint32_t value = 0;
    for (std::size_t k = from; k < from + digits; ++k) {
      const char h = k < raw.size() ? raw[k] : '\0';
      if (!std::isxdigit(static_cast<unsigned char>(h)))
        syntax_error(origin, at,
                     fmt::format("a truncated \\{}{} escape in a string", raw[from - 1], std::string(digits, 'X')));
      value = value * 16 + static_cast<std::uint32_t>(
                               std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : std::tolower(h) - 'a' + 10);
    }
    return value;
  };
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '\r') {  // jinja2 normalises newlines first: \r\n and \r become \n
      if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
      out.push_back('\n');
      continue;
    }
    if (raw[i] != '\\' || i + 1 >= raw.size()) {
      out.push_back(raw[i]);
      continue;
    }
    const char e = raw[++i];
    switch (e) {
      case '\n': break;  // backslash-newline: the literal goes on
      case '\r':
        if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
        break;
      case 'n': out.push_back('\n'); break;
      case 't': out.push_back('\t'); break;
      case 'r': out.push_back('\r'); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'v': out.push_back('\v'); break;
      case '\\':
      case '\'':
      case '"': out.push_back(e); break;
      case 'x':
        append_utf8(out, hex(i + 1, 2));
        i += 2;
        break;
      case 'u':
        append_utf8(out, hex(i + 1, 4));
        i += 4;
        break;
      case 'U': {
        const auto code_point = hex(i + 1, 8);
        if (code_point > 0x10FFFF) syntax_error(origin, at, "a \\U escape beyond U+10FFFF in a string");
        append_utf8(out, code_point);
        i += 8;
        break;
      }
      case 'N':
        syntax_error(
            origin, at,
            "a \\N{...} escape (a Unicode character name) in a string is not supported by hpctrain's chat templates");
      default:
        if (e >= '0' && e <= '7') {
          std::uint32_t value = static_cast<std::uint32_t>(e - '0');
          for (int digits = 1; digits < 3 && i + 1 < raw.size() && raw[i + 1] >= '0' && raw[i + 1] <= '7'; ++digits)
            value = value * 8 + static_cast<std::uint32_t>(raw[++i] - '0');
          append_utf8(out, value);
        } else {
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return out;
}

/// The tokens of a tag's inside, source[begin, end).
inline std::vector<Token> tokenize(std::string_view source, std::size_t begin, std::size_t end,
                                   const std::string& origin) {
  std::vector<Token> tokens;
  std::size_t i = begin;
  while (i < end) {
    const char c = source[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
      continue;
    }
    Token token;
    token.at = position_of(source, i);
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t j = i;
      while (j < end && (std::isalnum(static_cast<unsigned char>(source[j])) || source[j] == '_')) ++j;
      token.kind = Token::Kind::name;
      token.text = std::string(source.substr(i, j - i));
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      std::size_t j = i;
      while (j < end && (std::isdigit(static_cast<unsigned char>(source[j])) || source[j] == '_')) ++j;
      token.kind = Token::Kind::integer;
      if (j + 1 < end && source[j] == '.' && std::isdigit(static_cast<unsigned char>(source[j + 1]))) {
        ++j;
        while (j < end && std::isdigit(static_cast<unsigned char>(source[j]))) ++j;
        token.kind = Token::Kind::number;
      }
      for (std::size_t k = i; k < j; ++k)
        if (source[k] != '_') token.text.push_back(source[k]);
      i = j;
    } else if (c == '\'' || c == '"') {
      std::size_t j = i + 1;
      token.kind = Token::Kind::string;
      while (j < end && source[j] != c) j += source[j] == '\\' && j + 1 < end ? 2 : 1;  // an escaped quote goes on
      if (j >= end) syntax_error(origin, token.at, "an unterminated string");
      token.text = string_literal(source.substr(i + 1, j - i - 1), token.at, origin);
      i = j + 1;
    } else {
      static constexpr std::string_view two[] = {"==", "!=", "<=", ">=", "//", "**"};
      token.kind = Token::Kind::op;
      token.text = std::string(1, c);
      for (const auto op : two)
        if (source.substr(i, 2) == op) token.text = std::string(op);
      if (std::string_view("()[]{}.,:|~+-*/%<>=!").find(c) == std::string_view::npos)
        syntax_error(origin, token.at, fmt::format("unexpected character '{}'", c));
      i += token.text.size();
    }
    tokens.push_back(std::move(token));
  }
  Token last;
  last.at = position_of(source, end);
  tokens.push_back(last);
  return tokens;
}
}  // namespace detail

namespace detail {
/// Where the tag opened at `open` closes (the offset of its closing delimiter); a "}}" inside a string literal
/// of an output tag does not close it.
inline std::size_t tag_close(std::string_view source, std::size_t from, char kind) {
  const std::string_view close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
  if (kind == '#') return source.find(close, from);
  char quote = 0;
  for (std::size_t j = from; j + 1 < source.size(); ++j) {
    if (quote) {
      if (source[j] == '\\') ++j;
      else if (source[j] == quote) quote = 0;
    } else if (source[j] == '\'' || source[j] == '"') {
      quote = source[j];
    } else if (source.substr(j, 2) == close) {
      return j;
    }
  }
  return std::string_view::npos;
}
}  // namespace detail

/// Splits `source` into pieces, applying whitespace control as jinja2's lexer does.
inline std::vector<Piece> lex(std::string_view original, const std::string& origin) {
  // jinja2's lexer first writes every newline (\r\n, \r) as \n and, without keep_trailing_newline (transformers
  // leaves it off), drops one newline at the very end of the template.
  std::string normalized;
  normalized.reserve(original.size());
  for (std::size_t k = 0; k < original.size(); ++k) {
    if (original[k] != '\r') {
      normalized.push_back(original[k]);
      continue;
    }
    normalized.push_back('\n');
    if (k + 1 < original.size() && original[k + 1] == '\n') ++k;
  }
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  const std::string_view source = normalized;
  std::vector<Piece> pieces;
  bool line_starting = true;  // jinja2: the previous tag's match ended with a newline (or this is the start)
  std::size_t i = 0;
  while (i <= source.size()) {
    std::size_t open = i;
    while (
        (open = source.find('{', open)) != std::string_view::npos &&
        !(open + 1 < source.size() && (source[open + 1] == '{' || source[open + 1] == '%' || source[open + 1] == '#')))
      ++open;
    std::string text(source.substr(i, (open == std::string_view::npos ? source.size() : open) - i));
    if (open == std::string_view::npos) {
      if (!text.empty()) pieces.push_back({Piece::Kind::text, std::move(text), {}, {}});
      break;
    }
    const char kind = source[open + 1];
    const char sign = open + 2 < source.size() ? source[open + 2] : 0;
    if (sign == '-') {
      const auto last = text.find_last_not_of(" \t\r\n\f\v");
      text.erase(last == std::string::npos ? 0 : last + 1);
    } else if (sign != '+' && kind != '{') {  // lstrip_blocks
      const auto l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      if ((l_pos > 0 || line_starting) && text.find_first_not_of(" \t", l_pos) == std::string::npos) text.erase(l_pos);
    }
    if (!text.empty()) pieces.push_back({Piece::Kind::text, std::move(text), {}, {}});
    const std::size_t inner_begin = open + 2 + (sign == '-' || sign == '+' ? 1 : 0);
    const auto close_at = detail::tag_close(source, inner_begin, kind);
    if (close_at == std::string_view::npos)
      syntax_error(origin, detail::position_of(source, open),
                   fmt::format("this tag is never closed with '{}'", kind == '{'   ? "}}"
                                                                     : kind == '%' ? "%}"
                                                                                   : "#}"));
    const bool strip_after = close_at > inner_begin && source[close_at - 1] == '-';
    if (kind != '#')
      pieces.push_back({kind == '{' ? Piece::Kind::output : Piece::Kind::statement,
                        {},
                        detail::tokenize(source, inner_begin, strip_after ? close_at - 1 : close_at, origin),
                        detail::position_of(source, open)});
    i = close_at + 2;
    std::size_t consumed = 0;  // what the tag's end takes of the text after it
    if (strip_after) {
      while (i + consumed < source.size() &&
             std::string_view(" \t\r\n\f\v").find(source[i + consumed]) != std::string_view::npos)
        ++consumed;
    } else if (kind != '{') {  // trim_blocks
      if (source.substr(i, 1) == "\n") consumed = 1;
      else if (source.substr(i, 2) == "\r\n") consumed = 2;
    }
    line_starting = consumed > 0 && source[i + consumed - 1] == '\n';
    i += consumed;
  }
  return pieces;
}

}  // namespace hpctrain::text::jinja
