// Fuzzes the Hugging Face dataset readers (datasets/arrow_rows.hpp, through Apache Arrow's own libraries): any bytes
// as a Parquet file and as an Arrow IPC file or stream are read to the end as SFT data, every column converted to
// JSON. Only clean rejections (errors naming the file and the place) are allowed. Arrow's libraries are not built
// with the sanitizers: what this finds is in hpctrain's use of them and its conversion of what they return.
#include <fstream>
#include <string>

#include <hpctrain/datasets/datasets.hpp>
#include <hpctrain/text/sft_jsonl.hpp>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  for (const char* name : {"input.parquet", "input.arrow"}) {
    const std::string path = hpctrain::fuzz::scratch_file(name);
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    hpctrain::fuzz::expect_clean_rejection([&] { (void)hpctrain::text::validate_sft_data(path); });
    hpctrain::fuzz::expect_clean_rejection([&] {  // every column, of every type the schema lets through
      const auto rows = hpctrain::datasets::open_dataset(path);
      nlohmann::ordered_json row;
      while (rows->next(row)) (void)row.dump();
    });
  }
  return 0;
}
