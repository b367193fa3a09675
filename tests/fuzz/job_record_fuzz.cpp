// Fuzzes the reader of a job record, `hpctrain-jobs/<name>/<id>/job.json` (job/submit.hpp): `--status`,
// `--logs` and `--cancel` read it back, and a user may have edited or truncated it.
#include <hpctrain/job/submit.hpp>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  const auto text = hpctrain::fuzz::as_text(data, size);
  hpctrain::fuzz::expect_clean_rejection([&] {
    const auto job = hpctrain::detail::parse_job_record(text, "hpctrain-jobs/fuzz/1/job.json");
    // What was read back writes out to a record that reads back the same.
    const auto again = hpctrain::detail::parse_job_record(hpctrain::detail::to_json(job).dump(), "again.json");
    FUZZ_CHECK(again.id == job.id && again.name == job.name && again.directory == job.directory &&
               again.output_log == job.output_log && again.error_log == job.error_log);
  });
  return 0;
}
