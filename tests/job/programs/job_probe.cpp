// The binary the job tests submit: a Job whose worker reports, per rank, its Slurm identity, whether it
// runs inside ch-run, and (hex-encoded, so that any byte survives the log) its arguments and the
// PROBE_* variables and job name it received. The job is configured from PROBE_* variables.
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include <fmt/format.h>

#include <hpctrain/job/cli.hpp>

extern char** environ;

namespace {
std::string env_or(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value ? value : fallback;
}

std::string hex(std::string_view text) {
  std::string out;
  for (unsigned char c : text) out += fmt::format("{:02x}", c);
  return out;
}

int report(const std::vector<std::string>& args) {
  // Like hpctrain's workers once the ranks agreed to requeue: every rank will exit 75, so srun's SIGTERM
  // after the first one exits (--kill-on-bad-exit) must not turn the others' 75 into 143.
  if (!args.empty() && args[0] == "--exit-first-run") std::signal(SIGTERM, SIG_IGN);
  const auto rank = env_or("SLURM_PROCID", env_or("RANK", "?").c_str());  // RANK under --local
  std::string lines = fmt::format("probe rank={} ntasks={} node={} nodeid={} localid={} job={} container={}\n", rank,
                                  env_or("SLURM_NTASKS", "?"), env_or("SLURMD_NODENAME", "?"),
                                  env_or("SLURM_NODEID", "?"), env_or("SLURM_LOCALID", "?"),
                                  env_or("SLURM_JOB_ID", "?"), std::getenv("CH_RUNNING") ? "ch-run" : "no");
  for (std::size_t i = 0; i < args.size(); ++i) lines += fmt::format("probe rank={} arg{}={}\n", rank, i, hex(args[i]));
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    const auto equals = entry.find('=');
    const auto name = entry.substr(0, equals);
    if (name.starts_with("PROBE_") || name == "SLURM_JOB_NAME")
      lines += fmt::format("probe rank={} env {}={}\n", rank, name, hex(entry.substr(equals + 1)));
  }
  std::cout << lines << std::flush;
  if (args.size() == 2 && args[0] == "--sleep") std::this_thread::sleep_for(std::chrono::seconds(std::stoi(args[1])));
  // `--requeue-first-run`: on the first run rank 0 creates the requeue marker and exits with 75 while
  // rank 1 is still busy, so that srun --kill-on-bad-exit kills rank 1 (the requeue test).
  if (args.size() == 1 && args[0] == "--requeue-first-run" && env_or("SLURM_RESTART_COUNT", "0") == "0") {
    if (rank != "0") {
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return 0;
    }
    std::ofstream(env_or("HPCTRAIN_REQUEUE_MARKER", "/nonexistent/marker")) << "requeue\n";
    return hpctrain::exit_requeue;
  }
  // `--exit-first-run N`: the first run exits with N (the requeue test), later runs succeed.
  if (args.size() == 2 && args[0] == "--exit-first-run" && env_or("SLURM_RESTART_COUNT", "0") == "0")
    return std::stoi(args[1]);
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  namespace ht = hpctrain;
  // No try/catch: a SpecError escaping main exits 2 with its message (job/spec_error_exit.hpp).
  ht::install_spec_error_exit();
  auto job = ht::Job(env_or("PROBE_NAME", "probe")).nodes(std::stoi(env_or("PROBE_NODES", "2"))).time(5min);
  if (std::getenv("PROBE_SECRET")) job.secret_env("PROBE_SECRET");
  if (std::getenv("PROBE_REQUEUE")) job.requeue_on_timeout(60s, 2);
  if (const char* image = std::getenv("PROBE_CHARLIECLOUD")) {
    job.container(ht::Charliecloud(image)).mount("/usr", "/usr");
  }
  if (std::getenv("PROBE_KNOBS")) {
    // A program with a knob table, as hpctrain::run makes one for a Training (tests/job/knobs_cli_test.cpp).
    ht::Knobs knobs;
    knobs.declare_optional<std::int64_t>("epochs", "passes over the data", ht::positive())
        .declare<double>("lr", 1e-3, "base learning rate", ht::positive())
        .declare<std::int64_t>("warmup_steps", 100, "steps of linear warm-up", ht::non_negative())
        .declare<bool>("compile", false, "a switch");
    return ht::run_job(argc, argv, job, knobs, [](const ht::Knobs& values) {
      const auto rank = env_or("SLURM_PROCID", env_or("RANK", "?").c_str());
      std::string lines;
      for (const auto& spec : values.specs())
        if (values.given(spec.name)) lines += fmt::format("probe rank={} knob {} given\n", rank, spec.name);
      lines += fmt::format("probe rank={} lr={} warmup_steps={} compile={} run_dir={} resume_from={}\n", rank,
                           values.get<double>("lr"), values.get<int>("warmup_steps"), values.get<bool>("compile"),
                           env_or("HPCTRAIN_RUN_DIR", "-"), env_or("HPCTRAIN_RESUME_FROM", "-"));
      std::cout << lines << std::flush;
      return 0;
    });
  }
  return ht::run_job(argc, argv, job, report);
}
