// Fuzzes Slurm's hostlist grammar (slurm/hostlist.hpp): SLURM_JOB_NODELIST and SLURM_STEP_NODELIST come
// from the environment. Besides "no crash, only HostlistError", checks the round trip the header promises:
// expand(compress(hosts)) == hosts for every list that expands.
#include <string>
#include <vector>

#include <hpctrain/slurm/hostlist.hpp>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  const auto text = hpctrain::fuzz::as_text(data, size);
  hpctrain::fuzz::expect_clean_rejection([&] {
    const std::vector<std::string> hosts = hpctrain::slurm::expand_hostlist(text);
    if (hosts.size() > 100000) return;  // the round trip of a huge list is slow, not more interesting
    for (const auto& host : hosts) FUZZ_CHECK(!host.empty());
    const std::string compressed = hpctrain::slurm::compress_hostlist(hosts);
    FUZZ_CHECK(hpctrain::slurm::expand_hostlist(compressed) == hosts);
  });
  return 0;
}
