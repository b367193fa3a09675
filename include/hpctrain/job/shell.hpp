#pragma once
// Quoting for the two languages a job script speaks: bash (every user string on an `export`, `srun` or
// `module` line) and sbatch's own `#SBATCH` parser, which is not a shell: it reads double quotes and
// backslash escapes, treats an unquoted `#` as a comment and ends a value at the end of the line.
#include <string>
#include <string_view>

namespace hpctrain {

namespace detail {
inline bool is_plain_shell_word(std::string_view text) {
  if (text.empty()) return false;
  for (char c : text) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                       c == '-' || c == '.' || c == '/' || c == ':' || c == ',' || c == '@' || c == '%' || c == '+' ||
                       c == '=';
    if (!plain) return false;
  }
  return true;
}
}  // namespace detail

/// One bash word that reads back as `text`, byte for byte: bare when it holds only safe characters,
/// else single-quoted (inside single quotes bash expands nothing; a `'` is written as `'\''`).
inline std::string shell_quote(std::string_view text) {
  if (detail::is_plain_shell_word(text)) return std::string(text);
  std::string quoted = "'";
  for (char c : text) {
    if (c == '\'') quoted += "'\\''";
    else quoted += c;
  }
  quoted += '\'';
  return quoted;
}

/// A value for an `#SBATCH --key=value` line, quoted the way sbatch's directive parser reads it
/// (double quotes, `\"` and `\\`). The value must hold no newline: Job's setters reject those.
inline std::string sbatch_quote(std::string_view text) {
  bool plain = detail::is_plain_shell_word(text);
  if (plain) return std::string(text);
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  quoted += '"';
  return quoted;
}

/// True when `text` can stand on one `#SBATCH` line (no newline, carriage return or NUL).
inline bool fits_on_one_line(std::string_view text) {
  return text.find_first_of(std::string_view("\n\r\0", 3)) == std::string_view::npos;
}

}  // namespace hpctrain
