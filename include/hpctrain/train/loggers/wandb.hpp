#pragma once
// Weights & Biases: the W&B logger always writes the offline run that `wandb.init(mode="offline")` would, under the
// run directory (`<run_dir>/wandb/offline-run-<time>-<id>/`), which the login node uploads with `wandb sync`
// (`./train --wandb-sync`): compute nodes often have no internet. Where they reach W&B and an API key is found (or
// WANDB_MODE=online), it also streams the run live (train/loggers/wandb_live.hpp), as wandb keeps its local files
// beside an online run; a stream that delivered the whole attempt marks the offline run synced (wandb's
// `run-<id>.wandb.synced`, which `wandb sync` skips). The file format is train/loggers/wandb_records.hpp. Enabled with
// `Training::wandb("project")` or `--wandb [PROJECT]`. Torch-free; links libcurl for the live stream.
//
// What a run holds: the run record (project, id, name, start time, config: the knobs' values and the run's
// facts under `hpctrain`), the host's facts (environment record: host, OS, program, arguments, CPUs, SLURM_*),
// one history row per step (`_step`, `train/<name>` and `eval/<name>` as TensorBoard names them, `_runtime`,
// `_timestamp`), a summary update after each row (W&B's summary: every key's last value), the Trainer's notes as
// console lines, and the exit record. A train and an eval record of the same step make one row, as wandb.log
// merges them; that row is written when a later step or the end comes (a note in between, such as the digest
// before the final evaluation, does not split it).
//
// A requeued run (same run directory) keeps its W&B run id (`wandb/hpctrain-run.json`) and writes a second
// offline run directory with it, as a resumed offline wandb run does; `wandb sync` uploads both into one run, in
// order. Rows at steps an earlier attempt already wrote (after a crash, the resume repeats them) are skipped.
// An attempt that stops for a requeue ends with a preempting record and an exit record that leaves the run
// running; one that fails (an exception) with exit code 1.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/utsname.h>  // uname: the OS line of the environment record
#include <unistd.h>       // gethostname

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/names.hpp>
#include <hpctrain/train/loggers/logger.hpp>
#include <hpctrain/train/loggers/wandb_live.hpp>
#include <hpctrain/train/loggers/wandb_records.hpp>
#include <hpctrain/train/loggers/wandb_settings.hpp>
#include <hpctrain/version.hpp>

namespace hpctrain {

/// The knob `--wandb [PROJECT]`'s check: a W&B project name, or `off` (or empty): no W&B run.
inline KnobCheck<std::string> wandb_project_check() {
  return KnobCheck<std::string>(
      [](const std::string& value) { return value.empty() || value == "off" || !detail::wandb_name_problem(value); },
      "must be a W&B project name (at most 128 characters, none of / \\ # ? % :) or off");
}

/// `name` as a W&B project name: what W&B refuses in a project name becomes `-`, cut to 128 characters.
inline std::string wandb_project_name(std::string_view name) {
  std::string project(name.substr(0, 128));
  for (auto& c : project)
    if (std::string_view("/\\#?%:").find(c) != std::string_view::npos) c = '-';
  return project.empty() ? "hpctrain" : project;
}

/// A run's config for W&B: every knob with a value (given, else its default), by its snake_case name; the
/// `wandb` knob itself is left out.
inline std::vector<WandbItem> wandb_config(const Knobs& knobs) {
  std::vector<WandbItem> items;
  for (const auto& spec : knobs.specs()) {
    if (spec.name == "wandb") continue;
    const auto value = knobs.value(spec.name);
    if (!value) continue;
    items.push_back({spec.name, std::visit(
                                    [](const auto& v) {
                                      if constexpr (std::is_same_v<std::decay_t<decltype(v)>, double>)
                                        return wandb_number(v);
                                      else return nlohmann::json(v).dump();
                                    },
                                    *value)});
  }
  return items;
}

namespace detail {
/// `fashion` and `12345` (or `12345/12346_3`) for a run directory `.../hpctrain-jobs/fashion/12345[/12346_3]`;
/// nothing for a directory outside that layout.
inline std::optional<std::pair<std::string, std::filesystem::path>> job_of_run_directory(
    const std::filesystem::path& run_dir) {
  std::filesystem::path below;
  for (auto directory = run_dir.lexically_normal(); directory.has_parent_path() && directory != directory.parent_path();
       directory = directory.parent_path()) {
    if (directory.parent_path().filename().string() == layout::jobs_root)
      return std::pair{directory.filename().string(), below};
    below = below.empty() ? directory.filename() : directory.filename() / below;
  }
  return std::nullopt;
}

/// What this host is: W&B's environment record.
inline WandbEnvironment wandb_environment(double now) {
  WandbEnvironment facts;
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  facts.host = host;
  if (utsname name{}; ::uname(&name) == 0) facts.os = fmt::format("{}-{}-{}", name.sysname, name.release, name.machine);
  std::error_code error;
  facts.program = std::filesystem::read_symlink("/proc/self/exe", error).string();
  facts.root = std::filesystem::current_path(error).string();
  std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);
  for (std::string arg; std::getline(cmdline, arg, '\0');) facts.args.push_back(arg);
  if (!facts.args.empty()) facts.args.erase(facts.args.begin());  // argv[0]: the program, which `program` names
  facts.started_at = now;
  facts.cpu_count = std::thread::hardware_concurrency();
  const auto environment = Environment::of_this_process();
  for (const auto& [name, value] : environment.variables()) {
    if (!name.starts_with("SLURM_")) continue;
    std::string key = name.substr(6);
    for (auto& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    facts.slurm.emplace_back(std::move(key), value);
  }
  return facts;
}

inline double wandb_time_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}
}  // namespace detail

