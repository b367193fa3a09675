#pragma once
// What the train tests share: a scratch directory under the build tree, stderr captured into a string,
// Fashion-MNIST subsets (and a skip with the reason when the dataset is not installed).
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <string>

#include <hpctrain/files.hpp>  // detail::remove_tree (std::filesystem::remove_all crashes under libtorch)
#include <hpctrain/train/data/idx.hpp>
#include <hpctrain/train/data/source.hpp>

namespace train_test {

/// A fresh directory under the build tree, removed first if a previous run left it.
inline std::filesystem::path scratch(const std::string& name) {
  const char* build = std::getenv("HPCTRAIN_BUILD_DIR");
  auto dir = std::filesystem::path(build ? build : "/tmp") / "train-test-scratch" / name;
  hpctrain::detail::remove_tree(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

/// Runs `action` with file descriptor 2 going to `file`; returns what was written there.
inline std::string capture_stderr(const std::function<void()>& action, const std::filesystem::path& file) {
  std::fflush(stderr);
  const int saved = ::dup(2);
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(fd, 2);
  ::close(fd);
  try {
    action();
  } catch (...) {
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
    throw;
  }
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::ifstream in(file);
  return {std::istreambuf_iterator<char>(in), {}};
}

/// Debian's dataset-fashion-mnist.
inline const std::filesystem::path fashion_dir = "/usr/share/datasets/fashion-mnist";

/// Empty when Fashion-MNIST is installed, else why a test that needs it is skipped.
inline std::string fashion_missing() {
  if (std::filesystem::exists(fashion_dir / "train-images-idx3-ubyte.gz") &&
      std::filesystem::exists(fashion_dir / "t10k-labels-idx1-ubyte.gz"))
    return {};
  return "skipped: Fashion-MNIST is not installed at " + fashion_dir.string() + " (apt install dataset-fashion-mnist)";
}

/// The first `count` examples of a Fashion-MNIST split ("train" or "t10k"), read once per process.
inline hpctrain::data::Source fashion_subset(const std::string& split, std::int64_t count) {
  static std::map<std::string, hpctrain::data::TensorDataset> cache;
  if (!cache.count(split)) {
    const std::string dir = fashion_dir.string() + "/";
    cache[split] =
        hpctrain::data::load_idx(dir + split + "-images-idx3-ubyte.gz", dir + split + "-labels-idx1-ubyte.gz");
  }
  const auto& all = cache[split];
  return hpctrain::data::tensors(all.inputs.narrow(0, 0, count), all.targets.narrow(0, 0, count));
}

/// The message of whatever `action` throws (any std::exception), or "no error".
inline std::string run_error(const std::function<void()>& action) {
  try {
    action();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "no error";
}

}  // namespace train_test

/// Skips the rest of a test case, saying why, when Fashion-MNIST is missing (Catch2 v2 has no SKIP: the
/// reason shows as a warning and the case passes without assertions).
#define TRAIN_TEST_REQUIRE_FASHION()                                    \
  do {                                                                  \
    if (const auto why = train_test::fashion_missing(); !why.empty()) { \
      WARN(why);                                                        \
      return;                                                           \
    }                                                                   \
  } while (false)
