// The login command of a program with a knob table (the probe with PROBE_KNOBS, as hpctrain::run makes one
// for a Training): an unknown or invalid knob exits 2 before anything is written or queued; the workers get
// the checked values; each --local run has its own run directory; --resume picks one; --status shows
// Slurm's own error when Slurm cannot be asked.
#include <filesystem>
#include <string>
#include <vector>

#include <hpctrain/job/process.hpp>
#include <hpctrain/names.hpp>

#include <catch2/catch.hpp>

#include "job_test_support.hpp"

namespace fs = std::filesystem;
namespace ht = hpctrain;

namespace {
const std::vector<std::pair<std::string, std::string>> knob_probe = {{"PROBE_KNOBS", "1"}, {"PROBE_NAME", "knobs"}};

std::vector<fs::path> entries(const fs::path& dir) {
  std::vector<fs::path> found;
  if (fs::exists(dir))
    for (const auto& entry : fs::directory_iterator(dir)) found.push_back(entry.path().filename());
  std::sort(found.begin(), found.end());
  return found;
}

/// The probe with HPCTRAIN_RUN_DIR removed from its environment (the test's own
/// environment may carry them).
ht::ProcessResult run_knob_probe(const fs::path& dir, std::vector<std::string> args,
                                 std::vector<std::pair<std::string, std::string>> env = knob_probe) {
  args.insert(args.begin(), {"env", "-u", "HPCTRAIN_RUN_DIR", job_test::probe()});
  return ht::run_process(args, env, dir.string());
}
}  // namespace

TEST_CASE("An invalid or unknown knob exits 2 naming it, before anything is written or queued", "[cli][knobs]") {
  auto [args, message] = GENERATE(table<std::vector<std::string>, std::string>({
      {{"--submit", "--lr", "-1"}, "[hpctrain.spec.knob] --lr = -1: must be positive\n"},
      {{"--submit", "--epoch", "3"},
       "[hpctrain.usage] unknown option --epoch (did you mean --epochs?); the knobs are: --epochs --lr "
       "--warmup-steps --compile\n"},
      {{"--submit", "--lr", "-1", "--epoch", "3"}, "[hpctrain.spec.knob] --lr = -1: must be positive\n"},
      {{"--dry-run", "--warmup-steps=-2"}, "[hpctrain.spec.knob] --warmup-steps = -2: must not be negative\n"},
      {{"--local", "2", "--epochs", "zero"}, "[hpctrain.spec.knob] --epochs = zero: expected an integer\n"},
      {{"--submit", "3"}, "[hpctrain.usage] unexpected argument '3'; training knobs are given as --name value\n"},
  }));
  CAPTURE(args);
  const auto dir = job_test::scratch_dir("bad-knob");
  const auto result = run_knob_probe(dir, args);
  CHECK(result.exit_code == 2);
  CHECK(result.err == message);
  CHECK(result.out.empty());
  CHECK(fs::is_empty(dir));  // no job directory: nothing written, so nothing was given to sbatch either
}

TEST_CASE("Valid knobs reach every worker checked and spelled --name=value", "[cli][knobs]") {
  const auto dir = job_test::scratch_dir("good-knobs");
  const auto script = run_knob_probe(dir, {"--dry-run", "--lr", "0.5", "--compile", "--epochs", "2"});
  REQUIRE(script.exit_code == 0);
  CHECK(script.out.find("--hpctrain-worker --epochs=2 --lr=0.5 --compile=true || status=$?\n") != std::string::npos);

  const auto local = run_knob_probe(dir, {"--local", "2", "--lr", "0.5", "--warmup-steps=7"});
  REQUIRE(local.exit_code == 0);
  CHECK(local.out.find("probe rank=0 knob lr given\n") != std::string::npos);
  CHECK(local.out.find("probe rank=1 lr=0.5 warmup_steps=7 compile=false") != std::string::npos);
}

TEST_CASE("The --help text lists the knobs from the same table", "[cli][knobs]") {
  const auto result = run_knob_probe(job_test::scratch_dir("knob-help"), {"--help"});
  CHECK(result.exit_code == 0);
  CHECK(result.out.find("Training knobs") != std::string::npos);
  CHECK(result.out.find("  --lr X                      base learning rate (default: 0.001; must be positive)\n") !=
        std::string::npos);
  CHECK(result.out.find("--resume [DIR]") != std::string::npos);
}

TEST_CASE("A worker given an invalid knob exits 2 naming it (a script edited by hand)", "[cli][knobs]") {
  const auto dir = job_test::scratch_dir("worker-knob");
  const auto result = run_knob_probe(dir, {"--hpctrain-worker", "--lr=-1"});
  CHECK(result.exit_code == 2);
  CHECK(result.err == "[hpctrain.spec.knob] --lr = -1: must be positive\n");
}

