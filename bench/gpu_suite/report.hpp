#pragma once
// One row of the GPU suite's table (scripts/gpu-check), as the suite prints it: a JSON line on stdout that
// gpu-check collects from every program it runs. The id is the contract: gpu-check knows which ids each
// group must produce, and a missing one fails the run.
#include <iostream>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace hpctrain_gpu_suite {

/// Whether a row's check held. Rows that only measure (throughput, memory) pass when the run completed.
enum class Status { pass, fail, skip };

inline std::string to_string(Status status) {
  switch (status) {
    case Status::pass: return "pass";
    case Status::fail: return "fail";
    case Status::skip: return "skip";
  }
  return "fail";
}

/// A row: stable id, the label the table shows, the verdict, a one-line result, and the figures behind it.
struct Row {
  std::string id;
  std::string label;
  Status status = Status::pass;
  std::string result;
  nlohmann::json figures = nlohmann::json::object();
};

/// Prints `row` as one JSON line (flushed at once: a later row may crash the process, this one stays).
inline void print(const Row& row) {
  const nlohmann::json line{{"id", row.id},
                            {"row", row.label},
                            {"status", to_string(row.status)},
                            {"result", row.result},
                            {"figures", row.figures}};
  std::cout << line.dump() << std::endl;
}

/// A failed row for a check that threw: the table says why instead of losing the row.
inline Row failed_row(std::string id, std::string label, const std::string& what) {
  return Row{std::move(id), std::move(label), Status::fail, "error: " + what, nlohmann::json::object()};
}

}  // namespace hpctrain_gpu_suite
