// The login-node command line against the real local Slurm cluster (nodes n1, n2): the probe program
// is submitted, followed, shown and cancelled exactly as a user would.
#include <algorithm>
#include <filesystem>
#include <thread>

#include <unistd.h>

#include <hpctrain/job/process.hpp>
#include <hpctrain/job/render.hpp>
#include <hpctrain/job/submit.hpp>

#include <catch2/catch.hpp>

#include "job_test_support.hpp"

namespace fs = std::filesystem;
namespace ht = hpctrain;

namespace {
bool is_empty_dir(const fs::path& dir) { return fs::is_empty(dir); }

int queued_jobs_named(const std::string& name) {
  const auto result = ht::run_process({"squeue", "--noheader", "--name", name, "--format", "%i"});
  return static_cast<int>(std::count(result.out.begin(), result.out.end(), '\n'));
}
}  // namespace

TEST_CASE("A dry run prints a valid script with the declared directives and writes nothing", "[cli]") {
  const auto dir = job_test::scratch_dir("dry-run");
  const auto result = job_test::run_probe(
      dir, {"--dry-run", "--nodes", "2", "--time", "15", "--partition", "debug", "--account", "proj42", "--sbatch",
            "comment=hello world", "--env", "NCCL_DEBUG=INFO", "--epochs", "3"});
  REQUIRE(result.exit_code == 0);
  for (const auto* line :
       {"#SBATCH --job-name=probe\n", "#SBATCH --nodes=2\n", "#SBATCH --time=0-00:15:00\n",
        "#SBATCH --partition=debug\n", "#SBATCH --account=proj42\n", "#SBATCH --comment=\"hello world\"\n",
        "export NCCL_DEBUG=INFO\n", " --hpctrain-worker --epochs 3 || status=$?\n"}) {
    CAPTURE(line);
    CHECK(result.out.find(line) != std::string::npos);
  }
  job_test::write_file(dir / "printed.sbatch", result.out);
  CHECK(ht::run_process({"bash", "-n", (dir / "printed.sbatch").string()}).exit_code == 0);
  fs::remove(dir / "printed.sbatch");
  CHECK(is_empty_dir(dir));
}

TEST_CASE("Invalid overrides exit 2, name the field and the value, and write nothing", "[cli]") {
  const auto dir = job_test::scratch_dir("bad-overrides");
  auto [args, message] = GENERATE(table<std::vector<std::string>, std::string>({
      {{"--submit", "--nodes", "0"}, "[hpctrain.spec.nodes] nodes = 0: must be at least 1\n"},
      {{"--dry-run", "--nodes", "0"}, "[hpctrain.spec.nodes] nodes = 0: must be at least 1\n"},
      {{"--submit", "--gpus-per-node", "a100"},
       "[hpctrain.spec.gpus_per_node] gpus_per_node = a100: a GPU type needs a count (a100:4)\n"},
      {{"--submit", "--partition", ""}, "[hpctrain.spec.partition] partition = \"\": must not be empty\n"},
      {{"--submit", "--env", "NOEQUALS"}, "[hpctrain.usage] --env expects K=V, got 'NOEQUALS'\n"},
      {{"--submit", "--dry-run"},
       "[hpctrain.usage] choose one of --dry-run, --submit, --status, --logs, --cancel, --local, --run, --results, "
       "--plan\n"},
  }));
  CAPTURE(args);
  const auto result = job_test::run_probe(dir, args);
  CHECK(result.exit_code == 2);
  CHECK(result.err == message);
  CHECK(result.out.empty());
  CHECK(is_empty_dir(dir));
}

TEST_CASE("Without a mode the program explains the modes and starts nothing", "[cli]") {
  const auto dir = job_test::scratch_dir("no-mode");
  const auto result = job_test::run_probe(dir, {});
  CHECK(result.exit_code == 2);
  CHECK(result.err.find("--submit") != std::string::npos);
  CHECK(result.err.find("Without a mode the program only prints this text.") != std::string::npos);
  CHECK(is_empty_dir(dir));
}

