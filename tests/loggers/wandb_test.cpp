// The W&B offline run writer (train/loggers/wandb_records.hpp), the W&B logger (train/loggers/wandb.hpp), the `--wandb
// [PROJECT]` knob and `--wandb-sync` (job/wandb_sync.hpp). The oracle is wandb's own reader of .wandb files (wandb
// 0.29's datastore.py and wandb_internal_pb2, through tests/loggers/wandb_oracle.py): a case whose oracle python lacks
// wandb is skipped with a warning, never passed.
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/files.hpp>
#include <hpctrain/job/cli.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/job/wandb_sync.hpp>
#include <hpctrain/train/loggers/wandb.hpp>
#include <hpctrain/train/loggers/wandb_records.hpp>
#include <test_support.hpp>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
fs::path scratch(const std::string& name) {
  const char* build = std::getenv("HPCTRAIN_BUILD_DIR");
  const auto dir = fs::path(build ? build : "/tmp") / "test-scratch" / "loggers" / name;
  hpctrain::detail::remove_tree(dir);
  fs::create_directories(dir);
  return dir;
}

/// The oracle's answer (its stdout, as JSON when `parse`), or nothing when its python lacks wandb (a skip).
std::optional<json> oracle(const std::vector<std::string>& args, bool parse = true) {
  const char* configured = std::getenv("HPCTRAIN_PYTHON");
  const std::string python =
      configured && *configured ? configured : std::string(std::getenv("HOME")) + "/.cache/hpctrain/venv/bin/python";
  const auto script = fs::path(std::getenv("HPCTRAIN_SOURCE_DIR")) / "tests/loggers/wandb_oracle.py";
  std::vector<std::string> command = {python, script.string()};
  command.insert(command.end(), args.begin(), args.end());
  const auto result = hpctrain::run_process(command);
  if (result.exit_code == 77) {
    WARN("skipped: " << result.out << result.err);
    return std::nullopt;
  }
  INFO("oracle stderr: " << result.err);
  REQUIRE(result.exit_code == 0);
  return parse ? json::parse(result.out) : json(result.out);
}

/// The offline run directories under `run_dir/wandb`, oldest first.
std::vector<fs::path> offline_runs(const fs::path& run_dir) { return hpctrain::find_offline_wandb_runs(run_dir); }

hpctrain::LogRecord train_record(std::int64_t step) {
  hpctrain::LogRecord record{step, "train", {}};
  record.values = {
      {"epoch", static_cast<double>(step / 100)},
      {"loss", 2.0 / (1.0 + 0.01 * static_cast<double>(step)) + std::exp(-static_cast<double>(step) / 77.0) / 3.0},
      {"lr", 1e-3 * std::cos(static_cast<double>(step) / 500.0)},
      {"samples_per_s", 1000.0 + static_cast<double>(step) / 3.0}};
  if (step == 250) record.values.push_back({"grad_norm", std::nan("")});
  if (step == 260) record.values.push_back({"grad_norm", HUGE_VAL});
  return record;
}

hpctrain::LogRecord eval_record(std::int64_t step) {
  return {step,
          "eval",
          {{"loss", 1.0 / 3.0 + 1.0 / static_cast<double>(step)},
           {"examples", 10000},
           {"accuracy", 0.5 + static_cast<double>(step) / 1999.0}}};
}

/// `value` as the oracle prints it: a number, or "NaN" / "Infinity" for the values JSON lacks.
json expected_number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return value;
}

/// The row the logger should write for `train_record(step)` (and `eval_record(step)` when `with_eval`).
json expected_row(std::int64_t step, bool with_eval) {
  json row{{"_step", step}};
  for (const auto& [key, value] : train_record(step).values)
    row["train/" + key] = key == "epoch" ? json(static_cast<std::int64_t>(value)) : expected_number(value);
  if (with_eval)
    for (const auto& [key, value] : eval_record(step).values)
      if (key != "examples") row["eval/" + key] = expected_number(value);
  return row;
}

/// `row` without the keys that carry wall time (checked apart).
json without_times(json row) {
  CHECK(row.contains("_runtime"));
  CHECK(row.contains("_timestamp"));
  row.erase("_runtime");
  row.erase("_timestamp");
  return row;
}

