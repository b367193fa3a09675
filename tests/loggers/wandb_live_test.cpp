// The W&B logger online (train/loggers/wandb_live.hpp, http_client.hpp): against a local stand-in for W&B's HTTP API
// (tests/loggers/wandb_recording_server.py, which answers as W&B does and records every request, decoding the basic
// auth with Python's base64), the logger creates the run, streams its rows, summary and console lines with the offsets
// wandb's client sends, and ends the run; a server that holds, is down or answers 500 never holds or fails a logging
// call, and the offline run beside the stream stays whole, as wandb's own reader reads it (wandb_oracle.py). Checks
// count and order requests; none measures time.
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/files.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/job/wandb_sync.hpp>
#include <hpctrain/train/loggers/wandb.hpp>
#include <hpctrain/train/loggers/wandb_live.hpp>
#include <test_support.hpp>

namespace fs = std::filesystem;
using nlohmann::json;

// Named, the cases too: the unity build compiles this file in one unit with wandb_test.cpp and its helpers.
namespace wandb_live_test {

fs::path scratch(const std::string& name) {
  const char* build = std::getenv("HPCTRAIN_BUILD_DIR");
  const auto dir = fs::path(build ? build : "/tmp") / "test-scratch" / "loggers-live" / name;
  hpctrain::detail::remove_tree(dir);
  fs::create_directories(dir);
  return dir;
}

std::string python() {
  const char* configured = std::getenv("HPCTRAIN_PYTHON");
  return configured && *configured ? configured : std::string(std::getenv("HOME")) + "/.cache/hpctrain/venv/bin/python";
}

fs::path source(const std::string& relative) { return fs::path(std::getenv("HPCTRAIN_SOURCE_DIR")) / relative; }

/// tests/loggers/wandb_recording_server.py as a child process: its stdin is ours (closing it stops it), its first
/// stdout line names its port.
class RecordingServer {
 public:
  RecordingServer(const fs::path& record, const std::vector<std::string>& options) : record_(record) {
    int in[2], out[2];
    REQUIRE(::pipe(in) == 0);
    REQUIRE(::pipe(out) == 0);
    std::vector<std::string> argv = {python(), source("tests/loggers/wandb_recording_server.py").string(),
                                     record.string()};
    argv.insert(argv.end(), options.begin(), options.end());
    std::vector<char*> args;
    for (auto& arg : argv) args.push_back(arg.data());
    args.push_back(nullptr);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::close(in[0]);
      ::close(in[1]);
      ::close(out[0]);
      ::close(out[1]);
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    control_ = in[1];
    std::string line;
    char c = 0;
    while (::read(out[0], &c, 1) == 1 && c != '\n') line.push_back(c);
    ::close(out[0]);
    INFO("the recording server said: " << line);
    REQUIRE(line.starts_with("PORT "));
    port_ = std::stoi(line.substr(5));
  }
  RecordingServer(const RecordingServer&) = delete;
  RecordingServer& operator=(const RecordingServer&) = delete;
  ~RecordingServer() { stop(); }