TEST_CASE("What the cluster refuses exits 2 at --submit naming the field and the value, with nothing queued or written",
          "[cli][slurm]") {
  // sbatch --test-only schedules the rendered script without queueing it: the local cluster has the partition
  // debug with two nodes of two CPUs.
  auto [args, message] = GENERATE(table<std::vector<std::string>, std::string>({
      {{"--partition", "nosuch"},
       "[hpctrain.spec.partition] partition = nosuch: this cluster refuses it (sbatch --test-only: "},
      {{"--nodes", "9"}, "[hpctrain.spec.resources] resources = --nodes=9 --ntasks-per-node=1"},
      {{"--sbatch", "constraint=a100"},
       "[hpctrain.spec.sbatch_option] sbatch_option = constraint=a100: this cluster refuses it"},
  }));
  CAPTURE(args);
  const auto dir = job_test::scratch_dir("refused-by-cluster");
  const std::string name = fmt::format("refused-{}", ::getpid());
  std::vector<std::string> submit = {"--submit"};
  submit.insert(submit.end(), args.begin(), args.end());
  const auto result = job_test::run_probe(dir, submit, {{"PROBE_NAME", name}});
  CAPTURE(result.err);
  CHECK(result.exit_code == 2);
  CHECK(result.err.starts_with(message));
  CHECK(result.err.find("\nhint: `sinfo") != std::string::npos);
  CHECK(result.out.empty());
  CHECK(queued_jobs_named(name) == 0);
  CHECK(is_empty_dir(dir));
  // --dry-run prints the script (it may be meant for another cluster) and says what --submit would do.
  std::vector<std::string> dry = {"--dry-run"};
  dry.insert(dry.end(), args.begin(), args.end());
  const auto printed = job_test::run_probe(dir, dry, {{"PROBE_NAME", name}});
  CHECK(printed.exit_code == 0);
  CHECK(printed.out.starts_with("#!/bin/bash"));
  CHECK(printed.err.find("hpctrain: warning: --submit would stop here: " + message) != std::string::npos);
  CHECK(is_empty_dir(dir));
}

TEST_CASE("A submitted job runs on both nodes and hostile names, values and arguments arrive unchanged",
          "[cli][slurm]") {
  const auto dir = job_test::scratch_dir("submit");
  const auto canary = (dir / "CANARY").string();
  const std::string name = "it's \"hostile\" $(touch " + canary + ") `touch " + canary + "`; #λ";
  const std::string value = "a'b\"c $(touch " + canary + ") `touch " + canary + "` ;&| \n*? λ→😀";
  const std::string secret = "s3cret 'value' $(touch " + canary + ")";
  const std::vector<std::string> forwarded = {"--epochs", "two words", "$(touch " + canary + ")", "", "not utf-8 \xff"};
  std::vector<std::string> args = {"--submit", "--env", "PROBE_HOSTILE=" + value};
  args.insert(args.end(), forwarded.begin(), forwarded.end());
  const auto submitted = job_test::run_probe(dir, args, {{"PROBE_NAME", name}, {"PROBE_SECRET", secret}});
  CAPTURE(submitted.err);
  REQUIRE(submitted.exit_code == 0);
  const auto id = job_test::submitted_id(submitted.out);
  REQUIRE_FALSE(id.empty());

  // The job directory holds the script, the record and (soon) the log; the secret is in none of them.
  const auto job_dir = dir / "hpctrain-jobs" / ht::detail::directory_name(name) / id;
  CHECK(fs::exists(job_dir / "job.sbatch"));
  CHECK(fs::exists(job_dir / "job.json"));
  CHECK(job_test::read_file(dir / "hpctrain-jobs" / ht::detail::directory_name(name) / "last") == id + "\n");
  CHECK(job_test::read_file(job_dir / "job.sbatch").find("s3cret") == std::string::npos);
  CHECK(job_test::read_file(job_dir / "job.json").find("s3cret") == std::string::npos);

  // --logs --follow returns when the job has left the queue, with everything it printed.
  const auto followed = job_test::run_probe(dir, {"--logs", "--follow"}, {{"PROBE_NAME", name}});
  REQUIRE(followed.exit_code == 0);
  const auto state = job_test::wait_for_end(id);
  CHECK(state.state == "COMPLETED");
  const auto log = job_test::read_file(job_dir / fmt::format("slurm-{}.out", id));
  CHECK(followed.out == log);
  CHECK(log.find(fmt::format("probe rank=0 ntasks=2 node=n1 nodeid=0 localid=0 job={} container=no", id)) !=
        std::string::npos);
  CHECK(log.find(fmt::format("probe rank=1 ntasks=2 node=n2 nodeid=1 localid=0 job={} container=no", id)) !=
        std::string::npos);
  for (const auto* rank : {"0", "1"}) {
    CAPTURE(rank);
    CHECK(log.find(fmt::format("probe rank={} env PROBE_HOSTILE={}\n", rank, job_test::hex(value))) !=
          std::string::npos);
    CHECK(log.find(fmt::format("probe rank={} env PROBE_SECRET={}\n", rank, job_test::hex(secret))) !=
          std::string::npos);
    CHECK(log.find(fmt::format("probe rank={} env SLURM_JOB_NAME={}\n", rank, job_test::hex(name))) !=
          std::string::npos);
    for (std::size_t i = 0; i < forwarded.size(); ++i)
      CHECK(log.find(fmt::format("probe rank={} arg{}={}\n", rank, i, job_test::hex(forwarded[i]))) !=
            std::string::npos);
  }
  CHECK_FALSE(fs::exists(canary));

  const auto status = job_test::run_probe(dir, {"--status"}, {{"PROBE_NAME", name}});
  CHECK(status.exit_code == 0);
  CHECK(status.out.find(fmt::format("job {} ({}): COMPLETED (exit code 0:0", id, name)) != std::string::npos);
}

