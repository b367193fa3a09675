#pragma once
// W&B online: the W&B logger's live stream (train/loggers/wandb.hpp), for compute nodes that reach W&B. It speaks
// W&B's public HTTP API as wandb's own client does (wandb 0.29: wandb-core's core/internal/filestream and
// core/api/graphql/mutation_run.graphql; the Python client's sdk/internal/file_stream.py and internal_api.py):
//
//   POST {base}/graphql                                 the UpsertBucket mutation: creates (or, for a requeued run,
//                                                       updates) the run with its project, entity, name and config
//   POST {base}/files/{entity}/{project}/{id}/file_stream
//        {"files": {"wandb-history.jsonl": {"offset": N, "content": [row, ...]},      N counts history lines
//                   "wandb-summary.json":  {"offset": 0, "content": [summary]},       the whole summary each time
//                   "output.log":          {"offset": M, "content": [line, ...]}}}    M counts console lines
//        {} every 30 s without data (a heartbeat: W&B marks a silent run crashed), {"preempting": true} before a
//        requeue, and last {"complete": true, "exitcode": E}
//
// each with HTTP basic auth ("api", key). Offsets count lines, so a line sent twice lands on the same line.
//
// The training step never waits on the network: the logger's calls put rows on a bounded queue under a mutex, and a
// background thread sends them (batched: what came in during the previous request goes in the next). Nothing here
// throws into the training: on an HTTP error (after retries, as wandb retries 429 and 5xx), a lost network, or a
// queue the network cannot keep up with, the stream stops and says so once on stderr; the offline run the logger
// always writes beside it holds everything, and `--wandb-sync` uploads it. Torch-free; links libcurl.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/names.hpp>
#include <hpctrain/train/loggers/http_client.hpp>
#include <hpctrain/train/loggers/wandb_records.hpp>
#include <hpctrain/train/loggers/wandb_settings.hpp>
#include <hpctrain/version.hpp>

namespace hpctrain {

/// Where the live stream goes and how patiently: read from the environment as wandb reads it
/// (WandbConnection::from_environment), or given whole (the tests' recording server).
struct WandbConnection {
  WandbMode mode = WandbMode::automatic;          ///< WANDB_MODE: online (or run), offline (or dryrun), disabled
  std::string base_url = "https://api.wandb.ai";  ///< WANDB_BASE_URL
  std::string api_key;     ///< WANDB_API_KEY, else the password of the base URL's host in ~/.netrc (or $NETRC)
  std::string key_source;  ///< where the key came from, for messages (never the key itself)
  /// Data waits at most this long after the previous request (wandb-core's 15 s;
  /// WANDB__FILE_STREAM_TRANSMIT_INTERVAL, in seconds, as wandb's x_file_stream_transmit_interval).
  std::chrono::milliseconds transmit_interval{std::chrono::seconds(15)};
  /// A request that fails with 429, 5xx or no answer is tried again this many times, waiting 1 s, 2 s, 4 s...
  /// (WANDB__FILE_STREAM_RETRY_MAX).
  int retry_max = 5;
  HttpTimeouts timeouts;  ///< per request (WANDB__FILE_STREAM_TIMEOUT_SECONDS: the total)
  std::chrono::milliseconds heartbeat{std::chrono::seconds(30)};  ///< wandb-core's heartbeat period
  std::size_t queue_capacity = 10000;  ///< records waiting to be sent; more stops the stream (the step never waits)
  /// How long the end of the run waits for the last requests before it gives up on them.
  std::chrono::milliseconds finish_timeout{std::chrono::seconds(60)};