/// Writes the run as a W&B offline run under `<run_dir>/wandb/`, and streams it live where W&B is reached (see the
/// top of this file). Rank 0 only, as every logger. Throws RuntimeError `[hpctrain.runtime.wandb]` when the offline
/// run cannot be written; the live stream never throws.
class WandbLogger : public Logger {
 public:
  /// `settings`: where the run goes; `config`: its config (wandb_config(knobs)); `connection`: how to reach W&B (the
  /// Trainer passes WandbConnection::from_environment(); the default, without a key, stays offline); `messages`: where
  /// the live stream's one line goes.
  explicit WandbLogger(Wandb settings, std::vector<WandbItem> config = {}, WandbConnection connection = {},
                       std::ostream& messages = std::cerr)
      : settings_(std::move(settings)),
        config_(std::move(config)),
        connection_(std::move(connection)),
        messages_(&messages),
        exceptions_at_start_(std::uncaught_exceptions()) {}
  WandbLogger(const WandbLogger&) = delete;
  WandbLogger& operator=(const WandbLogger&) = delete;

  /// Without finish(): a failing attempt (an exception on its way) ends with exit code 1; one that stopped
  /// for a requeue with a preempting record and an exit record that keeps the W&B run running.
  ~WandbLogger() override {
    if (!run_ || finished_) return;
    try {
      write_row();
      if (std::uncaught_exceptions() > exceptions_at_start_) {
        run_->exit(exit_failure, runtime_seconds());
        end_live(exit_failure);
      } else {
        run_->preempting();
        run_->exit(exit_requeue, runtime_seconds(), /*not_complete=*/true);
        if (live_) live_->preempting();
        end_live(std::nullopt);  // the run stays running on W&B for the requeued attempt
      }
    } catch (...) {  // a destructor must not throw: the file keeps every record written before
    }
  }