TEST_CASE("A secret that is not set where the job is submitted is refused before anything is written", "[cli]") {
  const auto dir = job_test::scratch_dir("missing-secret");
  ht::Job job("secret-check");
  job.secret_env("HPCTRAIN_TEST_UNSET_SECRET");
  auto context = job_test::fixed_context();
  context.workdir = dir.string();
  try {
    ht::submit(job, context);
    FAIL("submitted");
  } catch (const ht::SpecError& e) {
    CHECK(std::string(e.what()) ==
          "[hpctrain.spec.env] env = HPCTRAIN_TEST_UNSET_SECRET: secret_env needs the variable set in the "
          "submitting environment");
  }
  CHECK_FALSE(fs::exists(dir / "hpctrain-jobs" / "secret-check"));
}

TEST_CASE("Status, logs and cancel work on a live job", "[cli][slurm]") {
  const auto dir = job_test::scratch_dir("live");
  const std::vector<std::pair<std::string, std::string>> env = {{"PROBE_NAME", "live-job"}};
  const auto submitted = job_test::run_probe(dir, {"--submit", "--sleep", "300"}, env);
  REQUIRE(submitted.exit_code == 0);
  const auto id = job_test::submitted_id(submitted.out);
  job_test::wait_for_running(id);

  const auto status = job_test::run_probe(dir, {"--status"}, env);
  CHECK(status.exit_code == 0);
  CHECK(status.out.starts_with(fmt::format("job {} (live-job): RUNNING (elapsed ", id)));
  CHECK(status.out.find("from squeue)") != std::string::npos);

  // Both ranks print before they sleep.
  std::string logs;
  for (int attempt = 0; attempt < 600 && logs.find("probe rank=1 ntasks") == std::string::npos; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    logs = job_test::run_probe(dir, {"--logs"}, env).out;
  }
  CHECK(logs.find("probe rank=0 ntasks=2 node=n1") != std::string::npos);
  CHECK(logs.find("probe rank=1 ntasks=2 node=n2") != std::string::npos);

  const auto cancelled = job_test::run_probe(dir, {"--cancel"}, env);
  CHECK(cancelled.exit_code == 0);
  CHECK(cancelled.out == fmt::format("cancelled job {}\n", id));
  CHECK(job_test::wait_for_end(id).state == "CANCELLED");
  const auto after = job_test::run_probe(dir, {"--status"}, env);
  CHECK(after.out.find(fmt::format("job {} (live-job): CANCELLED", id)) != std::string::npos);
}

