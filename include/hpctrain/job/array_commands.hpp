#pragma once
// --status, --logs and --cancel when the last submitted job is an array: the status counts the tasks'
// states and lists each task; `--task N` picks one task for --logs and --cancel (`scancel <array>_<N>`).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>       // fmt::join: only there in the torch wheel's fmt 12
#include <nlohmann/json.hpp>  // the job record (job.json)

#include <hpctrain/error.hpp>
#include <hpctrain/job/array.hpp>
#include <hpctrain/job/process.hpp>
#include <hpctrain/job/submit.hpp>

namespace hpctrain {

/// What job.json says about an array job.
struct ArrayRecord {
  ArraySpec spec;
  std::string output_pattern;  ///< `--output` with %A/%a unresolved
};

/// One task of an array as Slurm tells it.
struct ArrayTaskState {
  int task = 0;
  std::string job_id;  ///< the task's own job id (`SLURM_JOB_ID`); empty while it is pending
  std::string state;   ///< PENDING, RUNNING, COMPLETED, FAILED, ...; UNKNOWN when nobody knows it
  std::string exit_code;
};

/// The array part of `job`'s record; empty when it is a single job.
inline std::optional<ArrayRecord> read_array_record(const SubmittedJob& job) {
  std::ifstream file(job.directory / "job.json");
  if (!file) return std::nullopt;
  const auto record = nlohmann::json::parse(file, nullptr, false);
  if (record.is_discarded() || !record.contains("array")) return std::nullopt;
  return ArrayRecord{parse_array_spec(record.at("array").get<std::string>()),
                     record.at("output_pattern").get<std::string>()};
}

namespace detail {
/// `key=value` fields of one `scontrol --oneliner` line.
inline std::map<std::string, std::string> scontrol_fields(const std::string& line) {
  std::map<std::string, std::string> fields;
  std::stringstream words(line);
  for (std::string word; words >> word;) {
    const auto equals = word.find('=');
    if (equals != std::string::npos) fields.emplace(word.substr(0, equals), word.substr(equals + 1));
  }
  return fields;
}

/// The tasks scontrol knows (finished ones stay for MinJobAge); pending ones are listed as a range.
inline void tasks_from_scontrol(const std::string& array_id, std::map<int, ArrayTaskState>& tasks) {
  const auto shown = run_process({"scontrol", "--oneliner", "show", "job", array_id});
  if (shown.exit_code != 0) return;
  std::stringstream lines(shown.out);
  for (std::string line; std::getline(lines, line);) {
    auto fields = scontrol_fields(line);
    if (fields["ArrayJobId"] != array_id) continue;
    const auto state = fields["JobState"];
    const auto ids = expand_task_list(fields["ArrayTaskId"]);
    for (int task : ids)
      tasks[task] = {task, ids.size() == 1 && state != "PENDING" ? fields["JobId"] : "", state, fields["ExitCode"]};
  }
}

/// Tasks from accounting (`sacct`, then `sacct -c` where accounting storage is off): `<array>_<task>` rows.
inline void tasks_from_sacct(const std::string& array_id, std::map<int, ArrayTaskState>& tasks) {
  for (const bool completion_log : {false, true}) {
    std::vector<std::string> command = {"sacct"};
    if (completion_log) command.push_back("-c");
    for (const auto* arg :
         {"--noheader", "--parsable2", "--allocations", "--format", "JobID,State,ExitCode,JobIDRaw", "--jobs"})
      command.push_back(arg);
    command.push_back(array_id);
    const auto accounted = run_process(command);
    if (accounted.exit_code != 0) continue;
    std::stringstream lines(accounted.out);
    for (std::string line; std::getline(lines, line);) {
      std::vector<std::string> fields;
      std::stringstream parts(line);
      for (std::string field; std::getline(parts, field, '|');) fields.push_back(field);
      if (fields.size() < 4 || !fields[0].starts_with(array_id + "_")) continue;
      int task = 0;
      if (!parse_array_number(std::string_view(fields[0]).substr(array_id.size() + 1), task)) continue;
      if (!tasks.contains(task)) tasks[task] = {task, fields[3], fields[1].substr(0, fields[1].find(' ')), fields[2]};
    }
  }
}
}  // namespace detail

/// Every task of array `array_id` with the ids of `spec`: scontrol first, then accounting, else UNKNOWN.
inline std::vector<ArrayTaskState> query_array_tasks(const std::string& array_id, const ArraySpec& spec) {
  std::map<int, ArrayTaskState> tasks;
  detail::tasks_from_scontrol(array_id, tasks);
  if (tasks.size() < spec.indices.size()) detail::tasks_from_sacct(array_id, tasks);
  std::vector<ArrayTaskState> states;
  for (int task : spec.indices) {
    auto it = tasks.find(task);
    states.push_back(it != tasks.end() ? it->second : ArrayTaskState{task, "", "UNKNOWN", ""});
  }
  return states;
}

/// `array job <id> (<name>): <n> tasks: 2 COMPLETED, 1 RUNNING, 1 PENDING` and one line per task.
inline std::string format_array_status(const SubmittedJob& job, const ArrayRecord& record,
                                       const std::vector<ArrayTaskState>& tasks) {
  std::map<std::string, int> counts;
  for (const auto& task : tasks) ++counts[task.state];
  std::vector<std::string> summary;
  for (const auto& [state, n] : counts) summary.push_back(fmt::format("{} {}", n, state));
  std::string text = fmt::format("array job {} ({}): {} tasks ({}): {}\n", job.id, job.name, tasks.size(),
                                 record.spec.text, detail::join(summary, ", "));
  for (const auto& task : tasks) {
    text += fmt::format("  task {}: {}", task.task, task.state);
    if (!task.job_id.empty()) text += fmt::format(" (job {}", task.job_id);
    if (!task.job_id.empty()) text += task.exit_code.empty() ? ")" : fmt::format(", exit code {})", task.exit_code);
    text += "\n";
  }
  return text;
}

/// The log of one task: the record's output pattern with %a = task and %A = the array id.
/// `environment`: the login shell's (%u is its USER).
inline std::string array_task_log(const SubmittedJob& job, const ArrayRecord& record, int task,
                                  const Environment& environment) {
  std::string pattern;
  for (std::size_t i = 0; i < record.output_pattern.size(); ++i) {
    if (record.output_pattern[i] == '%' && i + 1 < record.output_pattern.size()) {
      const char key = record.output_pattern[i + 1];
      if (key == 'a') {
        pattern += std::to_string(task);
        ++i;
        continue;
      }
      pattern += '%';
      pattern += key;
      ++i;
      continue;
    }
    pattern += record.output_pattern[i];
  }
  return detail::resolve_log_pattern(pattern, job.id, job.name,
                                     job.directory.parent_path().parent_path().parent_path().string(), environment);
}

/// Throws UsageError unless `task` is one of the array's ids.
inline void require_array_task(const ArrayRecord& record, int task) {
  if (std::find(record.spec.indices.begin(), record.spec.indices.end(), task) == record.spec.indices.end())
    throw UsageError(fmt::format("--task {}: array {} has no such task", task, record.spec.text));
}

}  // namespace hpctrain