hpctrain::RunInfo run_info(const fs::path& run_dir, std::optional<std::int64_t> resumed_from = std::nullopt) {
  return {run_dir, 2, "cpu", 500, 100, resumed_from};
}
}  // namespace

TEST_CASE("CRC-32 is zlib's: 123456789 gives the check value 0xCBF43926, and a running value continues it", "[wandb]") {
  CHECK(hpctrain::detail::crc32_ieee("123456789") == 0xCBF43926u);
  CHECK(hpctrain::detail::crc32_ieee("6789", hpctrain::detail::crc32_ieee("12345")) == 0xCBF43926u);
  CHECK(hpctrain::detail::crc32_ieee("") == 0u);
}

TEST_CASE("wandb's readers read every record back wherever it falls against a 32 KiB block boundary",
          "[wandb][oracle]") {
  // One file per `left` from 0 to 8: a first record that leaves `left` bytes in block 0 (a tail too short for a
  // chunk header is zero-filled, exactly 7 gives an empty FIRST chunk), a 70000-byte record over three blocks, then
  // small ones. Each is a valid Record of exactly its size (a `uuid` of filler, with or without `num`), so that
  // wandb-core's reader decodes them too.
  const auto dir = scratch("frames");
  const auto record_of_size = [](std::size_t size, int seed) {
    for (std::size_t filler = size; filler-- > 0;)
      for (const bool numbered : {false, true}) {
        std::string record;
        if (numbered) hpctrain::detail::put_varint_field(record, 1, 1);
        std::string text(filler, 'x');
        for (std::size_t i = 0; i < filler; ++i)
          text[i] = static_cast<char>('a' + (static_cast<std::size_t>(seed) + 7 * i + (i >> 7)) % 26);
        hpctrain::detail::put_bytes(record, 19, text);  // Record.uuid
        if (record.size() == size) return record;
      }
    throw std::logic_error(fmt::format("no record of {} bytes", size));
  };
  std::vector<std::vector<std::string>> written;
  std::vector<std::string> args = {"frames"};
  for (int left = 0; left <= 8; ++left) {
    auto& records = written.emplace_back();
    records.push_back(record_of_size(32768 - 7 - 7 - static_cast<std::size_t>(left), left));
    records.push_back(record_of_size(70000, left + 1));
    for (int i = 0; i < 100; ++i) records.push_back(record_of_size(static_cast<std::size_t>(8 + i * 37), i));
    const auto file = dir / fmt::format("left-{}.wandb", left);
    hpctrain::WandbTransactionLog log(file);
    for (const auto& record : records) log.append(record);
    CHECK(log.size() == fs::file_size(file));
    args.push_back(file.string());
  }
  const auto frames = oracle(args);
  if (!frames) return;
  REQUIRE(frames->size() == written.size());
  for (std::size_t left = 0; left < written.size(); ++left) {
    CAPTURE(left);
    REQUIRE((*frames)[left].size() == written[left].size());
    for (std::size_t i = 0; i < written[left].size(); ++i) {
      CAPTURE(i);
      CHECK((*frames)[left][i][0].get<std::size_t>() == written[left][i].size());
      CHECK((*frames)[left][i][1].get<std::uint32_t>() == hpctrain::detail::crc32_ieee(written[left][i]));
    }
  }
}

