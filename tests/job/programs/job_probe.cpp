// The binary the job tests submit: a Job whose worker reports, per rank, its Slurm identity, whether it
// runs inside ch-run, and (hex-encoded, so that any byte survives the log) its arguments and the
// PROBE_* variables and job name it received. The job is configured from PROBE_* variables.
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include <unistd.h>  // getpid

#include <fmt/format.h>

#include <hpctrain/job/cli.hpp>
#include <hpctrain/job/process.hpp>       // restart_this_program
#include <hpctrain/train/preemption.hpp>  // torch-free: the flag the training loop polls

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

// Like the ranks' agreement before they exit with the requeue code: every rank marks that it ignores SIGTERM
// and waits (at most a minute) until all ranks did, so that none exits while another could still die of
// srun's SIGTERM (a rank started late under load did, and the step reported 143: a CI failure).
void wait_until_every_rank_ignores_sigterm(const std::string& rank) {
  const std::filesystem::path dir = env_or("HPCTRAIN_RUN_DIR", ".");
  const auto tasks = std::stoi(env_or("SLURM_NTASKS", "1"));
  std::ofstream(dir / ("ignores-sigterm." + rank)) << "1\n";
  for (int i = 0; i < 600; ++i) {
    int ready = 0;
    for (int r = 0; r < tasks; ++r) ready += std::filesystem::exists(dir / ("ignores-sigterm." + std::to_string(r)));
    if (ready == tasks) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

int report(const std::vector<std::string>& args) {
  // `--restart-self`: the worker starts itself again with PROBE_RESTARTED=1 added (job/process.hpp), as rank 0 does to
  // give NCCL its logging; each start says its pid.
  if (!args.empty() && args[0] == "--restart-self") {
    std::cout << fmt::format("probe pid={} restarted={}\n", ::getpid(), env_or("PROBE_RESTARTED", "no"));
    if (!std::getenv("PROBE_RESTARTED"))
      hpctrain::restart_this_program(hpctrain::Environment::of_this_process().set("PROBE_RESTARTED", "1"));
  }
  // A chain (PROBE_CHAIN=ok|fail): each stage says which it is; with fail the first stage exits 3.
  if (const char* chain = std::getenv("PROBE_CHAIN")) {
    const auto stage = env_or("HPCTRAIN_STAGE", "-");
    std::cout << fmt::format("probe stage={} job={} nodes={}\n", stage, env_or("SLURM_JOB_ID", "?"),
                             env_or("SLURM_JOB_NUM_NODES", "?"))
              << std::flush;
    if (const char* earlier = std::getenv("HPCTRAIN_STAGE_DIRS")) std::cout << "probe stage_dirs=" << earlier << "\n";
    std::cout << "probe first_stage_only=" << env_or("PROBE_FIRST_STAGE_ONLY", "unset") << "\n";
    return std::string(chain) == "fail" && stage == env_or("PROBE_NAME", "probe") ? 3 : 0;
  }
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
  if (const char* secret = std::getenv("PROBE_SECRET_NAME"))  // that it arrived, and its length: never the value
    lines += fmt::format("probe rank={} secret {} has {} bytes\n", rank, secret, env_or(secret, "").size());
  // With PROBE_PREPARE, every rank reports what the preparation step left in the run directory.
  if (std::getenv("PROBE_PREPARE")) {
    std::ifstream prepared(env_or("HPCTRAIN_RUN_DIR", "/nonexistent") + "/prepare/data.txt");
    std::string content;
    std::getline(prepared, content);
    lines += fmt::format("probe rank={} prepared={}\n", rank, content.empty() ? "<missing>" : content);
  }
  // In an array task: the task's ids and run directory; `--requeue-task N` makes task N exit with the requeue
  // code on its first run, `--sleep-task N S` makes task N sleep S seconds.
  const auto task = env_or("SLURM_ARRAY_TASK_ID", "");
  if (!task.empty()) {
    lines += fmt::format("probe rank={} array_job={} array_task={} job={} run_dir={}\n", rank,
                         env_or("SLURM_ARRAY_JOB_ID", "?"), task, env_or("SLURM_JOB_ID", "?"),
                         env_or("HPCTRAIN_RUN_DIR", "?"));
    std::cout << lines << std::flush;
    for (std::size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == "--requeue-task" && args[i + 1] == task && env_or("SLURM_RESTART_COUNT", "0") == "0") {
        std::signal(SIGTERM, SIG_IGN);
        return hpctrain::exit_requeue;
      }
      if (args[i] == "--sleep-task" && args[i + 1] == task && i + 2 < args.size())
        std::this_thread::sleep_for(std::chrono::seconds(std::stoi(args[i + 2])));
    }
    return 0;
  }
  std::cout << lines << std::flush;
  const bool first_run = env_or("SLURM_RESTART_COUNT", "0") == "0";
  // `--kill-rank R`: on the first run rank R dies by SIGKILL (the others wait to be killed by srun);
  // `--kill-rank-always R`: on every run.
  if (args.size() == 2 && (args[0] == "--kill-rank" || args[0] == "--kill-rank-always")) {
    if (first_run || args[0] == "--kill-rank-always") {
      if (rank == args[1]) std::raise(SIGKILL);
      std::this_thread::sleep_for(std::chrono::seconds(120));
    }
    std::cout << fmt::format("probe rank={} finished restart={}\n", rank, env_or("SLURM_RESTART_COUNT", "0"))
              << std::flush;
    return 0;
  }
  // `--wait-for-preemption`: hpctrain's preemption handler (requeue signal and SIGTERM); on the first run every
  // rank waits for it, then behaves like a worker that checkpointed: marker, ignore SIGTERM, exit 75.
  if (args.size() == 1 && args[0] == "--wait-for-preemption") {
    if (first_run) {
      hpctrain::install_preemption_handler(hpctrain::preemption_settings(hpctrain::Environment::of_this_process()),
                                           rank == "?" ? -1 : std::stoi(rank));
      std::cout << fmt::format("probe rank={} waiting for preemption\n", rank) << std::flush;
      for (int i = 0; i < 3000 && !hpctrain::preemption_requested(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (!hpctrain::preemption_requested()) return 1;
      std::signal(SIGTERM, SIG_IGN);
      std::cout << fmt::format("probe rank={} preempted: checkpointing\n", rank) << std::flush;
      if (rank == "0") std::ofstream(env_or("HPCTRAIN_REQUEUE_MARKER", "/nonexistent/marker")) << "requeue\n";
      return hpctrain::exit_requeue;
    }
    std::cout << fmt::format("probe rank={} resumed restart={}\n", rank, env_or("SLURM_RESTART_COUNT", "0"))
              << std::flush;
    return 0;
  }
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
  if (args.size() == 2 && args[0] == "--exit-first-run" && env_or("SLURM_RESTART_COUNT", "0") == "0") {
    wait_until_every_rank_ignores_sigterm(rank);
    return std::stoi(args[1]);
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  namespace ht = hpctrain;
  // No try/catch: a SpecError escaping main exits 2 with its message, installed before main (job/spec_error_exit.hpp).
  auto job = ht::Job(env_or("PROBE_NAME", "probe")).nodes(std::stoi(env_or("PROBE_NODES", "2"))).time(5min);
  if (std::getenv("PROBE_SECRET")) job.secret_env("PROBE_SECRET");
  // A secret the probe does not print (PROBE_* values it does): tests/job/private_files_test.cpp's canary.
  if (const char* secret = std::getenv("PROBE_SECRET_NAME")) job.secret_env(secret);
  if (std::getenv("PROBE_REQUEUE")) job.requeue_on_timeout(60s, 2);
  // PROBE_SHOW_BATCH_ENV: the batch script itself (not a step) says which step variables it sees: none, unless
  // the submitting process leaked its own (a submission from inside a step, submitit #1782).
  if (std::getenv("PROBE_SHOW_BATCH_ENV"))
    job.setup(
        "echo \"probe batch SLURM_STEP_NUM_TASKS=${SLURM_STEP_NUM_TASKS:-unset} SLURM_STEP_ID=${SLURM_STEP_ID:-unset} "
        "SLURM_PTY_PORT=${SLURM_PTY_PORT:-unset}\"");
  if (std::getenv("PROBE_CHAIN")) {  // the first stage's own variable, which the second must not see
    job.env("PROBE_FIRST_STAGE_ONLY", "1");
    job.then(ht::Job(env_or("PROBE_NAME", "probe") + "-second").nodes(1).time(5min));
  }
  if (const char* restarts = std::getenv("PROBE_MAX_RESTARTS")) job.max_restarts(std::stoi(restarts));
  if (const char* image = std::getenv("PROBE_CHARLIECLOUD")) {
    job.container(ht::Charliecloud(image)).mount("/usr", "/usr");
  }
  // PROBE_PREPARE=ok: the preparation step reports where it ran and leaves a file for the ranks;
  // PROBE_PREPARE=fail: it throws, which must fail the job before any rank starts.
  if (const char* mode = std::getenv("PROBE_PREPARE")) {
    job.prepare([fail = std::string(mode) == "fail"](const ht::PrepareContext& context) {
      if (fail) throw ht::RuntimeError(ht::ErrorId{"hpctrain.runtime.probe"}, "the corpus is missing");
      std::cout << fmt::format("probe prepare job={} node={} step_tasks={} restart={} args={} run_dir={}\n",
                               context.job_id, env_or("SLURMD_NODENAME", "?"), env_or("SLURM_STEP_NUM_TASKS", "?"),
                               context.restart_count, context.args.size(), context.run_dir.string())
                << std::flush;
      std::ofstream(context.output_dir / "data.txt")
          << "job " << context.job_id << " restart " << context.restart_count << "\n";
    });
  }
  if (std::getenv("PROBE_KNOBS")) {
    // A program with a knob table, as hpctrain::run makes one for a Training (tests/job/knobs_cli_test.cpp).
    ht::Knobs knobs;
    knobs.declare_optional<std::int64_t>("epochs", "passes over the data", ht::positive())
        .declare<double>("lr", 1e-3, "base learning rate", ht::positive())
        .declare<std::int64_t>("warmup_steps", 100, "steps of linear warm-up", ht::non_negative())
        .declare<bool>("compile", false, "a switch");
    // PROBE_SWEEP=good|bad|undeclared: a sweep over those knobs (tests/job/sweep_test.cpp); each task's rank 0
    // writes metrics.jsonl records computed from its knob values, so --results has a known best-first order.
    if (const char* sweep = std::getenv("PROBE_SWEEP")) {
      const std::string kind = sweep;
      if (kind == "good") job.sweep(ht::Sweep().grid("lr", {0.002, 0.001}).grid("warmup_steps", {0, 10}));
      if (kind == "bad") job.sweep(ht::Sweep().grid("lr", {0.001, 0.002, -0.5}).grid("warmup_steps", {0, 10, 20}));
      if (kind == "undeclared") job.sweep(ht::Sweep().grid("warmup_step", {1, 2}));
    }
    return ht::run_job(argc, argv, job, knobs, [](const ht::Knobs& values, const ht::RunPlacement& placement) {
      const auto rank = env_or("SLURM_PROCID", env_or("RANK", "?").c_str());
      if (std::getenv("PROBE_SWEEP") && rank == "0") {
        const double lr = values.get<double>("lr");
        const auto warmup = values.get<std::int64_t>("warmup_steps");
        const double eval_loss = lr * 1000 + static_cast<double>(warmup) / 100;
        std::ofstream metrics(env_or("HPCTRAIN_RUN_DIR", ".") + "/metrics.jsonl");
        metrics << fmt::format("{{\"step\": 5, \"epoch\": 0, \"loss\": {}}}\n", lr * 2000)
                << fmt::format("{{\"step\": 5, \"eval_loss\": {}, \"eval_accuracy\": {}, \"eval_examples\": 100}}\n",
                               eval_loss, 1 - eval_loss / 10);
      }
      if (const char* seconds = std::getenv("PROBE_SLEEP"))
        std::this_thread::sleep_for(std::chrono::seconds(std::stoi(seconds)));
      std::string lines;
      for (const auto& spec : values.specs())
        if (values.given(spec.name)) lines += fmt::format("probe rank={} knob {} given\n", rank, spec.name);
      lines += fmt::format("probe rank={} lr={} warmup_steps={} compile={} run_dir={} resume_from={}\n", rank,
                           values.get<double>("lr"), values.get<int>("warmup_steps"), values.get<bool>("compile"),
                           placement.run_dir ? placement.run_dir->string() : env_or("HPCTRAIN_RUN_DIR", "-"),
                           placement.resume_from ? placement.resume_from->string() : "-");
      std::cout << lines << std::flush;
      return 0;
    });
  }
  return ht::run_job(argc, argv, job, report);
}
