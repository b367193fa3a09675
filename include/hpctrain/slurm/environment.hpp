#pragma once
// What srun tells each task about its step, read from SLURM_* into a typed struct. The lookup is a function, so
// tests feed tables of environments; the library gives the environment its process began with (lookup_in).
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <hpctrain/error.hpp>
#include <hpctrain/names.hpp>
#include <hpctrain/slurm/hostlist.hpp>

namespace hpctrain::slurm {

/// Looks up one environment variable; std::nullopt when it is unset (an empty value counts as unset).
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string&)>;

/// The lookup of `environment`'s variables (a copy: the lookup may outlive the value it was made from).
inline EnvironmentLookup lookup_in(Environment environment) {
  return [environment = std::move(environment)](const std::string& name) { return environment.get(name); };
}

/// One task's view of its Slurm step (srun sets these for every task).
struct StepEnvironment {
  /// SLURM_PROCID: this task's rank in the step.
  int proc_id = 0;
  /// SLURM_STEP_NUM_TASKS (else SLURM_NTASKS): tasks in the step.
  int num_tasks = 1;
  /// SLURM_LOCALID: this task's index among the step's tasks on its node.
  int local_id = 0;
  /// SLURM_NODEID: this task's node's index in the step's node list.
  int node_id = 0;
  /// SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST, SLURM_NODELIST) as written.
  std::string nodelist;
  /// nodelist expanded, in Slurm's order.
  std::vector<std::string> nodes;
  /// SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE) expanded: tasks on each of `nodes`.
  std::vector<int> tasks_per_node;
  /// SLURM_JOB_ID (else SLURM_JOBID).
  std::string job_id;
  /// SLURM_STEP_ID (else SLURM_STEPID).
  long step_id = 0;
  /// SLURM_ARRAY_JOB_ID, for array jobs.
  std::optional<std::string> array_job_id;
  /// SLURM_ARRAY_TASK_ID, for array jobs.
  std::optional<long> array_task_id;
  /// SLURM_RESTART_COUNT: how often the job was requeued. Default: 0 (Slurm leaves it unset at first).
  int restart_count = 0;

  /// Tasks on this task's node.
  int local_num_tasks() const { return tasks_per_node.at(static_cast<std::size_t>(node_id)); }
  /// The node this task runs on.
  const std::string& node() const { return nodes.at(static_cast<std::size_t>(node_id)); }
};

namespace detail {

[[noreturn]] inline void bad_variable(std::string_view name, std::string_view value, std::string_view reason) {
  throw RuntimeError(errors::runtime_slurm_env, fmt::format("{} = \"{}\": {}", name, value, reason));
}

inline long parse_long(std::string_view name, std::string_view text, long minimum = 0) {
  long value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) bad_variable(name, text, "not an integer");
  if (value < minimum) bad_variable(name, text, fmt::format("must be at least {}", minimum));
  return value;
}

inline int parse_int(std::string_view name, std::string_view text, int minimum = 0) {
  const long value = parse_long(name, text, minimum);
  if (value > std::numeric_limits<int>::max()) bad_variable(name, text, "too large");
  return static_cast<int>(value);
}

// The first of `names` that is set: {name, value}.
struct Found {
  std::string name, value;
};
inline std::optional<Found> first_set(const EnvironmentLookup& lookup, std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (auto value = lookup(name)) return Found{name, *value};
  return std::nullopt;
}

}  // namespace detail

/// Expands Slurm's compressed tasks-per-node form: `2(x3),1` gives {2, 2, 2, 1}.
/// `name` is the variable it came from, for the error message.
inline std::vector<int> parse_tasks_per_node(std::string_view text,
                                             std::string_view name = "SLURM_STEP_TASKS_PER_NODE") {
  std::vector<int> counts;
  std::size_t i = 0;
  while (i <= text.size()) {
    const std::size_t comma = std::min(text.find(',', i), text.size());
    const std::string_view item = text.substr(i, comma - i);
    const std::size_t paren = item.find('(');
    const int tasks = detail::parse_int(name, item.substr(0, paren), 1);
    int repeat = 1;
    if (paren != std::string_view::npos) {
      if (item.size() < paren + 4 || item.substr(paren, 2) != "(x" || item.back() != ')') {
        detail::bad_variable(name, text, fmt::format("malformed item \"{}\" (expected N or N(xM))", item));
      }
      repeat = detail::parse_int(name, item.substr(paren + 2, item.size() - paren - 3), 1);
    }
    // A repeat count is a node count: refuse one no cluster has before allocating it (the fuzzer's
    // `8(x444444444)` asked for 1.7 GB; tests/fuzz/corpus/tasks_per_node/repeat_beyond_any_cluster).
    if (static_cast<std::uint64_t>(repeat) > max_hosts_per_item - counts.size()) {
      detail::bad_variable(name, text, fmt::format("more than {} nodes", max_hosts_per_item));
    }
    counts.insert(counts.end(), static_cast<std::size_t>(repeat), tasks);
    i = comma + 1;
  }
  return counts;
}

/// True when this process is a task of an srun step (SLURM_PROCID is set).
inline bool in_slurm_step(const EnvironmentLookup& lookup) { return lookup("SLURM_PROCID").has_value(); }