  std::string url() const { return fmt::format("http://127.0.0.1:{}", port_); }
  /// Lets a `--mode hold` server answer.
  void release() {
    const std::string line = "release\n";
    REQUIRE(::write(control_, line.data(), line.size()) == static_cast<ssize_t>(line.size()));
  }
  /// Closes its stdin and waits for it to end: after this nothing listens on its port.
  void stop() {
    if (pid_ <= 0) return;
    ::close(control_);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  /// Every request answered so far, in order.
  std::vector<json> requests() const {
    std::vector<json> out;
    std::ifstream file(record_);
    for (std::string line; std::getline(file, line);) out.push_back(json::parse(line));
    return out;
  }

 private:
  fs::path record_;
  pid_t pid_ = -1;
  int control_ = -1;
  int port_ = 0;
};

hpctrain::WandbConnection connection_to(const std::string& url, int retries = 0) {
  hpctrain::WandbConnection connection;
  connection.mode = hpctrain::WandbMode::online;
  connection.base_url = url;
  connection.api_key = "local-test-key-0123456789abcdef";
  connection.key_source = "the test";
  connection.transmit_interval = std::chrono::milliseconds(0);  // a request as soon as a row comes: many requests
  connection.retry_max = retries;
  return connection;
}

hpctrain::LogRecord train_record(std::int64_t step) {
  return {step,
          "train",
          {{"epoch", static_cast<double>(step / 50)},
           {"loss", 2.5 / (1.0 + 0.02 * static_cast<double>(step))},
           {"lr", 1e-3},
           {"samples_per_s", 800.0 + static_cast<double>(step)}}};
}

hpctrain::RunInfo run_info(const fs::path& run_dir, std::optional<std::int64_t> resumed_from = std::nullopt) {
  return {run_dir, 2, "cpu", 100, 50, resumed_from};
}

/// The file stream requests' lines of `file`, checked to continue each other (offset = lines before, from `first`).
std::vector<std::string> streamed_lines(const std::vector<json>& requests, const std::string& file,
                                        std::int64_t first = 0) {
  std::vector<std::string> lines;
  for (const auto& request : requests) {
    if (!request["path"].get<std::string>().ends_with("/file_stream") || request["status"] != 200) continue;
    if (!request["body"].contains("files") || !request["body"]["files"].contains(file)) continue;
    const auto& chunk = request["body"]["files"][file];
    CHECK(chunk["offset"] == first + static_cast<std::int64_t>(lines.size()));
    for (const auto& line : chunk["content"]) lines.push_back(line.get<std::string>());
  }
  return lines;
}

/// The offline run under `run_dir` as wandb's reader reads it, or nothing when its python lacks wandb (a skip).
std::optional<json> read_offline(const fs::path& directory) {
  const auto result =
      hpctrain::run_process({python(), source("tests/loggers/wandb_oracle.py").string(), "dump", directory.string()});
  if (result.exit_code == 77) {
    WARN("skipped: " << result.out << result.err);
    return std::nullopt;
  }
  INFO("oracle stderr: " << result.err);
  REQUIRE(result.exit_code == 0);
  return json::parse(result.out);
}

/// Waits until `server` has answered `count` requests (the test's own pace, not a measure of the logger's).
void wait_for_requests(const RecordingServer& server, std::size_t count) {
  for (int i = 0; i < 6000 && server.requests().size() < count; ++i) ::usleep(10000);
  REQUIRE(server.requests().size() >= count);
}

/// The `.synced` marker wandb sync leaves (and skips), beside the offline run's .wandb file.
bool marked_synced(const fs::path& offline_run) {
  for (const auto& entry : fs::directory_iterator(offline_run))
    if (entry.path().string().ends_with(".wandb.synced")) return true;
  return false;
}

TEST_CASE(
    "Online, the W&B logger creates the run with its project, name and config, streams the history rows with the "
    "loss in order, the summary and the console lines, ends with exit code 0, and sends the key as basic auth",
    "[wandb][live][oracle]") {
  const auto dir = scratch("online");
  RecordingServer server(dir / "requests.jsonl", {});
  hpctrain::Knobs knobs;
  knobs.declare<std::int64_t>("epochs", 5, "passes");
  knobs.declare<double>("lr", 0.1, "rate");
  knobs.set("lr", "0.003");
  std::ostringstream messages;
  std::string run_id;
  fs::path offline;
  {
    hpctrain::WandbLogger logger(hpctrain::Wandb("hpctrain-live").name("live-run").tags({"baseline"}).job_type("train"),
                                 hpctrain::wandb_config(knobs), connection_to(server.url()), messages);
    logger.start(run_info(dir / "run"));
    run_id = logger.run_id();
    offline = logger.directory();
    logger.note("hello from the trainer");
    for (std::int64_t step = 5; step <= 100; step += 5) logger.log(train_record(step));
    logger.log({100, "eval", {{"loss", 0.75}, {"examples", 1000}, {"accuracy", 0.625}}});
    logger.note("test_accuracy=0.6250\nsecond line");
    logger.finish();
  }
  server.stop();
  const auto requests = server.requests();
  REQUIRE(requests.size() >= 3);
  for (const auto& request : requests) {
    CHECK(request["basic_auth"] == json::array({"api", "local-test-key-0123456789abcdef"}));
    CHECK(request["content_type"] == "application/json");
    CHECK(request["status"] == 200);
  }
  // The upsert: wandb's UpsertBucket mutation with the run's names, tags and config ({"key": {"value": ...}}).
  const auto& upsert = requests[0];
  CHECK(upsert["path"] == "/graphql");
  CHECK(upsert["body"]["operationName"] == "UpsertBucket");
  CHECK(upsert["body"]["query"].get<std::string>().find("upsertBucket(input:") != std::string::npos);
  const auto& variables = upsert["body"]["variables"];
  CHECK(variables["name"] == run_id);
  CHECK(variables["project"] == "hpctrain-live");
  CHECK(variables["entity"].is_null());  // none given: the key's default entity, which W&B answers with
  CHECK(variables["displayName"] == "live-run");
  CHECK(variables["jobType"] == "train");
  CHECK(variables["tags"] == json::array({"baseline"}));
  const auto config = json::parse(variables["config"].get<std::string>());
  CHECK(config["epochs"] == json{{"value", 5}});
  CHECK(config["lr"] == json{{"value", 0.003}});
  CHECK(config["hpctrain"]["value"]["world_size"] == 2);
  // The file stream, at the entity W&B answered with; offsets count lines.
  const auto stream_path = fmt::format("/files/hpctrain-entity/hpctrain-live/{}/file_stream", run_id);
  for (std::size_t i = 1; i < requests.size(); ++i) CHECK(requests[i]["path"] == stream_path);
  const auto history = streamed_lines(requests, "wandb-history.jsonl");
  REQUIRE(history.size() == 20);
  for (std::int64_t step = 5; step <= 100; step += 5) {
    CAPTURE(step);
    const auto row = json::parse(history[static_cast<std::size_t>(step / 5 - 1)]);
    CHECK(row["_step"] == step);
    CHECK(row["train/loss"] == train_record(step).get("loss").value());
    CHECK(row["train/epoch"] == step / 50);
    CHECK(row.contains("_runtime"));
    CHECK(row.contains("_timestamp"));
    CHECK(row.contains("eval/accuracy") == (step == 100));  // a train and an eval record of a step: one row
  }
  // The summary: every key's last value, and the run's runtime as wandb-core adds it.
  json summary;
  for (const auto& request : requests)
    if (request["body"].contains("files") && request["body"]["files"].contains("wandb-summary.json")) {
      CHECK(request["body"]["files"]["wandb-summary.json"]["offset"] == 0);
      summary = json::parse(request["body"]["files"]["wandb-summary.json"]["content"][0].get<std::string>());
    }
  CHECK(summary["_step"] == 100);
  CHECK(summary["eval/accuracy"] == 0.625);
  CHECK(summary["train/loss"] == train_record(100).get("loss").value());
  CHECK(summary["_wandb"]["runtime"].is_number_integer());
  // Console lines, as wandb-core writes output.log's: the UTC time to the microsecond, then the line.
  const auto console = streamed_lines(requests, "output.log");
  REQUIRE(console.size() == 3);
  const std::regex stamped(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6} (.*))");
  std::smatch match;
  const std::vector<std::string> texts = {"hello from the trainer", "test_accuracy=0.6250", "second line"};
  for (std::size_t i = 0; i < texts.size(); ++i) {
    REQUIRE(std::regex_match(console[i], match, stamped));
    CHECK(match[1] == texts[i]);
  }
  // The end: complete with exit code 0, last.
  CHECK(requests.back()["body"]["complete"] == true);
  CHECK(requests.back()["body"]["exitcode"] == 0);
  for (std::size_t i = 0; i + 1 < requests.size(); ++i) CHECK(!requests[i]["body"].contains("complete"));
  CHECK(hpctrain::test::count_occurrences(messages.str(), "logs live to " + server.url()) == 1);
  CHECK(messages.str().find("local-test-key") == std::string::npos);
  // The offline run beside it: whole, the same rows, and marked synced, so that wandb sync skips it.
  CHECK(marked_synced(offline));
  const auto run = read_offline(offline);
  if (!run) return;
  REQUIRE((*run)["history"].size() == history.size());
  for (std::size_t i = 0; i < history.size(); ++i) CHECK((*run)["history"][i] == json::parse(history[i]));
  CHECK((*run)["exit"]["exit_code"] == 0);
}

TEST_CASE(
    "A W&B server that answers nothing holds no logging call: every call returns before any answer, and all "
    "arrives once it answers",
    "[wandb][live]") {
  const auto dir = scratch("held");
  RecordingServer server(dir / "requests.jsonl", {"--mode", "hold"});
  std::ostringstream messages;
  hpctrain::WandbLogger logger(hpctrain::Wandb("hpctrain-live"), {}, connection_to(server.url()), messages);
  logger.start(run_info(dir / "run"));
  for (std::int64_t step = 1; step <= 60; ++step) logger.log(train_record(step));
  logger.note("every step logged");
  // Every call above returned; the server has answered (and recorded) nothing yet.
  CHECK(server.requests().empty());
  server.release();
  logger.finish();
  server.stop();
  const auto requests = server.requests();
  REQUIRE(requests.size() >= 2);  // the upsert, then what waited (in one request or more, by the thread's pace)
  CHECK(requests[0]["path"] == "/graphql");
  const auto history = streamed_lines(requests, "wandb-history.jsonl");
  REQUIRE(history.size() == 60);
  for (std::size_t i = 0; i < history.size(); ++i) CHECK(json::parse(history[i])["_step"] == i + 1);
  CHECK(requests.back()["body"]["complete"] == true);
  CHECK(messages.str().find("stopped") == std::string::npos);
  CHECK(marked_synced(logger.directory()));
}

TEST_CASE(
    "A W&B that is down, answers 500, or fails mid-run fails no logging call: the stream stops, saying so once, "
    "and the offline run is whole for --wandb-sync",
    "[wandb][live][oracle]") {
  const auto [name, options, answered] = GENERATE(table<std::string, std::vector<std::string>, int>({
      {"down", {}, -1},                   // nothing listens on the port
      {"500", {"--mode", "500"}, 0},      // every request answered 500
      {"lost", {"--fail-after", "1"}, 1}  // the upsert and one file stream request, then 500
  }));
  CAPTURE(name);
  const auto dir = scratch("failing-" + name);
  RecordingServer server(dir / "requests.jsonl", options);
  const auto url = server.url();
  if (name == "down") server.stop();
  std::ostringstream messages;
  fs::path offline;
  {
    hpctrain::WandbLogger logger(hpctrain::Wandb("hpctrain-live"), {}, connection_to(url, /*retries=*/1), messages);
    logger.start(run_info(dir / "run"));
    offline = logger.directory();
    logger.log(train_record(2));
    logger.log(train_record(4));  // writes the row of step 2
    // "lost": W&B takes the row of step 2 before the network goes (the server answers 500 from then on).
    if (name == "lost") wait_for_requests(server, 2);
    for (std::int64_t step = 6; step <= 60; step += 2) logger.log(train_record(step));
    logger.note("done");
    logger.finish();
  }
  server.stop();
  CAPTURE(messages.str());
  CHECK(hpctrain::test::count_occurrences(messages.str(), "W&B live logging to " + url + " stopped: ") == 1);
  CHECK(messages.str().find("upload it with --wandb-sync") != std::string::npos);
  CHECK(messages.str().find(offline.string()) != std::string::npos);
  CHECK(!marked_synced(offline));
  const auto requests = server.requests();
  if (name == "down") CHECK(requests.empty());
  if (name == "500") {
    REQUIRE(requests.size() == 2);  // the upsert and its one retry
    CHECK(requests[0]["path"] == "/graphql");
    CHECK(requests[1]["path"] == "/graphql");
  }
  if (name == "lost") {
    // What W&B took is the first row, from offset 0; then every request failed (the last one retried once).
    const auto history = streamed_lines(requests, "wandb-history.jsonl");
    REQUIRE(history.size() == 1);
    CHECK(json::parse(history[0])["_step"] == 2);
    CHECK(std::count_if(requests.begin(), requests.end(), [](const json& r) { return r["status"] == 200; }) ==
          1 + answered);
    REQUIRE(requests.size() == 4);  // the upsert, the row of step 2, a request W&B refused and its retry
    CHECK(requests[2]["status"] == 500);
    CHECK(requests[3]["body"] == requests[2]["body"]);
  }
  const auto run = read_offline(offline);
  if (!run) return;
  REQUIRE((*run)["history"].size() == 30);
  for (std::int64_t step = 2; step <= 60; step += 2)
    CHECK((*run)["history"][static_cast<std::size_t>(step / 2 - 1)]["_step"] == step);
  CHECK((*run)["output"] == json::array({"done\n"}));
  CHECK((*run)["exit"]["exit_code"] == 0);
}

TEST_CASE("A requeued run's next attempt continues the W&B run's history and console lines where the first left them",
          "[wandb][live]") {
  const auto dir = scratch("requeue");
  RecordingServer server(dir / "requests.jsonl", {});
  std::ostringstream messages;
  std::string run_id;
  {
    hpctrain::WandbLogger logger(hpctrain::Wandb("hpctrain-live"), {}, connection_to(server.url()), messages);
    logger.start(run_info(dir / "run"));
    run_id = logger.run_id();
    for (std::int64_t step = 10; step <= 50; step += 10) logger.log(train_record(step));
    logger.note("preempted: checkpointed step 50");
  }  // destroyed without finish(): stopped for a requeue
  const auto first = server.requests();
  {
    hpctrain::WandbLogger logger(hpctrain::Wandb("hpctrain-live"), {}, connection_to(server.url()), messages);
    logger.start(run_info(dir / "run", 30));  // steps 40 and 50 come again, and are not sent again
    for (std::int64_t step = 40; step <= 80; step += 10) logger.log(train_record(step));
    logger.note("resumed and done");
    logger.finish();
  }
  server.stop();
  const auto all = server.requests();
  const std::vector<json> second(all.begin() + static_cast<std::ptrdiff_t>(first.size()), all.end());
  // The first attempt: preempting, never complete.
  CHECK(std::any_of(first.begin(), first.end(), [](const json& r) { return r["body"].value("preempting", false); }));
  for (const auto& request : first) CHECK(!request["body"].contains("complete"));
  CHECK(streamed_lines(first, "wandb-history.jsonl").size() == 5);
  // The second: the same run upserted again, its lines after the first's, then complete.
  REQUIRE(!second.empty());
  CHECK(second[0]["body"]["variables"]["name"] == run_id);
  const auto history = streamed_lines(second, "wandb-history.jsonl", 5);
  REQUIRE(history.size() == 3);
  for (std::size_t i = 0; i < history.size(); ++i) CHECK(json::parse(history[i])["_step"] == 60 + 10 * i);
  CHECK(streamed_lines(second, "output.log", 1).size() == 1);
  CHECK(second.back()["body"]["complete"] == true);
  for (const auto& run : hpctrain::find_offline_wandb_runs(dir / "run")) CHECK(marked_synced(run));
}

TEST_CASE(
    "The connection comes from the environment as wandb reads it: WANDB_MODE, WANDB_BASE_URL, WANDB_API_KEY, "
    "else the base URL's host in .netrc",
    "[wandb][live]") {
  const auto dir = scratch("environment");
  std::ofstream(dir / "netrc") << "# wandb login wrote this\n"
                                  "machine example.org login someone password not-this-one\n"
                                  "machine api.wandb.ai\n  login user\n  password key-from-netrc\n"
                                  "machine localhost:8080 login user password key-for-port-8080\n"
                                  "default login anyone password key-from-default\n";
  const auto from = [&](std::map<std::string, std::string> variables) {
    variables.emplace("NETRC", (dir / "netrc").string());
    return hpctrain::WandbConnection::from_environment([&](const std::string& name) -> std::optional<std::string> {
      const auto found = variables.find(name);
      return found == variables.end() ? std::nullopt : std::optional(found->second);
    });
  };
  const auto plain = from({});
  CHECK(plain.mode == hpctrain::WandbMode::automatic);
  CHECK(plain.base_url == "https://api.wandb.ai");
  CHECK(plain.api_key == "key-from-netrc");
  CHECK(plain.key_source == (dir / "netrc").string());
  CHECK(plain.transmit_interval == std::chrono::seconds(15));
  const auto keyed = from({{"WANDB_API_KEY", "key-from-env"}, {"WANDB_MODE", "offline"}});
  CHECK(keyed.api_key == "key-from-env");
  CHECK(keyed.key_source == "WANDB_API_KEY");
  CHECK(keyed.mode == hpctrain::WandbMode::offline);
  const auto local = from({{"WANDB_BASE_URL", "http://localhost:8080/"},
                           {"WANDB_MODE", "online"},
                           {"WANDB__FILE_STREAM_TRANSMIT_INTERVAL", "0.5"}});
  CHECK(local.base_url == "http://localhost:8080");
  CHECK(local.api_key == "key-for-port-8080");
  CHECK(local.mode == hpctrain::WandbMode::online);
  CHECK(local.transmit_interval == std::chrono::milliseconds(500));
  CHECK(from({{"WANDB_BASE_URL", "https://wandb.example.com"}}).api_key == "key-from-default");
  CHECK(from({{"WANDB_MODE", "dryrun"}}).mode == hpctrain::WandbMode::offline);
  CHECK(from({{"WANDB_MODE", "run"}}).mode == hpctrain::WandbMode::online);
  CHECK(from({{"WANDB_MODE", "disabled"}}).mode == hpctrain::WandbMode::disabled);
  CHECK(hpctrain::test::message_of([&] {
          from({{"WANDB_MODE", "sometimes"}});
        }) ==
        "[hpctrain.runtime.wandb] WANDB_MODE = sometimes: must be online, offline or disabled (as wandb reads it)");
  CHECK(hpctrain::test::message_of([&] {
          from({{"WANDB__FILE_STREAM_TRANSMIT_INTERVAL", "soon"}});
        }) == "[hpctrain.runtime.wandb] WANDB__FILE_STREAM_TRANSMIT_INTERVAL = soon: must be a number of seconds");
  CHECK(hpctrain::detail::netrc_password("machine a password x", "b") == std::nullopt);
}

TEST_CASE(
    "The program's mode wins over the environment's: offline sends nothing even with a key, disabled writes "
    "nothing, online without a key says so and logs offline",
    "[wandb][live]") {
  const auto dir = scratch("modes");
  RecordingServer server(dir / "requests.jsonl", {});
  std::ostringstream messages;
  {
    hpctrain::WandbLogger logger(hpctrain::Wandb("hpctrain-live").mode(hpctrain::WandbMode::offline), {},
                                 connection_to(server.url()), messages);
    logger.start(run_info(dir / "offline"));
    logger.log(train_record(1));
    logger.finish();
  }
  {
    auto connection = connection_to(server.url());
    connection.mode = hpctrain::WandbMode::disabled;  // WANDB_MODE=disabled
    hpctrain::WandbLogger logger(hpctrain::Wandb("hpctrain-live"), {}, connection, messages);
    logger.start(run_info(dir / "disabled"));
    logger.log(train_record(1));
    logger.finish();
  }
  {
    auto connection = connection_to(server.url());
    connection.api_key.clear();
    hpctrain::WandbLogger logger(hpctrain::Wandb("hpctrain-live"), {}, connection, messages);
    logger.start(run_info(dir / "keyless"));
    logger.log(train_record(1));
    logger.finish();
  }
  server.stop();
  CHECK(server.requests().empty());
  CHECK(hpctrain::find_offline_wandb_runs(dir / "offline").size() == 1);
  CHECK(!fs::exists(dir / "disabled" / "wandb"));
  CHECK(hpctrain::find_offline_wandb_runs(dir / "keyless").size() == 1);
  CHECK(hpctrain::test::count_occurrences(messages.str(), "W&B mode is online, but no API key was found") == 1);
}

}  // namespace wandb_live_test
