// Fuzzes the compressed tasks-per-node form of SLURM_TASKS_PER_NODE / SLURM_STEP_TASKS_PER_NODE
// (`2(x3),1`, slurm/environment.hpp). Every count of an accepted value is at least 1.
#include <vector>

#include <hpctrain/slurm/environment.hpp>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  const auto text = hpctrain::fuzz::as_text(data, size);
  hpctrain::fuzz::expect_clean_rejection([&] {
    const std::vector<int> counts = hpctrain::slurm::parse_tasks_per_node(text);
    FUZZ_CHECK(!counts.empty());
    for (int count : counts) FUZZ_CHECK(count >= 1);
  });
  return 0;
}
