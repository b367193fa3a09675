// Regression tests for what the fuzz targets of tests/fuzz found in the job layer; each test is named
// after what broke, and its input also lives in the target's corpus (tests/fuzz/corpus/<target>/).
#include <string>

#include <catch2/catch.hpp>

#include <hpctrain/job/submit.hpp>

using Catch::Matchers::Contains;

TEST_CASE("A truncated or hand-edited job.json is an hpctrain error naming the file, not a JSON exception",
          "[fuzz_regression]") {
  // fuzz_job_record: nlohmann's parse_error / type_error / out_of_range escaped last_submitted unnamed.
  const auto [text, reason] = GENERATE(table<std::string, std::string>({
      {R"({"id": "42", "name": "x")", "not valid JSON"},
      {"", "not valid JSON"},
      {"[1,2,3]", R"("id" is missing or not a string)"},
      {R"({"id": 42, "name": "x", "directory": "/d", "output_log": "/o", "error_log": "/e"})",
       R"("id" is missing or not a string)"},
      {R"({"id": "42", "name": "x", "directory": "/d", "output_log": "/o"})", R"("error_log" is missing)"},
  }));
  CAPTURE(text);
  CHECK_THROWS_WITH(hpctrain::detail::parse_job_record(text, "/jobs/x/42/job.json"),
                    Contains("[hpctrain.runtime.job_record]") && Contains("/jobs/x/42/job.json") && Contains(reason));
}

TEST_CASE("A job.json as submit writes it reads back", "[fuzz_regression]") {
  const auto job = hpctrain::detail::parse_job_record(
      R"({"id": "42", "name": "x", "directory": "/d", "output_log": "/o", "error_log": "/e", "argv": ["a"]})",
      "job.json");
  CHECK(job.id == "42");
  CHECK(job.directory == "/d");
  CHECK(job.error_log == "/e");
}