TEST_CASE("wandb's reader reads back a logged run: run record, config, 50 rows with their steps, summary, exit code 0",
          "[wandb][oracle]") {
  const auto run_dir = scratch("run") / "hpctrain-jobs" / "fashion" / "12345";
  hpctrain::Knobs knobs;
  knobs.declare<std::int64_t>("epochs", 5, "passes");
  knobs.declare<double>("lr", 0.1, "rate");
  knobs.declare<bool>("compile", false, "switch");
  knobs.declare<std::string>("optimizer", "adamw", "name");
  knobs.declare_optional<std::int64_t>("warmup_steps", "not given: left out");
  knobs.declare_optional<std::string>("wandb", "the W&B project: left out");
  knobs.set("lr", "0.003").set("compile", "true").set("wandb", "fashion");
  auto config = hpctrain::wandb_config(knobs);
  std::string blob;  // 100 kB: the run record spans four blocks (FIRST, MIDDLE, MIDDLE, LAST)
  for (int i = 0; blob.size() < 100000; ++i) blob += fmt::format("{} ", i * 7919 % 10007);
  config.push_back({"blob", json(blob).dump()});
  ::setenv("SLURM_JOB_ID", "4242", 1);
  std::string run_id;
  fs::path directory;
  {
    hpctrain::WandbLogger logger(
        hpctrain::Wandb("hpctrain-test").entity("team").tags({"baseline", "cpu"}).notes("a test run").job_type("train"),
        config);
    logger.start(run_info(run_dir));
    ::unsetenv("SLURM_JOB_ID");
    run_id = logger.run_id();
    directory = logger.directory();
    logger.note("hello from the trainer");
    for (std::int64_t step = 10; step <= 500; step += 10) {
      logger.log(train_record(step));
      if (step == 500)
        logger.note(
            "parameters_crc32c=0badcafe");  // the digest, between the last train record and the final evaluation
      if (step % 100 == 0) logger.log(eval_record(step));
    }
    logger.note("test_accuracy=0.7501");
    logger.finish();
  }
  CHECK(run_id.size() == 8);
  CHECK(directory.parent_path() == run_dir / "wandb");
  CHECK(directory.filename().string().starts_with("offline-run-"));
  CHECK(directory.filename().string().ends_with("-" + run_id));
  CHECK(offline_runs(run_dir) == std::vector<fs::path>{directory});
  const auto run = oracle({"dump", directory.string()});
  if (!run) return;
  CHECK((*run)["file"] == "run-" + run_id + ".wandb");
  CHECK((*run)["files_dir"] == true);
  CHECK((*run)["header"]["producer"] == "hpctrain " HPCTRAIN_VERSION_STRING);
  CHECK((*run)["record_types"][0] == "header");
  CHECK((*run)["record_types"][1] == "run");
  CHECK((*run)["stream_ids"] == json::array({run_id}));
  for (std::size_t i = 0; i < (*run)["nums"].size(); ++i) CHECK((*run)["nums"][i] == static_cast<std::int64_t>(i + 1));
  const auto& record = (*run)["run"];
  CHECK(record["run_id"] == run_id);
  CHECK(record["project"] == "hpctrain-test");
  CHECK(record["entity"] == "team");
  CHECK(record["display_name"] == "fashion-12345");
  CHECK(record["group"] == "");
  CHECK(record["job_type"] == "train");
  CHECK(record["notes"] == "a test run");
  CHECK(record["tags"] == json::array({"baseline", "cpu"}));
  CHECK(std::abs(record["start_time"].get<double>() - hpctrain::detail::wandb_time_now()) < 600);
  json expected_config{{"epochs", 5}, {"lr", 0.003}, {"compile", true}, {"optimizer", "adamw"}, {"blob", blob}};
  expected_config["hpctrain"] = {{"world_size", 2},
                                 {"device", "cpu"},
                                 {"total_steps", 500},
                                 {"steps_per_epoch", 100},
                                 {"run_dir", run_dir.string()},
                                 {"version", HPCTRAIN_VERSION_STRING}};
  CHECK((*run)["config"] == expected_config);
  const auto& environment = (*run)["environment"];
  CHECK(environment["host"] == record["host"]);
  CHECK(!environment["host"].get<std::string>().empty());
  CHECK(environment["program"] == fs::read_symlink("/proc/self/exe").string());
  CHECK(environment["cpu_count"].get<int>() > 0);
  CHECK(environment["slurm"]["job_id"] == "4242");  // SLURM_JOB_ID, named as wandb-core names it
  // One row per step, the evaluations merged into the train rows of their steps.
  REQUIRE((*run)["history"].size() == 50);
  for (std::int64_t step = 10; step <= 500; step += 10) {
    CAPTURE(step);
    const auto& row = (*run)["history"][static_cast<std::size_t>(step / 10 - 1)];
    CHECK(without_times(row) == expected_row(step, step % 100 == 0));
  }
  json summary = expected_row(500, true);
  summary["train/grad_norm"] = "Infinity";  // the last value logged, at step 260
  CHECK(without_times((*run)["summary"]) == summary);
  CHECK((*run)["output"] ==
        json::array({"hello from the trainer\n", "parameters_crc32c=0badcafe\n", "test_accuracy=0.7501\n"}));
  CHECK((*run)["preempting"] == false);
  CHECK((*run)["exit"]["exit_code"] == 0);
  CHECK((*run)["exit"]["not_complete"] == false);
  CHECK((*run)["record_types"].back() == "exit");
}

