# The runtime compiled once per build tree (include/hpctrain/compiled_runtime.hpp). Included by the top-level
# CMakeLists.txt and by the installed package's hpctrainConfig.cmake, so a user's build tree compiles the
# runtime's implementation unit once, for all its programs, with its own compiler flags.
#
#   hpctrain::runtime                      a static library of that unit; linking it defines
#                                          HPCTRAIN_SEPARATE_RUNTIME for the program (hpctrain::hpctrain with it)
#   hpctrain_add_program(<target> [DATASETS] <source>...)
#                                          an executable of the sources linking hpctrain::runtime: its files
#                                          compile their own code, not the Trainer's (docs/libtorch.md: figures)

# hpctrain_add_runtime_library(<implementation unit>): the hpctrain::runtime target, once per build tree.
function(hpctrain_add_runtime_library source)
  if(TARGET hpctrain_runtime)
    return()
  endif()
  add_library(hpctrain_runtime STATIC ${source})
  # Built when a program links it, not by `all` (a project that never calls hpctrain_add_program pays nothing).
  set_target_properties(hpctrain_runtime PROPERTIES EXCLUDE_FROM_ALL ON)
  target_link_libraries(hpctrain_runtime PUBLIC hpctrain::hpctrain)
  target_compile_definitions(hpctrain_runtime PUBLIC HPCTRAIN_SEPARATE_RUNTIME)
  # fmt's compiled part (the torch wheel's fmt 12) is in this library's unit, once: it and every target that links
  # it see fmt without FMT_HEADER_ONLY (hpctrain::hpctrain's definition reads this property), so a program's unit
  # does not compile fmt's formatting code (about 2.4 s of examples/sft.cpp's 15.5 s at -O3, docs/libtorch.md).
  set_target_properties(hpctrain_runtime PROPERTIES HPCTRAIN_COMPILED_FMT ON INTERFACE_HPCTRAIN_COMPILED_FMT ON)
  set_property(TARGET hpctrain_runtime APPEND PROPERTY COMPATIBLE_INTERFACE_BOOL HPCTRAIN_COMPILED_FMT)
  add_library(hpctrain::runtime ALIAS hpctrain_runtime)
endfunction()

# hpctrain_add_program(<target> [DATASETS] <source>...): an executable whose sources see the runtime's entry points
# declared only, linked with hpctrain::runtime where they are compiled; DATASETS links hpctrain::datasets too
# (its data may be Parquet or Arrow: docs/datasets.md).
function(hpctrain_add_program target)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "DATASETS" "" "")
  add_executable(${target} ${ARG_UNPARSED_ARGUMENTS})
  target_link_libraries(${target} PRIVATE hpctrain::runtime)
  if(ARG_DATASETS)
    if(NOT TARGET hpctrain::datasets)
      message(FATAL_ERROR "hpctrain_add_program(${target} DATASETS): hpctrain::datasets needs Apache Arrow, found "
                          "neither a system Arrow (ArrowConfig.cmake) nor the pyarrow wheel (docs/datasets.md)")
    endif()
    target_link_libraries(${target} PRIVATE hpctrain::datasets)
  endif()
endfunction()
