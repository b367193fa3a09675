#pragma once
// `./train --results`: the comparison users otherwise assemble by hand from W&B. One row per task of the last
// submitted job (an array, a sweep, or a single job): its knob values (from job.json), its state (Slurm, as
// --status asks it) and its final metrics — the last train loss and the last evaluation record of the task's
// `metrics.jsonl` (written by the Trainer's JsonlLogger in the run directory) — best first.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>  // job.json and metrics.jsonl

#include <hpctrain/error.hpp>
#include <hpctrain/job/array_commands.hpp>
#include <hpctrain/job/submit.hpp>

namespace hpctrain {

/// One task's row of `--results`.
struct TaskResult {
  int task = -1;                                           ///< the array task id; -1 for a single job
  std::string configuration;                               ///< a sweep's named configuration, else empty
  std::vector<std::pair<std::string, std::string>> knobs;  ///< a sweep's knob values for the task
  std::string state;                                       ///< as Slurm tells it (COMPLETED, RUNNING, ...)
  std::optional<std::int64_t> step;                        ///< the last step in metrics.jsonl
  std::map<std::string, double> metrics;                   ///< `loss` (last train record), `eval_*` (last eval record)
};

/// How `--results` orders its rows: by `metric`, best first.
struct ResultOrder {
  std::string metric;
  bool higher_is_better = false;
};

/// The metrics file of a run directory.
inline constexpr std::string_view metrics_file = "metrics.jsonl";

/// The final metrics of a run: the last train record's `loss` and every number of the last eval record
/// (`eval_loss`, `eval_accuracy`, ...; not the `eval_examples` count). Lines that are not JSON objects (a record
/// being written while the task runs) are skipped.
inline std::pair<std::optional<std::int64_t>, std::map<std::string, double>> read_final_metrics(
    const std::filesystem::path& file) {
  std::optional<std::int64_t> step;
  std::map<std::string, double> metrics;
  std::optional<nlohmann::json> last_train, last_eval;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    auto record = nlohmann::json::parse(line, nullptr, false);
    if (record.is_discarded() || !record.is_object()) continue;
    if (const auto at = record.find("step"); at != record.end() && at->is_number_integer())
      step = std::max(step.value_or(0), at->get<std::int64_t>());
    bool eval = false;
    for (const auto& item : record.items()) eval = eval || item.key().starts_with("eval_");
    if (eval) last_eval = std::move(record);
    else if (record.contains("loss")) last_train = std::move(record);
  }
  if (last_train && (*last_train)["loss"].is_number()) metrics["loss"] = (*last_train)["loss"].get<double>();
  if (last_eval)
    for (const auto& [key, value] : last_eval->items())
      if (key.starts_with("eval_") && key != "eval_examples" && key != "eval_epoch" && value.is_number())
        metrics[key] = value.get<double>();
  return {step, metrics};
}

namespace detail {
inline bool is_finished_state(std::string_view state) {
  static const std::set<std::string_view> finished = {"COMPLETED", "FAILED",        "CANCELLED",
                                                      "TIMEOUT",   "OUT_OF_MEMORY", "NODE_FAIL",
                                                      "BOOT_FAIL", "DEADLINE",      "PREEMPTED"};
  return finished.contains(state);
}

/// Metrics where a larger value is better: accuracies, F1 and throughput; everything else (losses,
/// perplexity, error rates) is better smaller.
inline bool higher_is_better(std::string_view metric) {
  for (std::string_view word : {"accuracy", "acc", "f1", "precision", "recall", "per_s", "mfu", "bleu", "auc"})
    if (metric.find(word) != std::string_view::npos) return true;
  return false;
}
}  // namespace detail