TEST_CASE("A run killed mid-way leaves every row it flushed readable, and no exit record", "[wandb][oracle]") {
  const auto run_dir = scratch("killed");
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    hpctrain::WandbLogger logger(hpctrain::Wandb("hpctrain-test"));
    logger.start(run_info(run_dir));
    for (std::int64_t step = 10; step <= 200; step += 10) logger.log(train_record(step));
    ::raise(SIGKILL);  // no destructor, no finish: the row of step 200 is still pending
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGKILL);
  const auto runs = offline_runs(run_dir);
  REQUIRE(runs.size() == 1);
  const auto run = oracle({"dump", runs[0].string()});
  if (!run) return;
  REQUIRE((*run)["history"].size() == 19);
  for (std::int64_t step = 10; step <= 190; step += 10)
    CHECK(without_times((*run)["history"][static_cast<std::size_t>(step / 10 - 1)]) == expected_row(step, false));
  CHECK((*run)["exit"].is_null());
  CHECK((*run)["summary"]["_step"] == 190);
  CHECK((*run)["run"]["display_name"] == "killed");
}

TEST_CASE("A requeued run keeps its W&B run id in a second offline run, without the steps the first one wrote",
          "[wandb][oracle]") {
  // An array task's run directory: the task's name, and its job as the group.
  const auto run_dir = scratch("requeue") / "hpctrain-jobs" / "sweep" / "900" / "901_3";
  std::string first_id;
  {
    hpctrain::WandbLogger logger(hpctrain::Wandb("hpctrain-test"));
    logger.start(run_info(run_dir));
    first_id = logger.run_id();
    for (std::int64_t step = 10; step <= 50; step += 10) logger.log(train_record(step));
    logger.note("preempted: checkpointed step 50 of 500, exiting with 75 for requeue");
  }  // destroyed without finish() and without an exception: stopped for a requeue
  {
    hpctrain::WandbLogger logger(hpctrain::Wandb("hpctrain-test"));
    logger.start(run_info(run_dir, 30));  // resumed from an older checkpoint: steps 40 and 50 come again
    CHECK(logger.run_id() == first_id);
    for (std::int64_t step = 40; step <= 80; step += 10) logger.log(train_record(step));
    logger.finish();
  }
  const auto runs = offline_runs(run_dir);
  REQUIRE(runs.size() == 2);
  const auto first = oracle({"dump", runs[0].string()});
  if (!first) return;
  const auto second = oracle({"dump", runs[1].string()});
  CHECK((*first)["run"]["run_id"] == first_id);
  CHECK((*second)["run"]["run_id"] == first_id);
  CHECK((*first)["run"]["display_name"] == "sweep-900-901_3");
  CHECK((*first)["run"]["group"] == "sweep-900");
  CHECK((*first)["history"].size() == 5);
  CHECK((*first)["preempting"] == true);
  CHECK((*first)["exit"]["exit_code"] == 75);
  CHECK((*first)["exit"]["not_complete"] == true);
  REQUIRE((*second)["history"].size() == 3);
  for (std::int64_t step = 60; step <= 80; step += 10)
    CHECK(without_times((*second)["history"][static_cast<std::size_t>(step / 10 - 6)]) == expected_row(step, false));
  CHECK((*second)["config"]["hpctrain"]["resumed_from"] == 30);
  CHECK((*second)["preempting"] == false);
  CHECK((*second)["exit"]["exit_code"] == 0);
}