  void start(const RunInfo& info) override {
    const auto mode = settings_.mode() != WandbMode::automatic ? settings_.mode() : connection_.mode;
    if (mode == WandbMode::disabled) return;  // as wandb's: no run, not even offline
    const auto wandb_dir = info.run_dir / layout::wandb;
    state_file_ = wandb_dir / "hpctrain-run.json";
    read_state();
    started_ = detail::wandb_time_now();
    WandbRunStart start;
    start.run_id = run_id_;
    start.project = settings_.project();
    start.entity = settings_.entity();
    start.display_name = settings_.name();
    start.group = settings_.group();
    const auto job = detail::job_of_run_directory(info.run_dir);
    if (start.display_name.empty())
      start.display_name =
          job ? fmt::format("{}-{}", job->first, job->second.generic_string()) : info.run_dir.filename().string();
    for (auto& c : start.display_name) c = c == '/' ? '-' : c;
    if (start.group.empty() && job && job->second.has_parent_path())  // an array task: its job groups the tasks
      start.group = fmt::format("{}-{}", job->first, job->second.parent_path().generic_string());
    start.job_type = settings_.job_type();
    start.notes = settings_.notes();
    start.tags = settings_.tags();
    start.start_time = started_;
    start.config = config_;
    nlohmann::json facts{{"world_size", info.world_size},    {"device", info.device},
                         {"total_steps", info.total_steps},  {"steps_per_epoch", info.steps_per_epoch},
                         {"run_dir", info.run_dir.string()}, {"version", HPCTRAIN_VERSION_STRING}};
    if (info.resumed_from) facts["resumed_from"] = *info.resumed_from;
    start.config.push_back({"hpctrain", facts.dump()});
    auto environment = detail::wandb_environment(started_);
    start.host = environment.host;
    run_.emplace(wandb_dir, start, "hpctrain " HPCTRAIN_VERSION_STRING);
    write_state();
    run_->environment(environment);
    if (mode == WandbMode::offline || (mode == WandbMode::automatic && connection_.api_key.empty())) return;
    if (connection_.api_key.empty()) {
      *messages_ << fmt::format(
                        "hpctrain: W&B mode is online, but no API key was found (WANDB_API_KEY, or machine {} in "
                        "~/.netrc): the run is logged offline only, to {}; upload it with --wandb-sync\n",
                        detail::url_netloc(connection_.base_url), run_->directory().string())
                 << std::flush;
      return;
    }
    try {
      live_.emplace(connection_,
                    WandbLiveStart{start, environment.program, history_lines_, output_lines_, run_->directory()},
                    *messages_);
    } catch (const std::exception& error) {  // no libcurl handle or thread: the offline run is enough
      *messages_ << fmt::format(
                        "hpctrain: W&B live logging cannot start ({}): the run is logged offline only, to "
                        "{}; upload it with --wandb-sync\n",
                        error.what(), run_->directory().string())
                 << std::flush;
    }
  }

  void log(const LogRecord& record) override {
    // At or below the last row written: an earlier attempt wrote this step (a crash's resume repeats it). Within an
    // attempt a row is written only once a later step comes, so its own steps never fall here.
    if (!run_ || record.step <= last_step_) return;
    if (row_ && row_->step != record.step) write_row();
    if (!row_) row_ = Row{record.step, {}};
    for (const auto& [key, value] : record.values) {
      if (key == "examples") continue;  // a count, as TensorBoard leaves it out
      row_->items.push_back({record.phase + "/" + key,
                             key == "epoch" ? std::to_string(static_cast<std::int64_t>(value)) : wandb_number(value)});
    }
  }

  void note(std::string_view text) override {
    if (!run_) return;
    const auto now = detail::wandb_time_now();
    run_->output_line(now, fmt::format("{}\n", text));
    if (live_) live_->output(now, text);
    // output.log's offset counts lines: those the live stream sends, whether or not it runs.
    output_lines_ += static_cast<std::int64_t>(detail::console_lines(text).size());
    write_state();
  }

  void finish() override {
    if (!run_) return;
    write_row();
    run_->exit(0, runtime_seconds());
    end_live(0);
    finished_ = true;
  }

  /// The offline run directory this attempt writes (after start()).
  std::filesystem::path directory() const { return run_ ? run_->directory() : std::filesystem::path(); }
  /// The W&B run id (after start()).
  const std::string& run_id() const { return run_id_; }

 private:
  struct Row {
    std::int64_t step = 0;
    std::vector<WandbItem> items;
  };