TEST_CASE("Status without a submitted job says so", "[cli]") {
  const auto dir = job_test::scratch_dir("never-submitted");
  const auto result = job_test::run_probe(dir, {"--status"});
  CHECK(result.exit_code == 1);
  CHECK(result.err == fmt::format("[hpctrain.runtime.no_job] no job submitted yet from here ({} has none); use "
                                  "--submit\n",
                                  (dir / "hpctrain-jobs" / "probe").string()));
}

TEST_CASE("Hostile job names survive sbatch's directive parser", "[quoting][slurm]") {
  const auto dir = job_test::scratch_dir("names");
  auto name = GENERATE(as<std::string>{}, "plain", "two words", "it's", "say \"hi\"", "back\\slash", "#hash", "a # b",
                       "$(date) `id` ;|&", "λ→😀", " lead and trail ", "'\"'\"");
  CAPTURE(name);
  auto context = job_test::fixed_context();
  context.workdir = dir.string();
  const auto path = dir / "job.sbatch";
  job_test::write_file(path, ht::render_sbatch(ht::Job(name), context));
  const auto held = ht::run_process({"sbatch", "--parsable", "--hold", path.string()});
  REQUIRE(held.exit_code == 0);
  const auto id = ht::detail::trim(held.out);
  const auto shown = ht::run_process({"scontrol", "show", "job", id});
  ht::run_process({"scancel", id});
  const auto first_line = shown.out.substr(0, shown.out.find('\n'));
  CHECK(first_line == fmt::format("JobId={} JobName={}", id, name));
}

TEST_CASE("Local mode runs N workers on this machine without Slurm (--local N)", "[cli]") {
  const auto dir = job_test::scratch_dir("local");
  const auto result = job_test::run_probe(dir, {"--local", "2", "forwarded arg"});
  CAPTURE(result.err);
  CHECK(result.exit_code == 0);
  for (const auto* rank : {"0", "1"})
    CHECK(result.out.find(fmt::format("probe rank={} arg0={}\n", rank, job_test::hex("forwarded arg"))) !=
          std::string::npos);
}

TEST_CASE("A step that exits with the requeue code gets its job requeued by the script", "[cli][slurm]") {
  const auto dir = job_test::scratch_dir("requeue");
  const std::vector<std::pair<std::string, std::string>> env = {{"PROBE_NAME", "requeue"}, {"PROBE_REQUEUE", "1"}};
  // Every rank exits with 75; or rank 0 alone does (with the marker) and srun kills the other one (143).
  auto worker_args =
      GENERATE(std::vector<std::string>{"--exit-first-run", "75"}, std::vector<std::string>{"--requeue-first-run"});
  CAPTURE(worker_args);
  std::vector<std::string> args = {"--submit"};
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  const auto submitted = job_test::run_probe(dir, args, env);
  REQUIRE(submitted.exit_code == 0);
  const auto id = job_test::submitted_id(submitted.out);
  const auto script = job_test::read_file(dir / "hpctrain-jobs" / "requeue" / id / "job.sbatch");
  CHECK(script.find("--signal=USR2@60 \\\n") != std::string::npos);
  CHECK(script.find("#SBATCH --requeue\n#SBATCH --open-mode=append\n") != std::string::npos);
  CHECK(script.find(fmt::format("export HPCTRAIN_RUN_DIR={}/\"$SLURM_JOB_ID\"\n",
                                (dir / "hpctrain-jobs" / "requeue").string())) != std::string::npos);
  CHECK(script.find("export HPCTRAIN_REQUEUE_MARKER=\"$HPCTRAIN_RUN_DIR/requeue-requested\"\n") != std::string::npos);

  // Slurm holds a requeued job back (BeginTime, about two minutes here): seeing the script's requeue line
  // and the job's restart count go to 1 is the whole contract; the second run is the training tests' part.
  const auto log_path = dir / "hpctrain-jobs" / "requeue" / id / fmt::format("slurm-{}.out", id);
  const auto expected = fmt::format("hpctrain: job {} checkpointed; requeueing (restart 1 of 2)", id);
  std::string shown;
  for (int attempt = 0; attempt < 1200; ++attempt) {
    shown = ht::run_process({"scontrol", "show", "job", id}).out;
    if (shown.find("Restarts=1") != std::string::npos &&
        job_test::read_file(log_path).find(expected) != std::string::npos)
      break;
    if (shown.find("JobState=FAILED") != std::string::npos) break;  // it ended without a requeue
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  ht::run_process({"scancel", id});
  CHECK(job_test::read_file(log_path).find(expected) != std::string::npos);
  CHECK(shown.find("Restarts=1") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "hpctrain-jobs" / "requeue" / id / "requeue-requested"));
}

