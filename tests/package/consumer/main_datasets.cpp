// An outside torch-free tool that reads Hugging Face datasets on disk: hpctrain::datasets from the installed package
// (its source, compiled here, registers the Parquet and Arrow formats). Given a .parquet file or a dataset
// directory, prints its row count; a JSONL or Parquet path it cannot read exits 1 with the error.
#include <hpctrain/error.hpp>
#include <hpctrain/text/rows.hpp>
#include <hpctrain/version.hpp>

#include <iostream>

int main(int argc, char** argv) {
  std::cout << "hpctrain " << hpctrain::version << " (datasets)\n";
  if (argc < 2) return 0;
  try {
    const auto rows = hpctrain::text::open_rows(argv[1]);
    nlohmann::ordered_json row;
    long count = 0;
    while (rows->next(row)) ++count;
    std::cout << count << " rows\n";
  } catch (const hpctrain::Error& error) {
    std::cerr << error.what() << "\n";
    return 1;
  }
  return 0;
}