  /// The pending row, as a history record and a summary update (wandb-core uploads the summary from summary
  /// records only).
  void write_row() {
    if (!row_) return;
    auto items = std::move(row_->items);
    const auto now = detail::wandb_time_now();
    items.push_back({"_step", std::to_string(row_->step)});
    items.push_back({"_runtime", wandb_number(now - started_)});
    items.push_back({"_timestamp", wandb_number(now)});
    const auto step = row_->step;
    row_.reset();
    run_->history(step, items);
    run_->summary(items);
    if (live_) {
      live_->history(detail::json_object_text(items));
      for (const auto& item : items) {  // W&B's summary: every key's last value
        const auto known = std::find_if(summary_.begin(), summary_.end(),
                                        [&item](const WandbItem& kept) { return kept.key == item.key; });
        if (known == summary_.end()) summary_.push_back(item);
        else known->value_json = item.value_json;
      }
      auto summary = summary_;  // and, as wandb-core adds it, the run's runtime in seconds
      summary.push_back({"_wandb", fmt::format("{{\"runtime\":{}}}", runtime_seconds())});
      live_->summary(detail::json_object_text(summary));
    }
    last_step_ = step;
    ++history_lines_;
    write_state();
  }

  /// Ends the live stream (complete with `exit_code`, or left running for a requeue) and marks the offline run synced
  /// when W&B took all of it, as `wandb sync` marks what it uploaded: `--wandb-sync` then skips it.
  void end_live(std::optional<int> exit_code) {
    if (!live_) return;
    const bool delivered = live_->finish(exit_code);
    live_.reset();
    if (delivered) std::ofstream(run_->file().string() + ".synced");
  }

  std::int64_t runtime_seconds() const { return static_cast<std::int64_t>(detail::wandb_time_now() - started_); }

  /// The run id and last written step of an earlier attempt in this run directory, else a new id.
  void read_state() {
    std::ifstream file(state_file_);
    if (!file) {
      run_id_ = new_wandb_run_id();
      return;
    }
    const auto state = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
    const auto id = state.is_object() && state.contains("run_id") && state["run_id"].is_string()
                        ? state["run_id"].get<std::string>()
                        : "";
    const bool id_ok =
        !id.empty() && id.size() <= 64 &&
        id.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") == std::string::npos;
    if (!id_ok)
      throw RuntimeError(
          errors::runtime_wandb,
          fmt::format("{} holds no valid run id (letters, digits, - and _); remove it to start a new W&B run",
                      state_file_.string()));
    run_id_ = id;
    if (state.contains("last_step") && state["last_step"].is_number_integer())
      last_step_ = state["last_step"].get<std::int64_t>();
    // Lines the earlier attempts wrote: where this attempt's live stream continues W&B's files.
    if (state.contains("history_lines") && state["history_lines"].is_number_integer())
      history_lines_ = state["history_lines"].get<std::int64_t>();
    if (state.contains("output_lines") && state["output_lines"].is_number_integer())
      output_lines_ = state["output_lines"].get<std::int64_t>();
  }

  /// A hint for the next attempt, replaced by a rename (a crash leaves the old or the new one).
  void write_state() const {
    const auto temporary = state_file_.string() + ".tmp";
    {
      std::ofstream file(temporary, std::ios::trunc);
      file << nlohmann::json{{"run_id", run_id_},
                             {"last_step", last_step_},
                             {"history_lines", history_lines_},
                             {"output_lines", output_lines_}}
                  .dump()
           << "\n";
      if (!file.flush()) throw RuntimeError(errors::runtime_wandb, fmt::format("cannot write {}", temporary));
    }
    std::error_code error;
    std::filesystem::rename(temporary, state_file_, error);
    if (error)
      throw RuntimeError(errors::runtime_wandb, fmt::format("cannot rename {}: {}", temporary, error.message()));
  }

  Wandb settings_;
  std::vector<WandbItem> config_;
  WandbConnection connection_;
  std::ostream* messages_;
  int exceptions_at_start_ = 0;
  std::filesystem::path state_file_;
  std::string run_id_;
  std::int64_t last_step_ = -1;
  double started_ = 0;
  std::optional<Row> row_;
  std::optional<WandbOfflineRun> run_;
  std::int64_t history_lines_ = 0, output_lines_ = 0;  // across attempts: the live stream's offsets
  std::vector<WandbItem> summary_;                     // the live stream's summary: every key's last value
  std::optional<WandbLiveRun> live_;                   // last: ended before the offline run it names
  bool finished_ = false;
};

}  // namespace hpctrain
