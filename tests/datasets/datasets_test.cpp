// Hugging Face datasets on disk read through Apache Arrow (datasets/): the rows of a hub download's train split
// (Parquet shards with several row groups) and of a save_to_disk folder (Arrow streams) equal, row for row and key
// for key, what `datasets.load_dataset` returns; the SFT records read from them equal those of the same rows as
// JSONL (`Dataset.to_json`), and a text column prepares into the same token files from each; splits are inferred from
// names as `datasets` infers them; a truncated or corrupt file, a column of the wrong type or a row without an
// assistant turn is refused naming the file, the row group (or record batch), the row and the column. The fixtures are
// written by `datasets` and pyarrow (datasets_fixtures.py), never by hpctrain.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include <hpctrain/datasets/datasets.hpp>
#include <hpctrain/text/huggingface.hpp>
#include <hpctrain/text/prepare.hpp>
#include <hpctrain/text/sft_jsonl.hpp>

#include "../text/text_test_support.hpp"

namespace ds = hpctrain::datasets;
namespace tx = hpctrain::text;

namespace {
/// The fixtures of datasets_fixtures.py (made once per build tree).
std::filesystem::path fixtures() {
  const auto dir = text_test::cache_dir() / "datasets";
  if (!std::filesystem::exists(dir / "expected.jsonl")) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    text_test::run(
        fmt::format("'{}' '{}/tests/datasets/datasets_fixtures.py' make '{}' > '{}/../datasets-make.log' 2>&1",
                    text_test::python(), text_test::source_dir().string(), dir.string(), dir.string()));
  }
  return dir;
}

std::vector<nlohmann::ordered_json> rows_of(tx::RowSource& rows) {
  std::vector<nlohmann::ordered_json> all;
  nlohmann::ordered_json row;
  while (rows.next(row)) all.push_back(row);
  return all;
}

std::vector<nlohmann::ordered_json> expected_rows() {
  std::vector<nlohmann::ordered_json> rows;
  std::ifstream in(fixtures() / "expected.jsonl");
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::ordered_json::parse(line));
  return rows;
}

