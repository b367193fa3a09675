#pragma once
// Text for people to read from the bytes a byte-level tokenizer decodes to: a token may hold part of a
// character, so its bytes need not be valid UTF-8.
#include <cstddef>
#include <string>
#include <string_view>

namespace hpctrain::text {

/// `bytes` with every ill-formed UTF-8 sequence (each maximal subpart, as Unicode recommends) replaced by
/// U+FFFD: what transformers prints (Rust's String::from_utf8_lossy in HF tokenizers' decoder), since a
/// token may hold part of a character.
inline std::string utf8_lossy(std::string_view bytes) {
  constexpr std::string_view replacement = "\xEF\xBF\xBD";
  std::string out;
  std::size_t i = 0;
  while (i < bytes.size()) {
    const auto lead = static_cast<unsigned char>(bytes[i]);
    if (lead < 0x80) {
      out.push_back(bytes[i++]);
      continue;
    }
    int need = 0;
    unsigned char low = 0x80, high = 0xBF;  // the range of the first continuation byte
    if (lead >= 0xC2 && lead <= 0xDF) need = 1;
    else if (lead == 0xE0) need = 2, low = 0xA0;
    else if ((lead >= 0xE1 && lead <= 0xEC) || lead == 0xEE || lead == 0xEF) need = 2;
    else if (lead == 0xED) need = 2, high = 0x9F;
    else if (lead == 0xF0) need = 3, low = 0x90;
    else if (lead >= 0xF1 && lead <= 0xF3) need = 3;
    else if (lead == 0xF4) need = 3, high = 0x8F;
    std::size_t end = i + 1;
    int got = 0;
    while (need > 0 && got < need && end < bytes.size()) {
      const auto next = static_cast<unsigned char>(bytes[end]);
      if (next < (got == 0 ? low : 0x80) || next > (got == 0 ? high : 0xBF)) break;
      ++end;
      ++got;
    }
    if (need > 0 && got == need) {
      out.append(bytes.substr(i, end - i));
    } else {
      out.append(replacement);
    }
    i = end;
  }
  return out;
}

}  // namespace hpctrain::text
