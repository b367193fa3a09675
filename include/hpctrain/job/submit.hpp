#pragma once
// Submission and management of a job through Slurm's own commands. A submission is all or nothing:
// the script is written into a private pending directory, submitted held (`sbatch --hold`), the
// directory is renamed to the job id, the record written, and only then is the job released. Any
// failure on the way removes what was written and cancels what was queued.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>       // fmt::join
#include <nlohmann/json.hpp>  // the job record (job.json)

#include <hpctrain/error.hpp>
#include <hpctrain/files.hpp>
#include <hpctrain/job/job.hpp>
#include <hpctrain/job/preflight.hpp>
#include <hpctrain/job/process.hpp>
#include <hpctrain/job/render.hpp>
#include <hpctrain/job/trim.hpp>
#include <hpctrain/names.hpp>

namespace hpctrain {

/// A job this program submitted, as recorded in `hpctrain-jobs/<name>/<id>/job.json`.
struct SubmittedJob {
  std::string id;
  std::string name;
  std::filesystem::path directory;  ///< holds job.sbatch, job.json and (by default) the logs
  std::string output_log;           ///< absolute path of the job's stdout
  std::string error_log;            ///< absolute path of its stderr (same as output_log unless Job::error)
};

/// A job's state as Slurm tells it.
struct JobState {
  std::string id;
  std::string state;   ///< PENDING, RUNNING, COMPLETED, FAILED, CANCELLED...; empty when nobody knows it
  std::string source;  ///< squeue, sacct or scontrol
  std::string detail;  ///< the rest of what that command said (elapsed, limit, nodes, exit code)
  std::string hint;    ///< for a pending job, what its reason means and what to try; else empty
  bool in_queue() const { return source == "squeue"; }
};

namespace detail {
/// Resolves the filename patterns of an --output value that do not depend on the node (%j, %x, %u, %%).
inline std::string resolve_log_pattern(std::string_view pattern, const std::string& id, const std::string& name,
                                       const std::string& workdir, const Environment& environment) {
  std::string path;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      path += pattern[i];
      continue;
    }
    const char key = pattern[++i];
    if (key == 'j' || key == 'J' || key == 'A') path += id;
    else if (key == 'x') path += name;
    else if (key == 'u') path += environment.get("USER", EmptyValue::kept).value_or("");
    else if (key == '%') path += '%';
    else {
      path += '%';
      path += key;
    }
  }
  if (!path.starts_with("/")) path = (std::filesystem::path(workdir) / path).string();
  return path;
}

/// sbatch's message, verbatim, and what to try where we know the failure (`environment`: the one sbatch ran in).
inline std::string explain_sbatch_failure(const std::string& stderr_text, const Environment& environment) {
  std::string message = trim(stderr_text);
  const auto has = [&](std::string_view text) { return stderr_text.find(text) != std::string::npos; };
  if (has("invalid partition") || has("Invalid partition"))
    message += "\nhint: `sinfo -s` lists the partitions you can submit to.";
  else if (has("Invalid account") || has("invalid account"))
    message += "\nhint: `sacctmgr show associations user=$USER format=account,partition` lists your accounts.";
  else if (has("time limit") || has("Time limit"))
    message += "\nhint: `sinfo -o '%P %l'` shows each partition's maximum time.";
  else if (has("node configuration is not available") || has("More processors requested"))
    message += "\nhint: `sinfo -o '%P %D %c %G %m'` shows each partition's nodes, CPUs, GPUs and memory.";
  else if (has("SRV") || has("Could not establish a configuration source"))  // no slurm.conf found at all
    message +=
        !environment.get("SLURM_CONF", EmptyValue::kept)
            ? "\nhint: SLURM_CONF is not set and this host has no /etc/slurm/slurm.conf: set it to your cluster's "
              "slurm.conf (the local test cluster: `eval \"$(scripts/slurm-local env)\"`)."
            : fmt::format("\nhint: SLURM_CONF = {}: is that your cluster's slurm.conf?",
                          *environment.get("SLURM_CONF", EmptyValue::kept));
  return message;
}