TEST_CASE("Status says clearly when neither squeue nor sacct knows the job", "[cli][slurm]") {
  const auto dir = job_test::scratch_dir("unknown-job");
  const auto root = dir / "hpctrain-jobs" / "probe";
  const std::string id = "987654321";  // far beyond what the local cluster has handed out
  fs::create_directories(root / id);
  job_test::write_file(root / "last", id + "\n");
  job_test::write_file(
      root / id / "job.json",
      fmt::format(R"({{"id": "{}", "name": "probe", "directory": "{}", "output_log": "{}",
                                       "error_log": "{}"}})",
                  id, (root / id).string(), (root / id / "out").string(), (root / id / "out").string()));
  const auto result = job_test::run_probe(dir, {"--status"});
  CHECK(result.exit_code == 1);
  CHECK(result.out ==
        fmt::format("job {}: unknown to squeue, sacct and scontrol (finished long ago, or purged)\n", id));
}

// The probe never calls install_spec_error_exit(): job/cli.hpp installs it before main.
TEST_CASE("A spec error raised while main builds the job exits 2 with its message", "[cli]") {
  const auto dir = job_test::scratch_dir("spec-error-in-main");
  const auto result = job_test::run_probe(dir, {"--submit"}, {{"PROBE_NODES", "0"}});
  CHECK(result.exit_code == 2);
  CHECK(result.err == "[hpctrain.spec.nodes] nodes = 0: must be at least 1\n");
  CHECK(is_empty_dir(dir));
}

TEST_CASE("Status reads the newest accounting row of a requeued job and counts its restarts", "[cli]") {
  // sacct -c after one requeue: the first run's row, then the second's (seen on the local Slurm 22.05).
  const ht::ProcessResult accounted{0, "41|REQUEUED|0:0|00:00:07\n41|COMPLETED|0:0|00:00:31\n", ""};
  const auto state = ht::detail::state_from_sacct("41", accounted);
  REQUIRE(state.has_value());
  CHECK(state->state == "COMPLETED");
  CHECK(state->detail == "exit code 0:0, elapsed 00:00:31, 1 restart(s)");
  const ht::ProcessResult once{0, "42|CANCELLED by 0|0:15|00:01:02\n42.batch|CANCELLED|0:15|00:01:02\n", ""};
  CHECK(ht::detail::state_from_sacct("42", once)->detail == "exit code 0:15, elapsed 00:01:02");
  CHECK(ht::detail::state_from_sacct("42", once)->state == "CANCELLED");

  const ht::ProcessResult shown{
      0, "JobId=43 JobName=x JobState=PENDING Reason=BeginTime Dependency=(null) Restarts=1 ExitCode=0:0 Nodes=1\n",
      ""};
  const auto pending = ht::detail::state_from_scontrol("43", shown);
  CHECK(pending.detail == "exit code 0:0, 1 restart(s)");
  CHECK(pending.hint == "it waits for its begin time (a requeued job waits about two minutes)");
}

