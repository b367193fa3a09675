// Regression tests for what the fuzz targets of tests/fuzz found in the train layer; each test is named
// after what broke, and its input also lives in the target's corpus (tests/fuzz/corpus/<target>/).
#include <torch/torch.h>

#include <catch2/catch.hpp>

#include "train_test_support.hpp"

#include <fstream>
#include <string>

#include <filesystem>
#include <functional>
#include <vector>

#include <hpctrain/train/checkpoint/checkpoint.hpp>
#include <hpctrain/train/data/idx.hpp>

using Catch::Matchers::Contains;

TEST_CASE("IDX dimensions whose product overflows are refused naming the file", "[fuzz_regression]") {
  // fuzz_idx: 2^21 x 2^21 x 2^22 wrapped to 0 in 64 bits and matched a file with no data; torch::empty then
  // failed on the real shape with a LibTorch error instead of ours.
  const auto path = train_test::scratch("idx-overflow") / "images-idx3-ubyte";
  std::ofstream(path, std::ios::binary) << std::string("\0\0\x08\x03\0\x20\0\0\0\x20\0\0\0\x40\0\0", 16);
  CHECK_THROWS_WITH(hpctrain::data::read_idx(path, 3), Contains("[hpctrain.runtime.data.idx]") &&
                                                           Contains(path.string()) &&
                                                           Contains("2097152x2097152x4194304"));
  // An empty file of a real shape still reads.
  const auto empty = train_test::scratch("idx-empty") / "images-idx3-ubyte";
  std::ofstream(empty, std::ios::binary) << std::string("\0\0\x08\x03\0\0\0\0\0\0\0\x1c\0\0\0\x1c", 16);
  CHECK(hpctrain::data::read_idx(empty, 3).values.sizes() == torch::IntArrayRef({0, 28, 28}));
}

TEST_CASE(
    "A meta.json naming a file outside its checkpoint, a fractional step or a world size beyond an int is refused "
    "naming the field",
    "[fuzz_regression][checkpoint]") {
  // Found writing fuzz_checkpoint_meta: nlohmann's get<> converted silently (step 1.5 read as 1, world_size
  // 2^32+1 as 1, size -1 as 2^64-1, crc32c 2^32 as 0), and a file name "../x" made verify() read outside the
  // checkpoint directory. Each is now refused with the field, and the checkpoint skipped with a warning.
  const auto [name, meta_json, expected] = GENERATE(table<std::string, std::string, std::string>({
      {"name outside",
       R"({"format":1,"step":1,"epoch":0,"batch_in_epoch":0,"seed":0,"world_size":1,"strategy":"replicated","files":[{"name":"../../../etc/passwd","size":1,"crc32c":0}]})",
       R"(file name "../../../etc/passwd" is not a plain file name)"},
      {"float step",
       R"({"format":1,"step":1.5,"epoch":0,"batch_in_epoch":0,"seed":0,"world_size":1,"strategy":"replicated","files":[]})",
       "field 'step' is 1.5, not an integer"},
      {"world beyond int",
       R"({"format":1,"step":1,"epoch":0,"batch_in_epoch":0,"seed":0,"world_size":4294967297,"strategy":"replicated","files":[]})",
       "field 'world_size' is 4294967297, outside [1, 1048576]"},
      {"negative size",
       R"({"format":1,"step":1,"epoch":0,"batch_in_epoch":0,"seed":0,"world_size":1,"strategy":"replicated","files":[{"name":"rank-00000.hpct","size":-1,"crc32c":0}]})",
       "field 'size' is -1, not an integer in [0, 18446744073709551615]"},
      {"crc beyond 32 bits",
       R"({"format":1,"step":1,"epoch":0,"batch_in_epoch":0,"seed":0,"world_size":1,"strategy":"replicated","files":[{"name":"rank-00000.hpct","size":1,"crc32c":4294967296}]})",
       "field 'crc32c' is 4294967296, not an integer in [0, 4294967295]"},
      {"number beyond a double", R"({"format":1,"step":1e999})", "not a valid checkpoint description: "},
  }));
  CAPTURE(name);
  const auto directory =
      train_test::scratch("meta-json-" + std::to_string(std::hash<std::string>{}(name))) / "checkpoints";
  const auto step = directory / "step-0000000001";
  std::filesystem::create_directories(step);
  std::ofstream(step / "meta.json") << meta_json;
  hpctrain::CheckpointStore store(directory);
  CHECK_THROWS_WITH(store.read(step), Contains("[hpctrain.runtime.checkpoint]") &&
                                          Contains((step / "meta.json").string()) && Contains(expected));
  std::vector<std::string> warnings;
  CHECK_FALSE(store.latest([&](const std::string& warning) { warnings.push_back(warning); }).has_value());
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Contains("warning: skipping checkpoint") && Contains(expected));
}