/// Reads a job record (job.json) back. The file may have been edited or truncated by hand: any defect is a
/// RuntimeError `[hpctrain.runtime.job_record]` naming the file and the field, never a JSON library exception
/// (found by tests/fuzz/job_record_fuzz.cpp: nlohmann's parse_error/type_error escaped unnamed).
inline SubmittedJob parse_job_record(std::string_view text, const std::filesystem::path& path) {
  const auto record = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (record.is_discarded())
    throw RuntimeError(errors::runtime_job_record,
                       fmt::format("{}: not valid JSON (edited or truncated?)", path.string()));
  const auto field = [&](const char* key) {
    const auto found = record.is_object() ? record.find(key) : record.end();
    if (found == record.end() || !found->is_string())
      throw RuntimeError(errors::runtime_job_record,
                         fmt::format("{}: \"{}\" is missing or not a string", path.string(), key));
    return found->get<std::string>();
  };
  return {field("id"), field("name"), field("directory"), field("output_log"), field("error_log")};
}

inline nlohmann::json to_json(const SubmittedJob& job) {
  return {{"id", job.id},
          {"name", job.name},
          {"directory", job.directory.string()},
          {"output_log", job.output_log},
          {"error_log", job.error_log}};
}
}  // namespace detail

/// Renders `job`, writes it into its job directory and submits it with `sbatch --parsable` (without this
/// process's SLURM_* variables: detail::inherited_slurm_variables). The script follows the cluster's Slurm
/// release (`sbatch --version`, asked once) unless the context names one.
/// Throws SpecError (nothing written; the cluster's refusal of `sbatch --test-only` too) or RuntimeError (sbatch's
/// message; nothing left behind).
inline SubmittedJob submit(const Job& job, const RenderContext& given_context) {
  namespace fs = std::filesystem;
  RenderContext context = given_context;
  if (!context.slurm_version) context.slurm_version = cluster_slurm_version();
  const std::string script = render_sbatch(job, context);
  for (const auto& var : job.environment())
    if (var.kind == EnvKind::secret)
      detail::require(context.environment.get(var.name, EmptyValue::kept).has_value(), "env", var.name,
                      "secret_env needs the variable set in the submitting environment");
  if (auto refusal = cluster_refusal(job, script, context.environment)) throw *refusal;

  const fs::path root = job_root(job, context);
  std::error_code created;
  fs::create_directories(root, created);
  if (created)
    throw RuntimeError(errors::runtime_io, fmt::format("cannot create {}: {}", root.string(), created.message()));
  std::string pending_template = (root / ".pending-XXXXXX").string();
  if (::mkdtemp(pending_template.data()) == nullptr)
    throw RuntimeError(errors::runtime_io, fmt::format("cannot create a directory under {}", root.string()));
  const fs::path pending = pending_template;
  std::optional<std::string> queued_id;
  fs::path final_directory;
  try {
    detail::write_file_atomically(pending / layout::job_script, script);
    // Held until its directory carries its id: the default log path is <root>/<id>/.
    const auto sbatch = run_process({"sbatch", "--parsable", "--hold", (pending / layout::job_script).string()}, {}, "",
                                    detail::inherited_slurm_variables(context.environment));
    if (sbatch.exit_code != 0)
      throw RuntimeError(errors::runtime_sbatch,
                         fmt::format("sbatch refused the job (exit {}):\n{}", sbatch.exit_code,
                                     detail::explain_sbatch_failure(sbatch.err, context.environment)));
    std::string id = detail::trim(sbatch.out);
    id = id.substr(0, id.find(';'));  // --parsable prints "<id>[;<cluster>]"
    queued_id = id;
    std::error_code renamed;
    fs::rename(pending, root / id, renamed);
    if (renamed)
      throw RuntimeError(errors::runtime_io, fmt::format("cannot rename {} to {}: {}", pending.string(),
                                                         (root / id).string(), renamed.message()));
    final_directory = root / id;

    SubmittedJob submitted;
    submitted.id = id;
    submitted.name = job.name();
    submitted.directory = final_directory;
    const auto workdir = job_workdir(job, context);
    const std::string output_pattern = job.output() ? *job.output() : default_output_pattern(job, context);
    submitted.output_log = detail::resolve_log_pattern(output_pattern, id, job.name(), workdir, context.environment);
    submitted.error_log = job.error()
                              ? detail::resolve_log_pattern(*job.error(), id, job.name(), workdir, context.environment)
                              : submitted.output_log;
    auto record = detail::to_json(submitted);
    record["argv"] = context.argv;
    record["program"] = context.program;
    record["submitted_at"] = detail::utc_now();
    record["hpctrain_version"] = version;
    if (job.array()) {  // --status/--logs/--cancel of an array read these (job/array_commands.hpp)
      record["array"] = job.array()->text;
      record["output_pattern"] = output_pattern;
    }
    if (job.sweep()) {  // --results reads each task's knob values here (job/results.hpp)
      const auto resolved = context.sweep ? *context.sweep : unchecked_sweep(*job.sweep());
      auto& combinations = record["sweep"] = nlohmann::json::array();
      for (const auto& combination : resolved.combinations) {
        nlohmann::json values = nlohmann::json::array();
        for (const auto& [knob, value] : combination.values) values.push_back({knob, value});
        combinations.push_back(
            {{"task", combination.task}, {"configuration", combination.configuration}, {"values", values}});
      }
    }
    // argv may hold bytes that are not UTF-8: JSON gets U+FFFD for them instead of an exception.
    detail::write_file_atomically(final_directory / layout::job_record,
                                  record.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    detail::write_file_atomically(root / layout::last_job_file, id + "\n");

    const auto release = run_process({"scontrol", "release", id});
    if (release.exit_code != 0)
      throw RuntimeError(errors::runtime_sbatch,
                         fmt::format("cannot release held job {}: {}", id, detail::trim(release.err)));
    return submitted;
  } catch (...) {
    if (queued_id) run_process({"scancel", *queued_id});
    std::error_code ignored;
    detail::remove_tree(pending);
    if (!final_directory.empty()) {
      detail::remove_tree(final_directory);
      // `last` must not point at a job that was taken back.
      std::ifstream last(root / layout::last_job_file);
      std::string last_id;
      if (last >> last_id && queued_id && last_id == *queued_id) fs::remove(root / layout::last_job_file, ignored);
    }
    // Directories this submission created stay only if something else lives in them.
    fs::remove(root, ignored);
    fs::remove(root.parent_path(), ignored);
    throw;
  }
}

/// The last job this program submitted from this working directory. Throws RuntimeError(errors::runtime_no_job).
inline SubmittedJob last_submitted(const Job& job, const RenderContext& context) {
  const auto root = job_root(job, context);
  std::ifstream last(root / layout::last_job_file);
  std::string id;
  if (!(last >> id))
    throw RuntimeError(errors::runtime_no_job,
                       fmt::format("no job submitted yet from here ({} has none); use --submit", root.string()));
  const auto path = root / id / layout::job_record;
  const auto text = hpctrain::detail::read_file_if_present(path, errors::runtime_job_record);
  if (!text) throw RuntimeError(errors::runtime_no_job, fmt::format("the record {} is missing", path.string()));
  return detail::parse_job_record(*text, path);
}

namespace detail {
/// Slurm's answer for a job id it does not know (squeue, scontrol): not a failure of the command.
inline bool is_unknown_job_answer(const ProcessResult& result) {
  return result.err.find("Invalid job id specified") != std::string::npos;
}
/// `<command>: <its stderr>` (or its exit code when it said nothing), for an error that shows Slurm's own words.
inline std::string failure_of(std::string_view command, const ProcessResult& result) {
  const auto said = trim(result.err.empty() ? result.out : result.err);
  return fmt::format("{} (exit {}): {}", command, result.exit_code, said.empty() ? "no message" : said);
}

/// What a pending job's reason (squeue's %R, scontrol's Reason) means and what to try; "" for other reasons.
/// The reasons are Slurm's (squeue(1), "JOB REASON CODES").
inline std::string pending_reason_hint(std::string_view reason) {
  reason = reason.substr(0, reason.find(','));  // "(Resources)" or "(ReqNodeNotAvail, UnavailableNodes:n1)"
  if (reason.size() >= 2 && reason.front() == '(') reason = reason.substr(1, reason.find(')') - 1);
  static constexpr std::pair<std::string_view, std::string_view> hints[] = {
      {"BadConstraints",
       "no node can ever satisfy the request (GPUs, memory, CPUs or --constraint): compare the job's "
       "resources with `sinfo -o '%P %D %c %m %G %f'`, and cancel it"},
      {"Resources", "the nodes it needs are busy; it starts when they free up"},
      {"Priority", "jobs of higher priority are ahead of it (`sprio -j <id>` shows why)"},
      {"PartitionTimeLimit", "--time exceeds the partition's limit (`sinfo -o '%P %l'`): it will never start"},
      {"PartitionNodeLimit", "more nodes than the partition allows per job (`scontrol show partition`)"},
      {"QOSMaxGRESPerUser",
       "your QOS caps the GPUs you may hold at once: it starts when your other jobs end "
       "(`sacctmgr show qos format=name,maxtresperuser`)"},
      {"QOSMaxJobsPerUserLimit", "your QOS caps how many jobs you may run at once"},
      {"AssocGrpGRES", "your account's GPU limit is reached (`sacctmgr show assoc user=$USER`)"},
      {"AssocMaxJobsLimit", "your account's limit on running jobs is reached"},
      {"ReqNodeNotAvail", "a node it needs is down, drained or reserved (`sinfo -R`)"},
      {"Dependency", "it waits for the jobs it depends on"},
      {"DependencyNeverSatisfied", "a job it depends on failed: it will never start (cancel it)"},
      {"BeginTime", "it waits for its begin time (a requeued job waits about two minutes)"},
      {"JobHeldUser", "held by you: `scontrol release <id>`"},
      {"JobHeldAdmin", "held by an administrator"},
  };
  for (const auto& [code, hint] : hints)
    if (reason == code) return std::string(hint);
  return {};
}

inline std::optional<JobState> state_from_squeue(const std::string& id, const ProcessResult& queued) {
  if (queued.exit_code != 0 || trim(queued.out).empty()) return std::nullopt;
  JobState state{id, "", "squeue", "", ""};
  const auto line = trim(queued.out);
  const auto bar = line.find('|');
  state.state = line.substr(0, bar);
  std::vector<std::string> fields;
  std::stringstream rest(line.substr(bar + 1));
  for (std::string field; std::getline(rest, field, '|');) fields.push_back(field);
  if (fields.size() == 4) {
    state.detail = fmt::format("elapsed {}, limit {}, {} node(s), {}", fields[0], fields[1], fields[2], fields[3]);
    if (state.state == "PENDING") state.hint = pending_reason_hint(fields[3]);
  }
  return state;
}

/// The job's newest row: a requeued job has one row per run in the completion log (`sacct -c`) and, with
/// accounting storage, may list older runs too; they come oldest first. The count of rows beyond the first is
/// the restarts.
inline std::optional<JobState> state_from_sacct(const std::string& id, const ProcessResult& accounted) {
  std::optional<JobState> newest;
  int rows = 0;
  std::stringstream lines(accounted.out);
  for (std::string line; std::getline(lines, line);) {
    std::vector<std::string> fields;
    std::stringstream parts(line);
    for (std::string field; std::getline(parts, field, '|');) fields.push_back(field);
    if (fields.size() >= 4 && fields[0] == id && !fields[1].empty()) {
      ++rows;
      newest = JobState{id, fields[1].substr(0, fields[1].find(' ')),  // "CANCELLED by 0"
                        "sacct", fmt::format("exit code {}, elapsed {}", fields[2], fields[3]), ""};
    }
  }
  if (newest && rows > 1) newest->detail += fmt::format(", {} restart(s)", rows - 1);
  return newest;
}

inline JobState state_from_scontrol(const std::string& id, const ProcessResult& shown) {
  const auto field = [&](std::string_view key) {
    const auto at = shown.out.find(fmt::format(" {}=", key));
    if (at == std::string::npos) return std::string();
    const auto begin = at + key.size() + 2;
    return shown.out.substr(begin, shown.out.find(' ', begin) - begin);
  };
  JobState state{id, field("JobState"), "scontrol", fmt::format("exit code {}", field("ExitCode")), ""};
  if (const auto restarts = field("Restarts"); !restarts.empty() && restarts != "0")
    state.detail += fmt::format(", {} restart(s)", restarts);
  if (state.state == "PENDING") state.hint = pending_reason_hint(field("Reason"));
  return state;
}
}  // namespace detail

/// Asks squeue, then sacct (with `-c` where accounting storage is off), then scontrol. A state with an empty
/// `state` means every command answered and none knows the job. Throws RuntimeError
/// `[hpctrain.runtime.status]` with the commands' own messages when Slurm could not be asked (no
/// configuration, controller unreachable): "unknown" would then be a guess.
inline JobState query_state(const std::string& id) {
  const auto queued = run_process({"squeue", "--noheader", "--jobs", id, "--format", "%T|%M|%l|%D|%R"});
  if (auto state = detail::state_from_squeue(id, queued)) return *state;
  std::vector<std::string> failures;
  const bool controller_failed = queued.exit_code != 0 && !detail::is_unknown_job_answer(queued);
  if (controller_failed) failures.push_back(detail::failure_of("squeue", queued));

  const std::vector<std::string> sacct_args = {
      "--noheader", "--parsable2", "--allocations", "--jobs", id, "--format", "JobID,State,ExitCode,Elapsed"};
  std::vector<std::string> sacct_failures;
  for (const bool completion_log : {false, true}) {
    std::vector<std::string> command = {"sacct"};
    if (completion_log) command.push_back("-c");  // jobcomp/filetxt: clusters without slurmdbd
    command.insert(command.end(), sacct_args.begin(), sacct_args.end());
    const auto accounted = run_process(command);
    if (accounted.exit_code != 0) {
      sacct_failures.push_back(detail::failure_of(completion_log ? "sacct -c" : "sacct", accounted));
      continue;
    }
    sacct_failures.clear();  // one of the two answered
    if (auto state = detail::state_from_sacct(id, accounted)) return *state;
    break;
  }
  failures.insert(failures.end(), sacct_failures.begin(), sacct_failures.end());
  // scontrol asks the same controller as squeue: when that failed, asking again only waits as long.
  bool scontrol_failed = false;
  if (!controller_failed) {
    const auto shown = run_process({"scontrol", "--oneliner", "show", "job", id});
    if (shown.exit_code == 0) return detail::state_from_scontrol(id, shown);
    scontrol_failed = !detail::is_unknown_job_answer(shown);
    if (scontrol_failed) failures.push_back(detail::failure_of("scontrol", shown));
  }
  // sacct failing alone is common (no accounting storage) and does not make the answer a guess.
  if (controller_failed || scontrol_failed)
    throw RuntimeError(errors::runtime_status,
                       fmt::format("cannot ask Slurm about job {}:\n  {}", id, fmt::join(failures, "\n  ")));
  return JobState{id, "", "", "", ""};
}

/// Prepares a squashfs for pyxis on the login node: `enroot import -o <output_sqsh> docker://<image>`.
/// Throws RuntimeError(errors::runtime_enroot, ...) with enroot's message when it fails.
inline void enroot_import(std::string_view image, std::string_view output_sqsh) {
  const auto result = run_process(enroot_import_command(image, output_sqsh));
  if (result.exit_code != 0)
    throw RuntimeError(errors::runtime_enroot,
                       fmt::format("enroot import failed (exit {}): {}", result.exit_code, detail::trim(result.err)));
}

/// Cancels job `id` (`scancel`). Throws RuntimeError(errors::runtime_scancel, ...) with scancel's message.
inline void cancel(const std::string& id) {
  const auto result = run_process({"scancel", id});
  if (result.exit_code != 0)
    throw RuntimeError(errors::runtime_scancel, fmt::format("scancel {} failed: {}", id, detail::trim(result.err)));
}

/// Writes the job's log to `out`; with `follow`, keeps writing until the job left the queue.
inline void print_logs(const SubmittedJob& job, std::ostream& out, bool follow) {
  std::uintmax_t offset = 0;
  const auto drain = [&] {
    std::ifstream file(job.output_log, std::ios::binary);
    if (!file) return;
    file.seekg(static_cast<std::streamoff>(offset));
    std::string chunk((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    offset += chunk.size();
    out << chunk << std::flush;
  };
  if (!follow) {
    if (!std::filesystem::exists(job.output_log))
      throw RuntimeError(errors::runtime_logs, fmt::format("job {} has no log yet at {}", job.id, job.output_log));
    drain();
    return;
  }
  while (true) {
    const bool queued = query_state(job.id).in_queue();
    drain();
    if (!queued) break;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  drain();
}

}  // namespace hpctrain
