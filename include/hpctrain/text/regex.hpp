#pragma once
// The pre-tokenizer's regex: PCRE2 in UTF + UCP mode (Unicode classes \p{L}, \p{N}), JIT-compiled when the
// platform has it. std::regex knows no Unicode properties, so it cannot run GPT-2's pattern at all.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <fmt/format.h>

#include <hpctrain/error.hpp>

namespace hpctrain::text {

/// Which engine a pattern was written for: their `$` and `\s` differ from PCRE2's defaults.
enum class RegexDialect {
  /// tiktoken's fancy-regex (Rust `regex` syntax): `$` is the end of the text only.
  tiktoken,
  /// Hugging Face tokenizers' Oniguruma (Ruby syntax): `^` and `$` are line anchors.
  oniguruma,
};

namespace detail {

/// The Unicode White_Space property, which `\s` means in Rust's regex and in Oniguruma. PCRE2's UCP `\s`
/// is "Z or h/v space" and misses U+0085 (NEXT LINE, category Cc), so the patterns are rewritten to say it.
inline constexpr std::string_view white_space_class_body =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

/// Rewrites `\s`/`\S` to the White_Space class (outside a bracket `[\s]` → `[...]`, inside `[^\s..]` → the
/// ranges themselves). `\S` inside a bracket cannot be spelled that way and is left as PCRE2 reads it.
inline std::string rewrite_white_space(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's') {
        out += in_class ? std::string(white_space_class_body) : fmt::format("[{}]", white_space_class_body);
      } else if (next == 'S' && !in_class) {
        out += fmt::format("[^{}]", white_space_class_body);
      } else {
        out += c;
        out += next;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

struct CodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};
struct JitStackDeleter {
  void operator()(pcre2_jit_stack* stack) const { pcre2_jit_stack_free(stack); }
};
struct MatchContextDeleter {
  void operator()(pcre2_match_context* context) const { pcre2_match_context_free(context); }
};

inline std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof buffer);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace detail

/// A compiled pattern; immutable and shareable between threads (each thread matches with its own Matcher).
class Regex {
 public:
  /// Compiles `pattern`; a bad pattern throws `[hpctrain.runtime.text.regex]` naming `where` and the offset.
  Regex(std::string_view pattern, RegexDialect dialect, std::string_view where, bool literal = false)
      : pattern_(pattern) {
    const std::string rewritten = literal ? std::string(pattern) : detail::rewrite_white_space(pattern);
    std::uint32_t options = PCRE2_UTF | PCRE2_UCP;
    if (literal) options |= PCRE2_LITERAL;
    if (dialect == RegexDialect::tiktoken) options |= PCRE2_DOLLAR_ENDONLY;
    if (dialect == RegexDialect::oniguruma) options |= PCRE2_MULTILINE;
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(), options, &error,
                                     &offset, nullptr);
    if (code == nullptr)
      throw RuntimeError(errors::runtime_text_regex,
                         fmt::format("{}: the pattern {:?} does not compile at offset {}: {}", where,
                                     std::string(pattern), offset, detail::pcre2_message(error)));
    code_ = std::shared_ptr<pcre2_code>(code, detail::CodeDeleter{});
    jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  }

  /// The pattern as given (before the White_Space rewrite).
  const std::string& pattern() const { return pattern_; }
  /// Whether PCRE2's JIT compiled it (else the interpreter runs it).
  bool jit() const { return jit_; }
  pcre2_code* code() const { return code_.get(); }

 private:
  std::string pattern_;
  std::shared_ptr<pcre2_code> code_;
  bool jit_ = false;
};

/// One thread's matching state for a Regex: match data and a JIT stack large enough for 10 kB runs.
class Matcher {
 public:
  explicit Matcher(const Regex& regex) : regex_(&regex) {
    data_.reset(pcre2_match_data_create_from_pattern(regex.code(), nullptr));
    context_.reset(pcre2_match_context_create(nullptr));
    if (regex.jit()) {
      stack_.reset(pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr));
      pcre2_jit_stack_assign(context_.get(), nullptr, stack_.get());
    }
  }

  /// Finds the next match in `subject` at or after `start`; returns false when there is none. The subject
  /// must be valid UTF-8 (the caller checked it once: PCRE2's own check would rescan it on every call).
  bool find(std::string_view subject, std::size_t start, std::size_t& begin, std::size_t& end) {
    const auto* text = reinterpret_cast<PCRE2_SPTR>(subject.data());
    const int rc =
        regex_->jit()
            ? pcre2_jit_match(regex_->code(), text, subject.size(), start, 0, data_.get(), context_.get())
            : pcre2_match(regex_->code(), text, subject.size(), start, PCRE2_NO_UTF_CHECK, data_.get(), context_.get());
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0)
      throw RuntimeError(errors::runtime_text_regex, fmt::format("matching {:?} failed at byte {}: {}",
                                                                 regex_->pattern(), start, detail::pcre2_message(rc)));
    const PCRE2_SIZE* vector = pcre2_get_ovector_pointer(data_.get());
    begin = vector[0];
    end = vector[1];
    return true;
  }

 private:
  const Regex* regex_;
  std::unique_ptr<pcre2_match_data, detail::MatchDataDeleter> data_;
  std::unique_ptr<pcre2_match_context, detail::MatchContextDeleter> context_;
  std::unique_ptr<pcre2_jit_stack, detail::JitStackDeleter> stack_;
};

}  // namespace hpctrain::text