/// The order `--sort-by METRIC[:max|:min]` asks for (`eval_accuracy`, or `accuracy` for its eval column), or by
/// default the validation loss (`eval_loss`; the train `loss` when no task evaluated). Throws UsageError for
/// a metric no row has, naming those there are.
inline ResultOrder result_order(const std::optional<std::string>& sort_by, const std::vector<TaskResult>& rows) {
  std::set<std::string> present;
  for (const auto& row : rows)
    for (const auto& [name, value] : row.metrics) present.insert(name);
  ResultOrder order;
  if (!sort_by) {
    order.metric = present.contains("eval_loss") ? "eval_loss" : "loss";
    return order;
  }
  std::string metric = *sort_by;
  std::optional<bool> direction;
  if (metric.ends_with(":max") || metric.ends_with(":min")) {
    direction = metric.ends_with(":max");
    metric.resize(metric.size() - 4);
  }
  if (!present.contains(metric) && present.contains("eval_" + metric)) metric = "eval_" + metric;
  if (!present.contains(metric))
    throw UsageError(fmt::format(
        "--sort-by {}: no task has this metric; they have: {}", *sort_by,
        present.empty() ? "none" : detail::join(std::vector<std::string>(present.begin(), present.end()), ", ")));
  order.metric = metric;
  order.higher_is_better = direction.value_or(detail::higher_is_better(metric));
  return order;
}

/// Best first by `order`; rows without the metric last; ties by task id.
inline void sort_results(std::vector<TaskResult>& rows, const ResultOrder& order) {
  std::stable_sort(rows.begin(), rows.end(), [&](const TaskResult& a, const TaskResult& b) {
    const auto x = a.metrics.find(order.metric), y = b.metrics.find(order.metric);
    const bool has_x = x != a.metrics.end(), has_y = y != b.metrics.end();
    if (has_x != has_y) return has_x;
    if (has_x && x->second != y->second) return order.higher_is_better ? x->second > y->second : x->second < y->second;
    return a.task < b.task;
  });
}

/// The rows of `job` (the last submitted one): knob values from its record, states from Slurm, metrics from
/// each task's run directory (`<job dir>/<array id>_<task>/metrics.jsonl`, or the job directory itself).
inline std::vector<TaskResult> collect_results(const SubmittedJob& job) {
  std::vector<TaskResult> rows;
  const auto array = read_array_record(job);
  if (!array) {
    TaskResult row;
    row.state = query_state(job.id).state;
    std::tie(row.step, row.metrics) = read_final_metrics(job.directory / metrics_file);
    rows.push_back(std::move(row));
    return rows;
  }
  std::map<int, std::pair<std::string, std::vector<std::pair<std::string, std::string>>>> sweep;
  std::ifstream file(job.directory / layout::job_record);
  const auto record = nlohmann::json::parse(file, nullptr, false);
  if (!record.is_discarded() && record.contains("sweep") && record["sweep"].is_array())
    for (const auto& combination : record["sweep"]) {
      if (!combination.is_object() || !combination.contains("task") || !combination["task"].is_number_integer())
        continue;
      auto& [configuration, values] = sweep[combination["task"].get<int>()];
      if (combination.contains("configuration") && combination["configuration"].is_string())
        configuration = combination["configuration"].get<std::string>();
      if (combination.contains("values") && combination["values"].is_array())
        for (const auto& pair : combination["values"])
          if (pair.is_array() && pair.size() == 2 && pair[0].is_string() && pair[1].is_string())
            values.emplace_back(pair[0].get<std::string>(), pair[1].get<std::string>());
    }
  for (const auto& task : query_array_tasks(job.id, array->spec)) {
    TaskResult row;
    row.task = task.task;
    row.state = task.state;
    if (const auto at = sweep.find(task.task); at != sweep.end()) std::tie(row.configuration, row.knobs) = at->second;
    std::tie(row.step, row.metrics) =
        read_final_metrics(job.directory / fmt::format("{}_{}", job.id, task.task) / metrics_file);
    rows.push_back(std::move(row));
  }
  return rows;
}

/// Throws UsageError when no task has finished (nor left metrics while Slurm forgot it): nothing to compare yet.
inline void require_finished_task(const SubmittedJob& job, const std::vector<TaskResult>& rows) {
  std::map<std::string, int> counts;
  for (const auto& row : rows) {
    if (detail::is_finished_state(row.state) || (row.state == "UNKNOWN" && !row.metrics.empty())) return;
    ++counts[row.state.empty() ? "UNKNOWN" : row.state];
  }
  std::vector<std::string> summary;
  for (const auto& [state, n] : counts) summary.push_back(fmt::format("{} {}", n, state));
  throw UsageError(
      fmt::format("--results: no task of job {} has finished yet ({}); try again later, --status shows "
                  "where they are",
                  job.id, detail::join(summary, ", ")));
}