  /// A lookup of environment variables.
  using Lookup = std::function<std::optional<std::string>(const std::string&)>;
  /// The connection wandb would make from this environment (the rank's: the Trainer gives it). Throws RuntimeError
  /// `[hpctrain.runtime.wandb]` for a WANDB_MODE wandb does not know or a number that is not one.
  static WandbConnection from_environment(const Lookup& environment);
};

namespace detail {
/// `host[:port]` of `url` (what wandb looks up in .netrc: urlsplit(url).netloc), or empty.
inline std::string url_netloc(std::string_view url) {
  const auto scheme = url.find("://");
  if (scheme == std::string_view::npos) return "";
  url.remove_prefix(scheme + 3);
  url = url.substr(0, url.find_first_of("/?#"));
  if (const auto at = url.rfind('@'); at != std::string_view::npos) url.remove_prefix(at + 1);
  return std::string(url);
}

/// The password of `machine` in the .netrc text `netrc` (or of its `default` entry), as Python's netrc reads it:
/// whitespace-separated tokens, `machine NAME` / `default` opening an entry whose `login`, `account` and `password`
/// follow, `macdef` skipping to a blank line, `#` starting a comment at the start of a token.
inline std::optional<std::string> netrc_password(std::string_view netrc, std::string_view machine) {
  std::vector<std::string> tokens;
  std::istringstream lines{std::string(netrc)};
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string word;
    if (!(words >> word)) continue;
    if (word == "macdef") {  // a macro: its lines up to the next blank line are no tokens
      while (std::getline(lines, line) && line.find_first_not_of(" \t\r") != std::string::npos) {
      }
      continue;
    }
    do {
      if (word.front() == '#') break;
      tokens.push_back(word);
    } while (words >> word);
  }
  std::optional<std::string> found, fallback;
  bool in_entry = false, is_default = false;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == "machine" && i + 1 < tokens.size()) {
      in_entry = tokens[++i] == machine;
      is_default = false;
    } else if (tokens[i] == "default") {
      in_entry = false;
      is_default = true;
    } else if ((tokens[i] == "login" || tokens[i] == "account" || tokens[i] == "password") && i + 1 < tokens.size()) {
      const bool password = tokens[i] == "password";
      const auto& value = tokens[++i];
      if (password && in_entry && !found) found = value;
      if (password && is_default && !fallback) fallback = value;
    }
  }
  return found ? found : fallback;
}

inline WandbMode wandb_mode_named(const std::string& name) {
  if (name.empty()) return WandbMode::automatic;
  if (name == "online" || name == "run") return WandbMode::online;
  if (name == "offline" || name == "dryrun") return WandbMode::offline;
  if (name == "disabled") return WandbMode::disabled;
  throw RuntimeError(errors::runtime_wandb,
                     fmt::format("WANDB_MODE = {}: must be online, offline or disabled (as wandb reads it)", name));
}

inline double wandb_seconds_from(const std::string& variable, const std::string& text) {
  std::size_t used = 0;
  double seconds = -1;
  try {
    seconds = std::stod(text, &used);
  } catch (const std::exception&) {
  }
  if (used != text.size() || !(seconds >= 0))
    throw RuntimeError(errors::runtime_wandb, fmt::format("{} = {}: must be a number of seconds", variable, text));
  return seconds;
}

/// `text` with the characters a URL path segment may not hold percent-encoded.
inline std::string url_path_segment(std::string_view text) {
  std::string out;
  for (const unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') out.push_back(static_cast<char>(c));
    else out += fmt::format("%{:02X}", c);
  }
  return out;
}

/// A JSON object's text from items whose values are JSON text already (NaN and Infinity kept as W&B writes them).
inline std::string json_object_text(const std::vector<WandbItem>& items) {
  std::string out = "{";
  for (const auto& item : items) {
    if (out.size() > 1) out.push_back(',');
    out += nlohmann::json(item.key).dump();
    out.push_back(':');
    out += item.value_json;
  }
  out.push_back('}');
  return out;
}

/// The lines of `text` (a last newline ends the last line; it does not open another).
inline std::vector<std::string_view> console_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    const auto end = text.find('\n');
    lines.push_back(text.substr(0, end));
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
  }
  return lines;
}

