// The binary tests/text submits: a two-node job whose preparation step is prepare_tokens_step (once, on one
// task) and whose ranks each read the header of the token files it left. Configured by PROBE_* variables:
// PROBE_NAME, PROBE_TOKENIZER (tokenizer file), PROBE_INPUTS (colon-separated text files).
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include <hpctrain/job/cli.hpp>
#include <hpctrain/text/prepare_step.hpp>

namespace {
std::string env_or(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value ? value : fallback;
}

int report(const std::vector<std::string>&) {
  const auto rank = env_or("SLURM_PROCID", env_or("RANK", "?").c_str());
  const auto dir = hpctrain::text::prepared_tokens_dir(hpctrain::Environment::of_this_process());
  for (const char* name : {"train.tokens", "val.tokens"}) {
    const auto header = hpctrain::text::read_token_file_header(dir / name);
    std::cout << fmt::format("tokens rank={} node={} {} tokens={} fingerprint={:016x}\n", rank,
                             env_or("SLURMD_NODENAME", "?"), name, header.tokens, header.fingerprint)
              << std::flush;
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  namespace ht = hpctrain;
  std::vector<std::filesystem::path> inputs;
  std::istringstream list(env_or("PROBE_INPUTS", ""));
  for (std::string input; std::getline(list, input, ':');) inputs.emplace_back(input);
  auto job = ht::Job(env_or("PROBE_NAME", "tokens")).nodes(2).cpus_per_task(2).time(5min);
  job.prepare(ht::text::prepare_tokens_step(inputs, env_or("PROBE_TOKENIZER", ""),
                                            ht::text::PrepareOptions().validation_fraction(0.1)));
  return ht::run_job(argc, argv, job, report);
}
