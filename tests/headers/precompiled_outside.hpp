#pragma once
// What the self-containment checks of the torch-free headers precompile (tests/headers/CMakeLists.txt): the
// heavy outside headers they include, parsed once instead of once per header. A header still has to include
// them itself: includes_what_it_uses.py checks that, since this PCH would hide a missing one.
#include <filesystem>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