TEST_CASE("A pending job's reason comes with what it means and what to try", "[cli]") {
  auto [reason, hint] = GENERATE(table<std::string, std::string>({
      {"(BadConstraints)", "no node can ever satisfy the request"},
      {"BadConstraints", "no node can ever satisfy the request"},
      {"(Resources)", "the nodes it needs are busy"},
      {"(Priority)", "jobs of higher priority are ahead of it"},
      {"(QOSMaxGRESPerUser)", "your QOS caps the GPUs you may hold at once"},
      {"(ReqNodeNotAvail, UnavailableNodes:n[1-2])", "a node it needs is down, drained or reserved"},
      {"(None)", ""},
      {"n1", ""},
  }));
  CAPTURE(reason);
  CHECK(ht::detail::pending_reason_hint(reason).substr(0, hint.size()) == hint);
  const ht::ProcessResult queued{0, fmt::format("PENDING|0:00|10:00|2|{}\n", reason), ""};
  CHECK(ht::detail::state_from_squeue("44", queued)->hint == ht::detail::pending_reason_hint(reason));
}

TEST_CASE("sbatch without a configuration source gets a hint about SLURM_CONF", "[cli]") {
  const std::string said =
      "sbatch: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
      "sbatch: error: fetch_config: DNS SRV lookup failed\n"
      "sbatch: error: _establish_config_source: failed to fetch config\n"
      "sbatch: fatal: Could not establish a configuration source";
  ht::Environment shell;  // the one sbatch ran in
  CHECK_THAT(ht::detail::explain_sbatch_failure(said, shell),
             Catch::EndsWith("(the local test cluster: `eval \"$(scripts/slurm-local env)\"`)."));
  shell.set("SLURM_CONF", "/nowhere/slurm.conf");
  CHECK_THAT(ht::detail::explain_sbatch_failure(said, shell),
             Catch::EndsWith("hint: SLURM_CONF = /nowhere/slurm.conf: is that your cluster's slurm.conf?"));
}

TEST_CASE("sbatch --test-only's refusals name the job's field and value", "[cli]") {
  // Slurm's words (captured from sbatch 22.05 here and its sources for the others), each mapped to the field the
  // user wrote; a value given as a raw --sbatch option is named as that option.
  auto job = ht::Job("refused")
                 .nodes(3)
                 .tasks_per_node(2)
                 .cpus_per_task(4)
                 .gpus_per_node("a100", 4)
                 .time(std::chrono::hours(100))
                 .partition("gpu")
                 .qos("high")
                 .account("proj");
  job.sbatch_option("reservation", "maint");
  auto [said, expected] = GENERATE(table<std::string, std::string>({
      {"sbatch: error: invalid partition specified: gpu\n",
       "[hpctrain.spec.partition] partition = gpu: this cluster refuses it"},
      {"allocation failure: Requested node configuration is not available\n",
       "[hpctrain.spec.resources] resources = --nodes=3 --ntasks-per-node=2 --cpus-per-task=4 --gpus-per-node=a100:4 "
       "--partition=gpu: "},
      {"sbatch: error: Invalid generic resource (gres) specification\n",
       "[hpctrain.spec.gpus_per_node] gpus_per_node = a100:4: "},
      {"sbatch: error: Invalid qos specification\n", "[hpctrain.spec.qos] qos = high: "},
      {"sbatch: error: Invalid account or account/partition combination specified\n",
       "[hpctrain.spec.account] account = proj: "},
      {"sbatch: error: Requested time limit is invalid (missing or exceeds some limit)\n",
       "[hpctrain.spec.time] time = 4-04:00:00: "},
      {"sbatch: error: Invalid reservation name\n",
       "[hpctrain.spec.sbatch_option] sbatch_option = reservation=maint: "},
  }));
  CAPTURE(said);
  const auto refusal = ht::detail::refusal_from_sbatch(job, said);
  const std::string message = refusal.what();
  CHECK(message.starts_with(expected));
  CHECK(message.find("(sbatch --test-only: " + said.substr(0, said.size() - 1) + ")\nhint: ") != std::string::npos);
}