TEST_CASE("A run that fails with an exception ends with exit code 1", "[wandb][oracle]") {
  const auto run_dir = scratch("failed");
  try {
    hpctrain::WandbLogger logger(hpctrain::Wandb("hpctrain-test"));
    logger.start(run_info(run_dir));
    logger.log(train_record(10));
    throw std::runtime_error("a rank died");
  } catch (const std::runtime_error&) {
  }
  const auto runs = offline_runs(run_dir);
  REQUIRE(runs.size() == 1);
  const auto run = oracle({"dump", runs[0].string()});
  if (!run) return;
  CHECK((*run)["history"].size() == 1);
  CHECK((*run)["preempting"] == false);
  CHECK((*run)["exit"]["exit_code"] == 1);
  CHECK((*run)["exit"]["not_complete"] == false);
}

TEST_CASE("W&B names: a project W&B refuses is a spec error, a job name becomes a project", "[wandb]") {
  CHECK(hpctrain::test::message_of([] { hpctrain::Wandb("team/project"); }) ==
        "[hpctrain.spec.wandb] wandb.project = \"team/project\": must not hold / \\ # ? % or :");
  CHECK(hpctrain::test::message_of([] { hpctrain::Wandb(""); }) ==
        "[hpctrain.spec.wandb] wandb.project = \"\": must not be empty");
  CHECK(hpctrain::test::message_of([] { hpctrain::Wandb("p").entity("a:b"); }) ==
        "[hpctrain.spec.wandb] wandb.entity = \"a:b\": must not hold / \\ # ? % or :");
  CHECK(hpctrain::wandb_project_name("a/b:c") == "a-b-c");
  CHECK(hpctrain::wandb_project_name("") == "hpctrain");
}

TEST_CASE("The knob --wandb stands alone for the program's project, takes one, or turns W&B off", "[wandb][knobs]") {
  hpctrain::Knobs table;
  table.declare<double>("lr", 0.1, "rate");
  table.declare_optional<std::string>("wandb", "the W&B project", hpctrain::wandb_project_check());
  table.allow_bare("wandb", "fashion", "[PROJECT]");
  using Args = std::vector<std::string>;
  CHECK(table.with_arguments(Args{"--wandb"}).get<std::string>("wandb") == "fashion");
  CHECK(table.with_arguments(Args{"--wandb", "--lr", "0.5"}).get<std::string>("wandb") == "fashion");
  CHECK(table.with_arguments(Args{"--wandb", "--lr", "0.5"}).get<double>("lr") == 0.5);
  CHECK(table.with_arguments(Args{"--wandb", "mine"}).get<std::string>("wandb") == "mine");
  CHECK(table.with_arguments(Args{"--wandb=off"}).get<std::string>("wandb") == "off");
  CHECK(table.with_arguments(Args{"--wandb"}).arguments() == Args{"--wandb=fashion"});
  CHECK(!table.with_arguments(Args{}).given("wandb"));
  CHECK(hpctrain::test::message_of([&] {
          (void)table.with_arguments(Args{"--wandb", "a/b"});
        }) ==
        "[hpctrain.spec.knob] --wandb = a/b: must be a W&B project name (at most 128 characters, none of / \\ # ? % :) "
        "or off");
  CHECK(table.help().find("  --wandb [PROJECT]") != std::string::npos);
  CHECK(hpctrain::test::message_of([&] { table.allow_bare("wandb", "x%y", "[PROJECT]"); }) ==
        "[hpctrain.spec.knob] --wandb = x%y: its value without an argument must be a W&B project name (at most 128 "
        "characters, none of / \\ # ? % :) or off");
}