/// wandb-core's console line (runconsolelogs LegacyFormat): the UTC time to the microsecond, a space, the text.
inline std::string wandb_console_line(double seconds_since_epoch, std::string_view text) {
  const auto whole = static_cast<std::time_t>(seconds_since_epoch);
  const auto micros = static_cast<long>((seconds_since_epoch - static_cast<double>(whole)) * 1e6);
  std::tm utc{};
  gmtime_r(&whole, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &utc);
  return fmt::format("{}.{:06d} {}", stamp, std::clamp(micros, 0L, 999999L), text);
}
}  // namespace detail

inline WandbConnection WandbConnection::from_environment(const Lookup& environment) {
  WandbConnection connection;
  connection.mode = detail::wandb_mode_named(environment("WANDB_MODE").value_or(""));
  if (auto base = environment("WANDB_BASE_URL")) {
    while (!base->empty() && base->back() == '/') base->pop_back();
    if (!base->empty()) connection.base_url = *base;
  }
  if (auto key = environment("WANDB_API_KEY")) {
    connection.api_key = *key;
    connection.key_source = "WANDB_API_KEY";
  } else {
    // wandb's wbnetrc.py: $NETRC, else ~/.netrc; the entry of the base URL's host (with its port, if any).
    std::filesystem::path netrc;
    if (auto named = environment("NETRC")) netrc = *named;
    else if (auto home = environment("HOME")) netrc = std::filesystem::path(*home) / ".netrc";
    std::ifstream file(netrc);
    const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    if (auto password = detail::netrc_password(text, detail::url_netloc(connection.base_url))) {
      connection.api_key = *password;
      connection.key_source = netrc.string();
    }
  }
  using milliseconds = std::chrono::milliseconds;
  const auto seconds = [&](const char* variable) -> std::optional<milliseconds> {
    const auto text = environment(variable);
    if (!text) return std::nullopt;
    return milliseconds(static_cast<std::int64_t>(detail::wandb_seconds_from(variable, *text) * 1000));
  };
  if (auto interval = seconds("WANDB__FILE_STREAM_TRANSMIT_INTERVAL")) connection.transmit_interval = *interval;
  if (auto total = seconds("WANDB__FILE_STREAM_TIMEOUT_SECONDS")) connection.timeouts.total = *total;
  if (auto retries = environment("WANDB__FILE_STREAM_RETRY_MAX")) {
    if (retries->empty() || retries->size() > 4 || retries->find_first_not_of("0123456789") != std::string::npos)
      throw RuntimeError(errors::runtime_wandb,
                         fmt::format("WANDB__FILE_STREAM_RETRY_MAX = {}: must be a whole number", *retries));
    connection.retry_max = std::stoi(*retries);
  }
  return connection;
}

/// What the run is created with on W&B (UpsertBucket's variables), and where its files continue (a requeued run's
/// later attempt continues the lines its earlier ones sent).
struct WandbLiveStart {
  WandbRunStart run;                  ///< id, project, entity, names, tags, host, config
  std::string program;                ///< the program's path (`jobProgram`)
  std::int64_t history_lines = 0;     ///< history rows written before this attempt
  std::int64_t output_lines = 0;      ///< console lines written before this attempt
  std::filesystem::path offline_run;  ///< the offline run beside it, named when the stream stops
};