/// The table: a title line, a header and one row per task (best first), columns aligned.
inline std::string format_results(const SubmittedJob& job, const std::vector<TaskResult>& rows,
                                  const ResultOrder& order) {
  std::vector<std::string> knob_names;
  bool configurations = false;
  std::set<std::string> metric_names;
  for (const auto& row : rows) {
    configurations = configurations || !row.configuration.empty();
    for (const auto& [knob, value] : row.knobs)
      if (std::find(knob_names.begin(), knob_names.end(), knob) == knob_names.end()) knob_names.push_back(knob);
    for (const auto& [name, value] : row.metrics) metric_names.insert(name);
  }
  // The train loss, then the validation loss, then the other eval metrics by name.
  std::vector<std::string> metrics;
  for (const char* first : {"loss", "eval_loss"})
    if (metric_names.erase(first)) metrics.emplace_back(first);
  metrics.insert(metrics.end(), metric_names.begin(), metric_names.end());

  std::vector<std::vector<std::string>> table;
  std::vector<std::string> header = {"task"};
  if (configurations) header.emplace_back("configuration");
  header.insert(header.end(), knob_names.begin(), knob_names.end());
  header.insert(header.end(), {"state", "step"});
  header.insert(header.end(), metrics.begin(), metrics.end());
  table.push_back(header);
  for (const auto& row : rows) {
    std::vector<std::string> cells = {row.task < 0 ? job.id : std::to_string(row.task)};
    if (configurations) cells.push_back(row.configuration.empty() ? "-" : row.configuration);
    for (const auto& knob : knob_names) {
      const auto at =
          std::find_if(row.knobs.begin(), row.knobs.end(), [&](const auto& kv) { return kv.first == knob; });
      cells.push_back(at == row.knobs.end() ? "-" : at->second);
    }
    cells.push_back(row.state.empty() ? "UNKNOWN" : row.state);
    cells.push_back(row.step ? std::to_string(*row.step) : "-");
    for (const auto& metric : metrics) {
      const auto at = row.metrics.find(metric);
      cells.push_back(at == row.metrics.end() ? "-" : fmt::format("{:.5g}", at->second));
    }
    table.push_back(std::move(cells));
  }
  std::vector<std::size_t> widths(header.size(), 0);
  for (const auto& cells : table)
    for (std::size_t i = 0; i < cells.size(); ++i) widths[i] = std::max(widths[i], cells[i].size());

  std::map<std::string, int> counts;
  for (const auto& row : rows) ++counts[row.state.empty() ? "UNKNOWN" : row.state];
  std::vector<std::string> summary;
  for (const auto& [state, n] : counts) summary.push_back(fmt::format("{} {}", n, state));
  std::string text = fmt::format("job {} ({}): {} task{} ({}); best first by {} ({} is better)\n", job.id, job.name,
                                 rows.size(), rows.size() == 1 ? "" : "s", detail::join(summary, ", "), order.metric,
                                 order.higher_is_better ? "higher" : "lower");
  for (const auto& cells : table) {
    std::string line;
    for (std::size_t i = 0; i < cells.size(); ++i)
      line += i + 1 == cells.size() ? cells[i] : fmt::format("{:<{}}  ", cells[i], widths[i]);
    text += line + "\n";
  }
  return text;
}

/// `--results [--sort-by METRIC]` for the last submitted job: the table on `out`. Throws UsageError when no task
/// finished yet or the metric is unknown (exit 2), RuntimeError when no job was submitted.
inline std::string results_table(const SubmittedJob& job, const std::optional<std::string>& sort_by) {
  auto rows = collect_results(job);
  require_finished_task(job, rows);
  const auto order = result_order(sort_by, rows);
  sort_results(rows, order);
  return format_results(job, rows, order);
}

}  // namespace hpctrain
