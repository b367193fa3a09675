#pragma once
// What the model tests share: a scratch directory under the build tree, and the transformers oracle
// (tests/models/hf_oracle.py run by the venv's python).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <hpctrain/files.hpp>  // detail::remove_tree (std::filesystem::remove_all crashes under libtorch)

namespace models_test {

/// A fresh directory under the build tree, removed first if a previous run left it.
inline std::filesystem::path scratch(const std::string& name) {
  const char* build = std::getenv("HPCTRAIN_BUILD_DIR");
  auto dir = std::filesystem::path(build ? build : "/tmp") / "models-test-scratch" / name;
  hpctrain::detail::remove_tree(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// The python with transformers: $HPCTRAIN_PYTHON, else the venv scripts/setup makes.
inline std::string python() {
  if (const char* p = std::getenv("HPCTRAIN_PYTHON"); p && *p) return p;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/hpctrain/venv/bin/python";
}

/// Runs `tests/models/<script> <arguments>` (arguments already shell-quoted); fails the test with its output.
inline void run_python(const std::string& script_name, const std::string& arguments, const std::filesystem::path& log) {
  const char* source = std::getenv("HPCTRAIN_SOURCE_DIR");
  REQUIRE(source != nullptr);
  const auto script = std::filesystem::path(source) / "tests/models" / script_name;
  INFO("the oracle needs transformers in " << python() << " (scripts/setup makes that venv)");
  REQUIRE(std::filesystem::exists(python()));
  const auto command = fmt::format("'{}' '{}' {} > '{}' 2>&1", python(), script.string(), arguments, log.string());
  const int rc = std::system(command.c_str());
  INFO(command << "\n" << read_text(log));
  REQUIRE(rc == 0);
}

/// Runs `hf_oracle.py <arguments>`.
inline void run_oracle(const std::string& arguments, const std::filesystem::path& log) {
  run_python("hf_oracle.py", arguments, log);
}

}  // namespace models_test