/// Reads the step's SLURM_* variables. Throws RuntimeError `[hpctrain.runtime.slurm_env]` naming every
/// missing variable, or the variables that contradict each other.
inline StepEnvironment read_slurm_environment(const EnvironmentLookup& lookup) {
  using detail::first_set;
  const auto proc_id = first_set(lookup, {"SLURM_PROCID"});
  const auto num_tasks = first_set(lookup, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"});
  const auto local_id = first_set(lookup, {"SLURM_LOCALID"});
  const auto node_id = first_set(lookup, {"SLURM_NODEID"});
  const auto nodelist = first_set(lookup, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  const auto tasks_per_node = first_set(lookup, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"});
  const auto job_id = first_set(lookup, {"SLURM_JOB_ID", "SLURM_JOBID"});
  const auto step_id = first_set(lookup, {"SLURM_STEP_ID", "SLURM_STEPID"});

  // The batch script has SLURM_PROCID=0 and the job's SLURM_NTASKS too: taken for rank 0 it would wait for
  // ranks that never come. Only an srun step sets a step id.
  if (proc_id && !step_id) {
    throw RuntimeError(errors::runtime_slurm_env,
                       "SLURM_PROCID is set but SLURM_STEP_ID is not: this process is a batch script or "
                       "an allocation's shell, not a task of an srun step; start it with srun");
  }

  std::vector<std::string> missing;
  if (!proc_id) missing.emplace_back("SLURM_PROCID");
  if (!num_tasks) missing.emplace_back("SLURM_STEP_NUM_TASKS (or SLURM_NTASKS)");
  if (!local_id) missing.emplace_back("SLURM_LOCALID");
  if (!node_id) missing.emplace_back("SLURM_NODEID");
  if (!nodelist) missing.emplace_back("SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST)");
  if (!tasks_per_node) missing.emplace_back("SLURM_STEP_TASKS_PER_NODE (or SLURM_TASKS_PER_NODE)");
  if (!job_id) missing.emplace_back("SLURM_JOB_ID");
  if (!step_id) missing.emplace_back("SLURM_STEP_ID");
  if (!missing.empty()) {
    throw RuntimeError(errors::runtime_slurm_env,
                       fmt::format("missing {} (srun sets them for every task of a step)", fmt::join(missing, ", ")));
  }

  StepEnvironment env;
  env.proc_id = detail::parse_int(proc_id->name, proc_id->value);
  env.num_tasks = detail::parse_int(num_tasks->name, num_tasks->value, 1);
  env.local_id = detail::parse_int(local_id->name, local_id->value);
  env.node_id = detail::parse_int(node_id->name, node_id->value);
  env.nodelist = nodelist->value;
  try {
    env.nodes = expand_hostlist(nodelist->value);
  } catch (const HostlistError& e) {
    throw RuntimeError(errors::runtime_slurm_env, fmt::format("{} is not a hostlist: {}", nodelist->name, e.what()));
  }
  env.tasks_per_node = parse_tasks_per_node(tasks_per_node->value, tasks_per_node->name);
  env.job_id = job_id->value;
  env.step_id = detail::parse_long(step_id->name, step_id->value);
  env.array_job_id = lookup("SLURM_ARRAY_JOB_ID");
  if (const auto task = lookup("SLURM_ARRAY_TASK_ID"))
    env.array_task_id = detail::parse_long("SLURM_ARRAY_TASK_ID", *task);
  if (const auto restarts = lookup("SLURM_RESTART_COUNT")) {
    env.restart_count = detail::parse_int("SLURM_RESTART_COUNT", *restarts);
  }

  // Contradictions: each message names both sides.
  auto contradiction = [](const std::string& message) { throw RuntimeError(errors::runtime_slurm_env, message); };
  if (env.proc_id >= env.num_tasks) {
    contradiction(
        fmt::format("{} = {} is not below {} = {}", proc_id->name, env.proc_id, num_tasks->name, env.num_tasks));
  }
  if (env.nodes.empty()) contradiction(fmt::format("{} = \"{}\" names no node", nodelist->name, env.nodelist));
  if (env.tasks_per_node.size() != env.nodes.size()) {
    contradiction(fmt::format("{} = \"{}\" lists {} nodes but {} = \"{}\" has {}", tasks_per_node->name,
                              tasks_per_node->value, env.tasks_per_node.size(), nodelist->name, env.nodelist,
                              env.nodes.size()));
  }
  if (const auto step_nodes = lookup("SLURM_STEP_NUM_NODES"); step_nodes && nodelist->name == "SLURM_STEP_NODELIST") {
    if (detail::parse_int("SLURM_STEP_NUM_NODES", *step_nodes, 1) != static_cast<int>(env.nodes.size())) {
      contradiction(fmt::format("SLURM_STEP_NUM_NODES = {} but SLURM_STEP_NODELIST = \"{}\" has {} nodes", *step_nodes,
                                env.nodelist, env.nodes.size()));
    }
  }
  long total = 0;
  for (int n : env.tasks_per_node) total += n;
  if (total != env.num_tasks) {
    contradiction(fmt::format("{} = \"{}\" sums to {} but {} = {}", tasks_per_node->name, tasks_per_node->value, total,
                              num_tasks->name, env.num_tasks));
  }
  if (env.node_id >= static_cast<int>(env.nodes.size())) {
    contradiction(fmt::format("{} = {} but {} = \"{}\" has {} nodes", node_id->name, env.node_id, nodelist->name,
                              env.nodelist, env.nodes.size()));
  }
  if (env.local_id >= env.local_num_tasks()) {
    contradiction(fmt::format("{} = {} is not below the {} tasks that {} gives node {}", local_id->name, env.local_id,
                              env.local_num_tasks(), tasks_per_node->name, env.node_id));
  }
  if (const auto node_name = lookup("SLURMD_NODENAME"); node_name && *node_name != env.node()) {
    contradiction(fmt::format("SLURMD_NODENAME = {} but {} = {} is {} in {} = \"{}\"", *node_name, node_id->name,
                              env.node_id, env.node(), nodelist->name, env.nodelist));
  }
  return env;
}

}  // namespace hpctrain::slurm
