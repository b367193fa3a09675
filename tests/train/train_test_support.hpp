#pragma once
// What the train tests share: a scratch directory under the build tree.
#include <cstdlib>
#include <filesystem>
#include <string>

#include <hpctrain/job/files.hpp>  // detail::remove_tree (std::filesystem::remove_all crashes under libtorch)

namespace train_test {

/// A fresh directory under the build tree, removed first if a previous run left it.
inline std::filesystem::path scratch(const std::string& name) {
  const char* build = std::getenv("HPCTRAIN_BUILD_DIR");
  auto dir = std::filesystem::path(build ? build : "/tmp") / "train-test-scratch" / name;
  hpctrain::detail::remove_tree(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace train_test
