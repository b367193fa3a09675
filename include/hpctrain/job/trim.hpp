#pragma once
// Text without its leading and trailing blanks: what a command printed (sbatch's job id, squeue's line, an error
// message) and a site file's settings are read through.
#include <string>
#include <string_view>

namespace hpctrain::detail {

/// `text` without leading and trailing spaces, tabs, carriage returns and newlines.
inline std::string trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return "";
  const auto last = text.find_last_not_of(" \t\r\n");
  return std::string(text.substr(first, last - first + 1));
}

}  // namespace hpctrain::detail
