#pragma once
// Shared by the libFuzzer targets. A target feeds bytes to one parser of outside input and lets only
// hpctrain's own errors pass: a parser that rejects bad input must say so with an `[hpctrain.…]` error
// naming the input. Anything else — another exception, a sanitizer report, a broken invariant
// (FUZZ_CHECK) — aborts, and libFuzzer saves the input as a crash.
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <hpctrain/error.hpp>

#define FUZZ_CHECK(condition)                                                                 \
  do {                                                                                        \
    if (!(condition)) {                                                                       \
      std::fprintf(stderr, "invariant broken: %s (%s:%d)\n", #condition, __FILE__, __LINE__); \
      std::abort();                                                                           \
    }                                                                                         \
  } while (false)

namespace hpctrain::fuzz {

/// Where a target that parses files writes its input: a name in the working directory, which the runners make a
/// scratch directory of the run's own (tests/fuzz/smoke_run.sh, scripts/fuzz). The name holds nothing of the process
/// (a pid in it made the error messages, and with them the coverage, differ between two runs of one seed).
inline const char* scratch_file(const char* name) { return name; }

inline std::string_view as_text(const unsigned char* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// Runs `parse`; an hpctrain::Error is an accepted rejection (its message must carry an id), anything else
/// escapes to libFuzzer, which reports an uncaught exception as a crash.
template <class F>
void expect_clean_rejection(F&& parse) {
  try {
    parse();
  } catch (const hpctrain::Error& error) {
    FUZZ_CHECK(std::string_view(error.what()).starts_with("[hpctrain."));
  }
}

}  // namespace hpctrain::fuzz
