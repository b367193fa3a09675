# Finds hpctrain's dependencies; used by the build tree and by the installed package config alike.
include(CMakeFindDependencyMacro)
find_dependency(fmt)
find_dependency(CLI11)
find_dependency(nlohmann_json)
# PCRE2 (text/: the tokenizers' Unicode split patterns): Debian ships no CMake config, only libpcre2-8.pc.
# Where pkg-config is missing or does not know libpcre2-8 (the GPU image of docs/gpu.md has pkg-config but no
# -dev packages; scripts/gpu-pack carries pcre2.h and the library), find_path/find_library under
# CMAKE_PREFIX_PATH make a target of the same name.
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND AND NOT TARGET PkgConfig::HPCTRAIN_PCRE2)
  pkg_check_modules(HPCTRAIN_PCRE2 QUIET IMPORTED_TARGET GLOBAL libpcre2-8)
endif()
if(NOT TARGET PkgConfig::HPCTRAIN_PCRE2)
  find_path(HPCTRAIN_PCRE2_INCLUDE_DIR pcre2.h)
  find_library(HPCTRAIN_PCRE2_LIBRARY NAMES pcre2-8)
  if(NOT HPCTRAIN_PCRE2_INCLUDE_DIR OR NOT HPCTRAIN_PCRE2_LIBRARY)
    message(FATAL_ERROR "hpctrain: PCRE2 not found (neither pkg-config's libpcre2-8 nor pcre2.h / libpcre2-8 under "
                        "CMAKE_PREFIX_PATH): install libpcre2-dev")
  endif()
  add_library(PkgConfig::HPCTRAIN_PCRE2 INTERFACE IMPORTED GLOBAL)
  set_target_properties(PkgConfig::HPCTRAIN_PCRE2 PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${HPCTRAIN_PCRE2_INCLUDE_DIR}" INTERFACE_LINK_LIBRARIES "${HPCTRAIN_PCRE2_LIBRARY}")
endif()

if(NOT DEFINED HPCTRAIN_WITH_TORCH OR HPCTRAIN_WITH_TORCH)
  # LibTorch: from CMAKE_PREFIX_PATH (a libtorch zip, a site install) or else from the python that has
  # the torch wheel (HPCTRAIN_PYTHON, the venv scripts/setup made, or python3 on PATH).
  # A project's own set(CMAKE_CXX_STANDARD 20) reaches the CUDA probe TorchConfig compiles (Caffe2's
  # select_compute_arch try_run), for which CMake knows no "CUDA20" dialect of nvcc and stops: the probe
  # gets C++17 (the project's own targets keep their standard). Both finds need it: on a reconfigure the
  # first one finds Torch through the cached Torch_DIR.
  set(_hpctrain_cuda_standard_set OFF)
  if(DEFINED CMAKE_CXX_STANDARD AND NOT DEFINED CMAKE_CUDA_STANDARD)
    set(CMAKE_CUDA_STANDARD 17)
    set(_hpctrain_cuda_standard_set ON)
  endif()
  find_package(Torch CONFIG QUIET)
  if(NOT Torch_FOUND)
    set(_hpctrain_pythons "${HPCTRAIN_PYTHON}" "$ENV{HPCTRAIN_PYTHON}" "$ENV{HOME}/.cache/hpctrain/venv/bin/python" python3)
    foreach(_py IN LISTS _hpctrain_pythons)
      if(_py)
        execute_process(COMMAND "${_py}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
          OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc ERROR_QUIET)
        if(_rc EQUAL 0 AND _torch_prefix)
          list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
          break()
        endif()
      endif()
    endforeach()
    # TorchConfig warns about kineto and CUDA architectures; neither concerns hpctrain.
    find_dependency(Torch)
  endif()
  if(_hpctrain_cuda_standard_set)
    unset(CMAKE_CUDA_STANDARD)
  endif()
  # The torch wheel ships c10d headers but not the gloo headers ProcessGroupGloo.hpp includes; Debian's
  # libgloo-dev provides them (see docs/libtorch.md).
  # zlib: train/data/idx.hpp reads the gzipped IDX files of the MNIST family.
  find_dependency(ZLIB)
  find_path(HPCTRAIN_GLOO_INCLUDE_DIR gloo/algorithm.h PATHS ${TORCH_INCLUDE_DIRS} /usr/include)
  if(NOT HPCTRAIN_GLOO_INCLUDE_DIR)
    message(FATAL_ERROR "hpctrain: gloo headers not found (install libgloo-dev; see docs/libtorch.md)")
  endif()
  # libcurl: the W&B logger's live stream (train/loggers/http_client.hpp). Debian ships no CMake config for it:
  # CMake's own FindCURL (pkg-config's libcurl, else curl/curl.h and libcurl under CMAKE_PREFIX_PATH) makes
  # CURL::libcurl. Only hpctrain::hpctrain links it: job/, slurm/ and text/ make no HTTP request.
  # HPCTRAIN_LIVE_WANDB OFF (a build without libcurl, docs/gpu.md) looks for none.
  if((NOT DEFINED HPCTRAIN_LIVE_WANDB OR HPCTRAIN_LIVE_WANDB) AND NOT TARGET CURL::libcurl)
    find_package(CURL QUIET)
    if(NOT CURL_FOUND)
      message(FATAL_ERROR "hpctrain: libcurl not found (neither pkg-config's libcurl nor curl/curl.h / libcurl under "
                          "CMAKE_PREFIX_PATH): install libcurl4-openssl-dev")
    endif()
  endif()
endif()

# Apache Arrow and Parquet, for hpctrain::datasets (Hugging Face datasets on disk, datasets/): a system Arrow's
# CMake config where a site has one, else the pyarrow wheel's libraries and headers (as the torch wheel carries
# LibTorch), found through the same pythons. Optional: without them there is no hpctrain::datasets, and a program
# given a Parquet file says it was built without Arrow (docs/datasets.md).
if((NOT DEFINED HPCTRAIN_WITH_DATASETS OR HPCTRAIN_WITH_DATASETS) AND NOT TARGET hpctrain_arrow_libraries)
  find_package(Parquet CONFIG QUIET)
  if(Parquet_FOUND AND TARGET Parquet::parquet_shared)
    add_library(hpctrain_arrow_libraries INTERFACE IMPORTED GLOBAL)
    set_target_properties(hpctrain_arrow_libraries PROPERTIES INTERFACE_LINK_LIBRARIES "Parquet::parquet_shared")
  else()
    set(_hpctrain_pythons "${HPCTRAIN_PYTHON}" "$ENV{HPCTRAIN_PYTHON}" "$ENV{HOME}/.cache/hpctrain/venv/bin/python" python3)
    foreach(_py IN LISTS _hpctrain_pythons)
      if(NOT _py)
        continue()
      endif()
      execute_process(COMMAND "${_py}" -c "import pyarrow; print(pyarrow.get_include()); print(pyarrow.get_library_dirs()[0])"
        OUTPUT_VARIABLE _pyarrow OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc ERROR_QUIET)
      if(NOT _rc EQUAL 0)
        continue()
      endif()
      string(REPLACE "\n" ";" _pyarrow "${_pyarrow}")
      list(GET _pyarrow 0 _pyarrow_include)
      list(GET _pyarrow 1 _pyarrow_lib)
      # The wheel ships versioned names only (libarrow.so.2600): link those files themselves.
      file(GLOB _arrow_lib "${_pyarrow_lib}/libarrow.so.[0-9]*")
      file(GLOB _parquet_lib "${_pyarrow_lib}/libparquet.so.[0-9]*")
      list(SORT _arrow_lib)
      list(SORT _parquet_lib)
      if(_arrow_lib AND _parquet_lib AND EXISTS "${_pyarrow_include}/parquet/arrow/reader.h")
        list(GET _arrow_lib 0 _arrow_lib)
        list(GET _parquet_lib 0 _parquet_lib)
        add_library(hpctrain_arrow_libraries INTERFACE IMPORTED GLOBAL)
        set_target_properties(hpctrain_arrow_libraries PROPERTIES
          INTERFACE_INCLUDE_DIRECTORIES "${_pyarrow_include}" INTERFACE_LINK_LIBRARIES "${_parquet_lib};${_arrow_lib}")
        break()
      endif()
    endforeach()
  endif()
endif()
