// Fuzzes the SFT JSONL reader (text/sft_jsonl.hpp) and the post-processor reader (text/post_processor.hpp):
// any bytes as a JSONL file are read to the end, and any JSON as a post_processor is read and applied. Only
// clean rejections (errors naming the file and line, or the JSON path) are allowed.
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include <hpctrain/text/post_processor.hpp>
#include <hpctrain/text/sft_jsonl.hpp>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  static const std::string path = hpctrain::fuzz::scratch_file("input.jsonl");
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  hpctrain::fuzz::expect_clean_rejection([&] { (void)hpctrain::text::validate_sft_data(path); });
  const auto json = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(data), size), nullptr,
                                          /*allow_exceptions=*/false);
  if (!json.is_discarded())
    hpctrain::fuzz::expect_clean_rejection([&] {
      (void)hpctrain::text::PostProcessor::from_json(json, "fuzz.json").apply({1, 2, 3});
    });
  return 0;
}
