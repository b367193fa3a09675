// The runtime's one implementation unit (compiled_runtime.hpp): compiled once per build tree into
// `hpctrain::runtime`, it defines, out of line, the entry points that programs linking that library only
// declare — `run`, the Training's defaults, the language-model factories and hooks — and with them
// everything they reach: the Trainer, the strategies, checkpoints, tokenizers, Jinja, safetensors, the
// command line.
#ifndef HPCTRAIN_SEPARATE_RUNTIME
#error "compile src/hpctrain_runtime.cpp with HPCTRAIN_SEPARATE_RUNTIME (the hpctrain::runtime target does)"
#endif
#define HPCTRAIN_RUNTIME_IMPLEMENTATION
#include <hpctrain/hpctrain.hpp>
#include <hpctrain/lm/sft.hpp>

// fmt's compiled part, once for every program that links this library: the torch wheel's fmt 12 headers are the
// ones on the include path (Debian's libfmt is fmt 9), and these units see them without FMT_HEADER_ONLY
// (cmake/hpctrainRuntime.cmake), so fmt's functions are defined here and the templates format.h declares extern
// are instantiated here, as fmt's own src/format.cc does for its library.
#if defined(FMT_HEADER_ONLY)
#error "src/hpctrain_runtime.cpp defines fmt's compiled part: compile it without FMT_HEADER_ONLY (hpctrain::runtime)"
#endif
#if FMT_VERSION / 10000 != 12
#error "the instantiations below are fmt 12's: check them against that fmt's src/format.cc"
#endif
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
#if FMT_USE_LOCALE
template FMT_API locale_ref::locale_ref(const std::locale& loc);
template FMT_API auto locale_ref::get<std::locale>() const -> std::locale;
#endif
namespace detail {
template FMT_API auto dragonbox::to_decimal(float x) noexcept -> dragonbox::decimal_fp<float>;
template FMT_API auto dragonbox::to_decimal(double x) noexcept -> dragonbox::decimal_fp<double>;
template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<char>;
template FMT_API auto decimal_point_impl(locale_ref) -> char;
template FMT_API void buffer<char>::append(const char*, const char*);
template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<wchar_t>;
template FMT_API auto decimal_point_impl(locale_ref) -> wchar_t;
template FMT_API void buffer<wchar_t>::append(const wchar_t*, const wchar_t*);
}  // namespace detail
FMT_END_NAMESPACE
