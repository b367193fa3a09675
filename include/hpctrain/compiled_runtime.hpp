#pragma once
// Where the runtime is compiled. Header-only by default: every function is `inline` in its header, and a
// program instantiates the runtime it calls. A program that links the package's `hpctrain::runtime` library
// (CMake: `hpctrain_add_program`, docs/libtorch.md) gets HPCTRAIN_SEPARATE_RUNTIME instead: the few entry
// points below which the whole runtime sits — `run`, the Training's defaults, the language-model factories
// and hooks — are only declared in its translation unit, and defined once, out of line, in the library's
// one implementation unit (src/hpctrain_runtime.cpp, HPCTRAIN_RUNTIME_IMPLEMENTATION). The user's file then
// compiles its own code and the thin templates its description instantiates, not the Trainer, the strategies,
// the checkpoints, the tokenizers or Jinja (measured in docs/libtorch.md).
//
//   HPCTRAIN_RUNTIME_INLINE          on an entry point's declaration and definition: `inline`, or nothing when
//                                    the runtime is separate (one definition, in the implementation unit)
//   HPCTRAIN_RUNTIME_DEFINITIONS     1 where an entry point's definition is compiled: header-only programs and
//                                    the implementation unit; 0 in a program that links the library

#if defined(HPCTRAIN_SEPARATE_RUNTIME)
#define HPCTRAIN_RUNTIME_INLINE
#if defined(HPCTRAIN_RUNTIME_IMPLEMENTATION)
#define HPCTRAIN_RUNTIME_DEFINITIONS 1
#else
#define HPCTRAIN_RUNTIME_DEFINITIONS 0
#endif
#else
#define HPCTRAIN_RUNTIME_INLINE inline
#define HPCTRAIN_RUNTIME_DEFINITIONS 1
#endif