std::string error_of(const std::filesystem::path& data) {
  try {
    (void)tx::validate_sft_data(data);
  } catch (const hpctrain::Error& error) {
    return error.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("datasets: a hub download's train split and a save_to_disk folder read as datasets.load_dataset's rows",
          "[datasets][oracle]") {
  const auto expected = expected_rows();
  REQUIRE(expected.size() == 30);
  for (const auto* name : {"hub", "saved"}) {
    CAPTURE(name);
    const auto rows = ds::open_dataset(fixtures() / name);
    const auto read = rows_of(*rows);
    REQUIRE(read.size() == expected.size());
    for (std::size_t i = 0; i < read.size(); ++i) {
      CAPTURE(i);
      CHECK(read[i].dump() == expected[i].dump());  // key order too: a struct's fields as the schema has them
    }
  }
  // Only the columns asked for, in the dataset's order; the row counted across the shards.
  const auto rows = ds::open_dataset(fixtures() / "hub", {"score", "id", "absent"});
  nlohmann::ordered_json row;
  for (int i = 0; i < 18; ++i) REQUIRE(rows->next(row));
  CHECK(row.dump() == nlohmann::ordered_json{{"id", 17}, {"score", expected[17]["score"]}}.dump());
  CHECK(rows->row() == 18);
  // 15 rows a shard in row groups of 7: the 18th row is the second shard's third.
  CHECK(rows->where() == (fixtures() / "hub/data/train-00001-of-00002.parquet").string() + ", row group 0, row 2");
}

TEST_CASE("datasets: SFT records of a Parquet dataset equal those of its rows exported as JSONL",
          "[datasets][oracle]") {
  for (const auto* name : {"hub", "saved"}) {
    CAPTURE(name);
    tx::SftReader dataset(fixtures() / name), jsonl(fixtures() / "export.jsonl");
    tx::SftRecord from_dataset, from_jsonl;
    int records = 0;
    while (dataset.next(from_dataset)) {
      REQUIRE(jsonl.next(from_jsonl));
      CHECK(from_dataset.shape == tx::SftShape::conversational);
      CHECK(from_dataset.tools.dump() == from_jsonl.tools.dump());
      REQUIRE(from_dataset.messages.size() == from_jsonl.messages.size());
      for (std::size_t m = 0; m < from_dataset.messages.size(); ++m)
        CHECK(from_dataset.messages[m].json.dump() == from_jsonl.messages[m].json.dump());
      ++records;
    }
    CHECK_FALSE(jsonl.next(from_jsonl));
    CHECK(records == 30);
    CHECK(dataset.line() == 30);
  }
}

TEST_CASE("datasets: splits are inferred from file and folder names as datasets infers them", "[datasets]") {
  CHECK(ds::split_of("data/train-00000-of-00002.parquet") == "train");
  CHECK(ds::split_of("train.parquet") == "train");
  CHECK(ds::split_of("my_train_file.parquet") == "train");
  CHECK(ds::split_of("training/part-0.parquet") == "train");
  CHECK(ds::split_of("data/validation-00000-of-00001.parquet") == "validation");
  CHECK(ds::split_of("dev/a.parquet") == "validation");
  CHECK(ds::split_of("Test.parquet") == "test");
  CHECK(ds::split_of("eval-0.parquet") == "test");
  CHECK(ds::split_of("constrained.parquet").empty());  // a keyword inside a word is none
  CHECK(ds::split_of("retest.parquet").empty());
  CHECK(ds::split_of("data/part-0.parquet").empty());
  // The hub folder's train files, in order; README.md and the hidden .cache/ are not data.
  const auto files = ds::dataset_files(fixtures() / "hub");
  REQUIRE(files.size() == 2);
  CHECK(files[0].path.filename() == "train-00000-of-00002.parquet");
  CHECK(files[1].path.filename() == "train-00001-of-00002.parquet");
  const auto saved = ds::dataset_files(fixtures() / "saved");
  REQUIRE(saved.size() == 2);
  CHECK(saved[0].kind == ds::DataFile::Kind::arrow);
}

TEST_CASE("datasets: a truncated or corrupt file, a wrong column type and a bad row are refused by file and place",
          "[datasets]") {
  const auto dir = text_test::scratch("datasets-bad");
  const auto shard = fixtures() / "hub/data/train-00001-of-00002.parquet";
  const auto bytes = text_test::read_file(shard);

  const auto truncated = dir / "truncated.parquet";
  text_test::write_file(truncated, bytes.substr(0, bytes.size() / 2));
  CHECK_THAT(error_of(truncated), Catch::StartsWith("[hpctrain.spec.data.dataset] " + truncated.string() +
                                                    ": not a readable Parquet file: "));

  // The footer intact, the first column chunk's pages overwritten: reading that row group fails naming it and
  // the column (the pages are compressed: garbage does not decode).
  auto corrupt_bytes = bytes;
  for (std::size_t i = 64; i < 160; ++i) corrupt_bytes[i] = static_cast<char>(0xa5);
  const auto corrupt = dir / "corrupt.parquet";
  text_test::write_file(corrupt, corrupt_bytes);
  CHECK_THAT(error_of(corrupt),
             Catch::StartsWith("[hpctrain.spec.data.dataset] " + corrupt.string() + ", row group 0: column '"));

  const auto bad = fixtures() / "bad";
  CHECK(error_of(bad / "stamped.parquet") ==
        "[hpctrain.spec.data.dataset] " + (bad / "stamped.parquet").string() +
            ": column 'text' is of type timestamp[us], which hpctrain does not read (text, numbers, booleans, lists "
            "and structs of them)");
  CHECK_THAT(error_of(bad / "messages.parquet"),
             Catch::StartsWith("[hpctrain.spec.data.dataset] " + (bad / "messages.parquet").string() +
                               ", row group 0, row 0: "));
  CHECK(error_of(bad / "unassisted.parquet") == "[hpctrain.spec.data.dataset] " +
                                                    (bad / "unassisted.parquet").string() +
                                                    ", row group 1, row 2: the conversation has no assistant turn to "
                                                    "train on");
  // A string column that is not UTF-8 (pyarrow writes what it is given; the fuzz target found it escaping as
  // nlohmann's type_error when a row was dumped): each part is validated before a value of it is read.
  const auto not_utf8 = text_test::source_dir() / "tests/fuzz/corpus/dataset_rows/text_not_utf8.parquet";
  CHECK_THAT(error_of(not_utf8), Catch::StartsWith("[hpctrain.spec.data.dataset] " + not_utf8.string() +
                                                   ", row group 0: column 'text': ") &&
                                     Catch::Contains("UTF8"));
  CHECK(error_of(dir / "none.parquet") ==
        "[hpctrain.spec.data.dataset] " + (dir / "none.parquet").string() + ": no such file or directory");
  std::filesystem::create_directories(dir / "empty");
  CHECK(error_of(dir / "empty") ==
        "[hpctrain.spec.data.dataset] " + (dir / "empty").string() + ": holds no .parquet nor .arrow file");
}

TEST_CASE("datasets: a text column prepares into the same tokens from Parquet shards, save_to_disk and JSONL",
          "[datasets][oracle]") {
  const auto tokenizer = tx::load_huggingface_tokenizer(text_test::fortunes_tokenizer());
  const auto dir = text_test::scratch("datasets-prepare");
  const auto options = tx::PrepareOptions().text_column("note").validation_fraction(0.2).threads(2);
  std::vector<std::string> bodies;
  for (const auto* name : {"hub", "saved", "export.jsonl"}) {
    CAPTURE(name);
    const std::filesystem::path input = fixtures() / name;
    const auto result = tx::prepare_tokens(std::span(&input, 1), tokenizer, dir / name, options);
    CHECK(result.train_documents + result.validation_documents == 6);  // the train split's non-null notes
    // The ids after each file's header (its digest names the inputs, which differ).
    bodies.push_back(text_test::read_file(result.train).substr(tx::token_file_header_size) + "|" +
                     text_test::read_file(result.validation).substr(tx::token_file_header_size));
    CHECK(tx::tokens_prepared(std::span(&input, 1), tokenizer, dir / name, options));
    CHECK_FALSE(tx::tokens_prepared(std::span(&input, 1), tokenizer, dir / name,
                                    tx::PrepareOptions(options).text_column("id")));
  }
  CHECK(bodies[0] == bodies[2]);
  CHECK(bodies[1] == bodies[2]);
  CHECK(bodies[0].size() > 2 * 6);
  // A column that is not text stops the preparation naming the file and the row.
  const std::filesystem::path hub = fixtures() / "hub";
  CHECK_THROWS_WITH(
      tx::prepare_tokens(std::span(&hub, 1), tokenizer, dir / "ids", tx::PrepareOptions(options).text_column("id")),
      Catch::Contains("train-00000-of-00002.parquet, row group 0, row 0: column 'id' is number, not text"));
}