/// One attempt's live stream: the upsert and the file stream, sent by a background thread from a bounded queue.
/// The calls never block on the network and never throw.
class WandbLiveRun {
 public:
  /// Starts the background thread, which creates the run on W&B first. `messages`: where the one line about the
  /// stream (live, or stopped and why) goes.
  WandbLiveRun(WandbConnection connection, WandbLiveStart start, std::ostream& messages)
      : connection_(std::move(connection)),
        start_(std::move(start)),
        messages_(messages),
        history_offset_(start_.history_lines),
        output_offset_(start_.output_lines),
        client_() {
    thread_ = std::thread([this] { run(); });
  }
  WandbLiveRun(const WandbLiveRun&) = delete;
  WandbLiveRun& operator=(const WandbLiveRun&) = delete;
  /// Without finish(): gives up on what is not sent, at once.
  ~WandbLiveRun() {
    {
      std::lock_guard lock(mutex_);
      ending_ = true;
      abort_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  /// One history row: a JSON object's text.
  void history(std::string row) { push(Line{Line::history, std::move(row)}); }
  /// The whole summary (a JSON object's text): replaces the one not yet sent.
  void summary(std::string summary) {
    std::lock_guard lock(mutex_);
    if (stopped_) return;
    summary_ = std::move(summary);
    wake_.notify_one();
  }
  /// Console output at `time` (seconds since the epoch), one console line per line of `text`.
  void output(double time, std::string_view text) {
    for (const auto line : detail::console_lines(text))
      push(Line{Line::output, detail::wandb_console_line(time, line)});
  }
  /// The run stops to be requeued: W&B shows it preempted.
  void preempting() {
    std::lock_guard lock(mutex_);
    preempting_ = true;
    wake_.notify_one();
  }

  /// Sends what is queued, then `{"complete": true, "exitcode": E}` (or, without an exit code, nothing more: the run
  /// stays running for its requeued attempt), waiting for it at most the connection's finish_timeout. True when W&B
  /// took every record of this attempt.
  bool finish(std::optional<int> exit_code) {
    {
      std::lock_guard lock(mutex_);
      ending_ = true;
      exit_code_ = exit_code;
    }
    wake_.notify_all();
    std::unique_lock lock(mutex_);
    if (!done_.wait_for(lock, connection_.finish_timeout, [this] { return thread_done_; })) {
      abort_ = true;  // the request in flight and any retry wait end at once
      stop(lock, fmt::format("the last requests did not finish within {} s",
                             std::chrono::duration_cast<std::chrono::seconds>(connection_.finish_timeout).count()));
      wake_.notify_all();
    }
    lock.unlock();
    if (thread_.joinable()) thread_.join();
    std::lock_guard relock(mutex_);
    return delivered_;
  }

 private:
  struct Line {
    enum Kind { history, output } kind;
    std::string text;
  };
  using clock = std::chrono::steady_clock;
  static constexpr std::size_t max_request_bytes = 10 << 20;  // wandb-core's defaultMaxRequestSizeBytes

  void push(Line line) {
    std::unique_lock lock(mutex_);
    if (stopped_ || ending_) return;
    if (lines_.size() >= connection_.queue_capacity) {
      stop(lock, fmt::format("{} records waited to be sent: the network does not keep up", lines_.size()));
      wake_.notify_all();
      return;
    }
    lines_.push_back(std::move(line));
    wake_.notify_one();
  }

  /// Marks the stream stopped and says why, once. Called with the mutex held.
  void stop(std::unique_lock<std::mutex>&, const std::string& why) {
    if (stopped_) return;
    stopped_ = true;
    lines_.clear();
    summary_.clear();
    messages_ << fmt::format(
                     "hpctrain: W&B live logging to {} stopped: {}. The run goes on in the offline run {}; upload it "
                     "with --wandb-sync\n",
                     connection_.base_url, why, start_.offline_run.string())
              << std::flush;
  }

  void run() {
    auto ended = [this](bool delivered) {
      std::lock_guard lock(mutex_);
      delivered_ = delivered && !stopped_;
      thread_done_ = true;
      done_.notify_all();
    };
    if (!upsert()) return ended(false);
    auto last_post = clock::now();
    bool more = false;  // the previous request left lines behind (the size limit): send on at once
    while (true) {
      std::unique_lock lock(mutex_);
      const auto has_data = [this] { return !lines_.empty() || !summary_.empty() || preempting_; };
      while (!ending_ && !stopped_ && !more) {
        const auto deadline = last_post + (has_data() ? connection_.transmit_interval : connection_.heartbeat);
        if (clock::now() >= deadline) break;
        wake_.wait_until(lock, deadline);
      }
      if (stopped_) break;
      nlohmann::json request = nlohmann::json::object();
      std::vector<std::string> history, output;
      std::size_t bytes = 0;
      while (!lines_.empty() && (bytes == 0 || bytes + lines_.front().text.size() <= max_request_bytes)) {
        bytes += lines_.front().text.size();
        (lines_.front().kind == Line::history ? history : output).push_back(std::move(lines_.front().text));
        lines_.pop_front();
      }
      more = !lines_.empty();
      const std::string summary = std::exchange(summary_, {});
      if (std::exchange(preempting_, false)) request["preempting"] = true;
      const bool last = ending_ && !more;
      if (last && exit_code_) {
        request["complete"] = true;
        request["exitcode"] = *exit_code_;
      }
      lock.unlock();
      // Each line goes as a string: history rows and the summary are JSON objects' text (NaN and Infinity included,
      // as wandb writes them), console lines plain text.
      nlohmann::json files = nlohmann::json::object();
      if (!history.empty()) files["wandb-history.jsonl"] = {{"offset", history_offset_}, {"content", history}};
      if (!summary.empty())
        files["wandb-summary.json"] = {{"offset", 0}, {"content", nlohmann::json::array({summary})}};
      if (!output.empty()) files["output.log"] = {{"offset", output_offset_}, {"content", output}};
      if (!files.empty()) request["files"] = std::move(files);
      if (request.empty() && last) break;  // the end, with nothing left to say
      const auto body = request.dump();
      if (!post(stream_url_, body)) return ended(false);
      history_offset_ += static_cast<std::int64_t>(history.size());
      output_offset_ += static_cast<std::int64_t>(output.size());
      last_post = clock::now();
      if (last) break;
    }
    ended(true);
  }

  /// UpsertBucket (internal_api.py's upsert_run; wandb-core sends the same mutation): creates the run, and learns
  /// the entity (the key's default entity when the program names none) for the file stream's URL.
  bool upsert() {
    const auto& run = start_.run;
    const auto or_null = [](const std::string& text) { return text.empty() ? nlohmann::json() : nlohmann::json(text); };
    std::vector<WandbItem> config;  // wandb-core's backend config: {"key": {"value": value}}
    for (const auto& item : run.config) config.push_back({item.key, "{\"value\":" + item.value_json + "}"});
    nlohmann::json variables{{"name", run.run_id},
                             {"project", run.project},
                             {"entity", or_null(run.entity)},
                             {"groupName", or_null(run.group)},
                             {"displayName", or_null(run.display_name)},
                             {"notes", or_null(run.notes)},
                             {"jobType", or_null(run.job_type)},
                             {"host", or_null(run.host)},
                             {"program", or_null(start_.program)},
                             {"config", detail::json_object_text(config)}};
    if (!run.tags.empty()) variables["tags"] = run.tags;
    const nlohmann::json body{
        {"query", upsert_bucket_mutation}, {"variables", variables}, {"operationName", "UpsertBucket"}};
    std::string answer;
    if (!post(connection_.base_url + "/graphql", body.dump(), &answer)) return false;
    const auto reply = nlohmann::json::parse(answer, nullptr, /*allow_exceptions=*/false);
    const auto project = nlohmann::json::json_pointer("/data/upsertBucket/bucket/project");
    std::unique_lock lock(mutex_);
    if (reply.is_object() && reply.contains("errors") && !reply["errors"].empty()) {
      const auto& first = reply["errors"][0];
      stop(lock, fmt::format("W&B refused the run: {}",
                             first.is_object() && first.contains("message") ? first["message"].dump() : first.dump()));
      return false;
    }
    if (!reply.is_object() || !reply.contains(project) || !reply[project].value("name", nlohmann::json()).is_string() ||
        !reply[project].contains("entity") || !reply[project]["entity"].value("name", nlohmann::json()).is_string()) {
      stop(lock, fmt::format("W&B's answer to UpsertBucket names no project and entity: {}", answer.substr(0, 200)));
      return false;
    }
    const auto entity = reply[project]["entity"]["name"].get<std::string>();
    const auto project_name = reply[project]["name"].get<std::string>();
    stream_url_ = fmt::format("{}/files/{}/{}/{}/file_stream", connection_.base_url, detail::url_path_segment(entity),
                              detail::url_path_segment(project_name), detail::url_path_segment(run.run_id));
    messages_ << fmt::format("hpctrain: W&B run {}/{}/{} logs live to {} (and offline to {})\n", entity, project_name,
                             run.run_id, connection_.base_url, start_.offline_run.string())
              << std::flush;
    return true;
  }

  /// One request, tried again after 429, 5xx or no answer (as wandb's request_with_retry): true on a 2xx answer.
  /// On anything else the stream stops, saying why.
  bool post(const std::string& url, const std::string& body, std::string* answer = nullptr) {
    auto wait = std::chrono::milliseconds(1000);
    for (int attempt = 0;; ++attempt) {
      auto response = client_.post_json(url, body, "api", connection_.api_key, "hpctrain " HPCTRAIN_VERSION_STRING,
                                        connection_.timeouts, &abort_);
      if (response.ok()) {
        if (answer != nullptr) *answer = std::move(response.body);
        return true;
      }
      const bool retried = response.status == 0 || response.status == 429 || response.status >= 500;
      std::unique_lock lock(mutex_);
      if (abort_ || stopped_) return false;
      if (!retried || attempt >= connection_.retry_max) {
        const auto why = response.status == 0
                             ? response.error
                             : fmt::format("HTTP {} from {}: {}", response.status, url, response.body.substr(0, 200));
        stop(lock, attempt > 0 ? fmt::format("{} (after {} tries)", why, attempt + 1) : why);
        return false;
      }
      wake_.wait_for(lock, wait, [this] { return abort_.load(); });
      wait = std::min(wait * 2, std::chrono::milliseconds(std::chrono::seconds(60)));
    }
  }

  static constexpr std::string_view upsert_bucket_mutation = R"(mutation UpsertBucket(
  $id: String, $name: String, $project: String, $entity: String, $groupName: String, $description: String,
  $displayName: String, $notes: String, $commit: String, $config: JSONString, $host: String, $debug: Boolean,
  $program: String, $repo: String, $jobType: String, $state: String, $sweep: String, $tags: [String!],
  $summaryMetrics: JSONString,
) {
  upsertBucket(input: {
    id: $id, name: $name, groupName: $groupName, modelName: $project, entityName: $entity, description: $description,
    displayName: $displayName, notes: $notes, config: $config, commit: $commit, host: $host, debug: $debug,
    jobProgram: $program, jobRepo: $repo, jobType: $jobType, state: $state, sweep: $sweep, tags: $tags,
    summaryMetrics: $summaryMetrics,
  }) {
    bucket { id name displayName description config sweepName project { id name entity { id name } } historyLineCount }
    inserted
  }
})";

  const WandbConnection connection_;
  const WandbLiveStart start_;
  std::ostream& messages_;
  // Touched by the background thread alone.
  std::int64_t history_offset_, output_offset_;
  HttpClient client_;
  std::string stream_url_;
  // Shared, under mutex_.
  mutable std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::deque<Line> lines_;
  std::string summary_;
  bool preempting_ = false, ending_ = false, stopped_ = false, thread_done_ = false, delivered_ = false;
  std::optional<int> exit_code_;
  std::atomic<bool> abort_{false};
  std::thread thread_;
};

}  // namespace hpctrain