TEST_CASE(
    "The login command --wandb-sync finds the offline runs of a job's run directories and runs wandb sync on them, or "
    "prints the command",
    "[wandb][cli]") {
  const auto job_dir = scratch("sync") / "hpctrain-jobs" / "fashion" / "777";
  for (const auto& run :
       {job_dir / "wandb" / "offline-run-20261126_101010-abc",
        job_dir / "778_1" / "wandb" / "offline-run-20261126_101011-def",
        job_dir / "checkpoints" / "wandb" / "offline-run-decoy", job_dir / "wandb" / "run-20261126_101010-online"})
    fs::create_directories(run);
  const std::vector<fs::path> expected = {job_dir / "778_1" / "wandb" / "offline-run-20261126_101011-def",
                                          job_dir / "wandb" / "offline-run-20261126_101010-abc"};
  CHECK(hpctrain::find_offline_wandb_runs(job_dir) == expected);

  hpctrain::Knobs knobs;
  knobs.declare<double>("lr", 0.1, "rate");
  const auto parse = [&](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& arg : args) argv.push_back(arg.data());
    return hpctrain::parse_login_command(static_cast<int>(argv.size()), argv.data(), knobs);
  };
  CHECK(parse({"train", "--wandb-sync"}).mode == hpctrain::LoginCommand::Mode::wandb_sync);
  CHECK(parse({"train", "--wandb-sync"}).wandb_sync == "");
  CHECK(parse({"train", "--wandb-sync", job_dir.string()}).wandb_sync == job_dir.string());
  CHECK(hpctrain::test::message_of([&] {
          parse({"train", "--wandb-sync", "--status"});
        }) ==
        "[hpctrain.usage] choose one of --dry-run, --submit, --status, --logs, --cancel, --local, --run, --results, "
        "--plan, --wandb-sync");

  const std::string saved_path = std::getenv("PATH");
  const auto bin = scratch("sync-bin");
  const auto recorded = bin / "args.txt";
  std::ofstream(bin / "wandb") << "#!/bin/sh\nprintf '%s\\n' \"$@\" > '" << recorded.string() << "'\nexit 3\n";
  fs::permissions(bin / "wandb", fs::perms::owner_all);
  std::ostringstream out, err;
  // The login shell's environment, as the command is given it: wandb on its PATH, then nowhere.
  auto shell = hpctrain::Environment::of_this_process();
  const int synced = hpctrain::wandb_sync(job_dir, out, err, shell.set("PATH", bin.string() + ":" + saved_path));
  std::ostringstream printed, why;
  const int printed_code = hpctrain::wandb_sync(job_dir, printed, why, shell.set("PATH", "/nonexistent"));
  CHECK(synced == 3);  // wandb's own exit code
  std::ifstream args(recorded);
  CHECK(std::string(std::istreambuf_iterator<char>(args), {}) ==
        fmt::format("sync\n{}\n{}\n", expected[0].string(), expected[1].string()));
  CHECK(err.str().find("hpctrain: uploading 2 offline run(s): wandb sync ") == 0);
  CHECK(printed_code == hpctrain::exit_failure);
  CHECK(printed.str() == fmt::format("wandb sync {} {}\n", hpctrain::shell_quote(expected[0].string()),
                                     hpctrain::shell_quote(expected[1].string())));
  CHECK(why.str().find("wandb is not on PATH here") != std::string::npos);
  // Without RUN_DIR: the last submitted job's directory, as --status finds the job.
  const auto workdir = job_dir.parent_path().parent_path().parent_path();
  std::ofstream(job_dir.parent_path() / "last") << "777\n";
  std::ofstream(job_dir / "job.json") << json{
      {"id", "777"},
      {"name", "fashion"},
      {"directory", job_dir.string()},
      {"output_log", (job_dir / "slurm.out").string()},
      {"error_log",
       (job_dir / "slurm.out").string()}}.dump();
  hpctrain::LoginCommand command;
  command.mode = hpctrain::LoginCommand::Mode::wandb_sync;
  command.wandb_sync = "";
  hpctrain::RenderContext context;
  context.workdir = workdir.string();
  context.environment.set("PATH", "/nonexistent");
  std::ostringstream last_out, last_err;
  const int last_code =
      hpctrain::run_login_command(hpctrain::Job("fashion"), command, context, last_out, last_err, &knobs);
  CHECK(last_code == hpctrain::exit_failure);
  CHECK(last_out.str() == printed.str());
  const auto empty = scratch("sync-empty");
  CHECK(hpctrain::test::message_of([&] { hpctrain::wandb_sync(empty, out, err, shell); }) ==
        fmt::format("[hpctrain.runtime.wandb] no W&B offline run under {} (train with --wandb [PROJECT] to write one)",
                    empty.string()));
}