TEST_CASE("Each --local run gets its own run directory, printed, and two runs do not share one", "[cli][runs]") {
  const auto dir = job_test::scratch_dir("local-runs");
  const auto first = run_knob_probe(dir, {"--local", "1"});
  const auto second = run_knob_probe(dir, {"--local", "1"});
  REQUIRE(first.exit_code == 0);
  REQUIRE(second.exit_code == 0);
  const auto runs = entries(dir / "hpctrain-jobs" / "knobs");
  REQUIRE(runs.size() == 2);
  for (const auto& run : runs) CHECK(run.string().starts_with("local-"));
  const auto first_dir = dir / "hpctrain-jobs" / "knobs" / runs[0];
  CHECK(first.out.starts_with(fmt::format("run directory: {}\n", first_dir.string())));
  CHECK(first.out.find(fmt::format("run_dir={} resume_from=-\n", first_dir.string())) != std::string::npos);
}

TEST_CASE(
    "The option --resume DIR hands the workers that run directory, --resume alone the newest run with checkpoints",
    "[cli][runs]") {
  const auto dir = job_test::scratch_dir("resume");
  const auto root = dir / "hpctrain-jobs" / "knobs";
  fs::create_directories(root / "41" / "checkpoints" / "step-0000000010");
  fs::create_directories(root / "local-20260101-000000" / "checkpoints" / "step-0000000020");
  fs::create_directories(root / "42");  // a run that never checkpointed
  fs::last_write_time(root / "41" / "checkpoints", fs::file_time_type::clock::now() - std::chrono::hours(1));

  const auto named = run_knob_probe(dir, {"--local", "1", "--resume", (root / "41").string()});
  REQUIRE(named.exit_code == 0);
  CHECK(named.out.find(fmt::format("resume_from={}\n", (root / "41").string())) != std::string::npos);

  const auto newest = run_knob_probe(dir, {"--local", "1", "--resume", "--lr", "0.5"});
  REQUIRE(newest.exit_code == 0);
  CHECK(newest.out.find(fmt::format("lr=0.5 warmup_steps=100 compile=false run_dir={}/local-", root.string())) !=
        std::string::npos);
  CHECK(newest.out.find(fmt::format("resume_from={}\n", (root / "local-20260101-000000").string())) !=
        std::string::npos);

  const auto script = run_knob_probe(dir, {"--dry-run", "--resume", (root / "41").string()});
  CHECK(script.out.find(fmt::format("--hpctrain-worker --resume {} || status=$?\n", (root / "41").string())) !=
        std::string::npos);

  const auto nothing = run_knob_probe(dir, {"--submit", "--resume", (root / "42").string()});
  CHECK(nothing.exit_code == 2);
  CHECK(nothing.err ==
        fmt::format("[hpctrain.spec.resume] --resume {0}: {0}/checkpoints holds no checkpoint to resume from\n",
                    (root / "42").string()));
  const auto elsewhere = job_test::scratch_dir("resume-nothing");
  const auto none = run_knob_probe(elsewhere, {"--local", "1", "--resume"});
  CHECK(none.exit_code == 2);
  CHECK(none.err == fmt::format("[hpctrain.spec.resume] --resume: no run of this program under {} has checkpoints; "
                                "name one: --resume DIR\n",
                                (elsewhere / "hpctrain-jobs" / "knobs").string()));
  CHECK(fs::is_empty(elsewhere));
  const auto status = run_knob_probe(elsewhere, {"--status", "--resume"});
  CHECK(status.exit_code == 2);
  CHECK(status.err == "[hpctrain.usage] --resume goes with --submit, --dry-run, --local or --run\n");
}

TEST_CASE("The --status mode shows Slurm's own error and exits 1 when Slurm cannot be asked", "[cli]") {
  const auto dir = job_test::scratch_dir("status-no-slurm");
  const auto root = dir / "hpctrain-jobs" / "probe";
  const std::string id = "27";
  fs::create_directories(root / id);
  job_test::write_file(root / "last", id + "\n");
  job_test::write_file(
      root / id / "job.json",
      fmt::format(R"({{"id": "{}", "name": "probe", "directory": "{}", "output_log": "{}",
                                       "error_log": "{}"}})",
                  id, (root / id).string(), (root / id / "out").string(), (root / id / "out").string()));
  // Without SLURM_CONF (and no /etc/slurm/slurm.conf here) every Slurm command fails at once.
  const auto result = ht::run_process({"env", "-u", "SLURM_CONF", job_test::probe(), "--status"}, {}, dir.string());
  CHECK(result.exit_code == 1);
  CHECK(result.out.empty());
  CHECK(result.err.starts_with("[hpctrain.runtime.status] cannot ask Slurm about job 27:\n  squeue (exit 1): "));
  CHECK(result.err.find("Could not establish a configuration source") != std::string::npos);
  CHECK(result.err.find("unknown to squeue") == std::string::npos);
}
