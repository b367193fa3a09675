// Regression tests for what the fuzz targets of tests/fuzz found in the train layer; each test is named
// after what broke, and its input also lives in the target's corpus (tests/fuzz/corpus/<target>/).
#include <torch/torch.h>

#include <catch2/catch.hpp>

#include "train_test_support.hpp"

#include <fstream>
#include <string>

#include <hpctrain/train/data/idx.hpp>

using Catch::Matchers::Contains;

TEST_CASE("IDX dimensions whose product overflows are refused naming the file", "[fuzz_regression]") {
  // fuzz_idx: 2^21 x 2^21 x 2^22 wrapped to 0 in 64 bits and matched a file with no data; torch::empty then
  // failed on the real shape with a LibTorch error instead of ours.
  const auto path = train_test::scratch("idx-overflow") / "images-idx3-ubyte";
  std::ofstream(path, std::ios::binary) << std::string("\0\0\x08\x03\0\x20\0\0\0\x20\0\0\0\x40\0\0", 16);
  CHECK_THROWS_WITH(hpctrain::data::read_idx(path, 3),
                    Contains("[hpctrain.runtime.data.idx]") && Contains(path.string()) && Contains("2097152x2097152x4194304"));
  // An empty file of a real shape still reads.
  const auto empty = train_test::scratch("idx-empty") / "images-idx3-ubyte";
  std::ofstream(empty, std::ios::binary) << std::string("\0\0\x08\x03\0\0\0\0\0\0\0\x1c\0\0\0\x1c", 16);
  CHECK(hpctrain::data::read_idx(empty, 3).values.sizes() == torch::IntArrayRef({0, 28, 28}));
}
