#pragma once
/// hpctrain's version; CMakeLists.txt reads it from here.
#define HPCTRAIN_VERSION_MAJOR 0
#define HPCTRAIN_VERSION_MINOR 1
#define HPCTRAIN_VERSION_PATCH 0
#define HPCTRAIN_VERSION_STRING "0.1.0"

namespace hpctrain {
/// The library version as "MAJOR.MINOR.PATCH".
inline constexpr const char* version = HPCTRAIN_VERSION_STRING;
}  // namespace hpctrain
