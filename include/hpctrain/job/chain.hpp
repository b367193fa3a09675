#pragma once
// Chains of stages (Job::then): one `--submit` queues the program's job and each later stage as a job of its
// own, each `--dependency=afterok:<previous>`; the first stage's job directory keeps the chain (chain.json),
// which --status and --cancel read. A stage whose predecessor failed never starts: Slurm keeps it PENDING
// with Reason=DependencyNeverSatisfied (unless the site sets kill_invalid_depend), and --status says so. A later
// stage's script exports the directories of the stages before it (HPCTRAIN_STAGE_DIRS): what stage_dir reads.
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>  // chain.json

#include <hpctrain/error.hpp>
#include <hpctrain/files.hpp>
#include <hpctrain/job/job.hpp>
#include <hpctrain/job/render.hpp>
#include <hpctrain/job/run_placement.hpp>  // without_resume
#include <hpctrain/job/stage_knobs.hpp>    // format_stage_dirs
#include <hpctrain/job/submit.hpp>
#include <hpctrain/names.hpp>

namespace hpctrain {

/// Inside a stage's job directory: the ids and names of every stage, in order.
inline constexpr std::string_view chain_record_file = "chain.json";

/// One stage of a submitted chain.
struct ChainStage {
  std::string id, name;
};

/// The stage a worker or a preparation step runs (HPCTRAIN_STAGE of its `environment`, set by each stage's script);
/// empty outside a chain.
inline std::optional<std::string> current_stage(const Environment& environment) { return environment.get(env::stage); }

/// The jobs of `job`'s chain in order: the job itself (without its stages), then each stage; each exports
/// HPCTRAIN_STAGE=<its name> to its workers. Dependencies between them are added at submission.
inline std::vector<Job> chain_jobs(const Job& job) {
  std::vector<Job> jobs;
  jobs.push_back(job.without_stages());
  for (const auto& stage : job.stages()) jobs.push_back(stage);
  for (auto& each : jobs) each.env(env::stage, each.name());
  return jobs;
}

/// `stage` told the directories of the stages before it (HPCTRAIN_STAGE_DIRS, what stage_dir reads): `earlier`
/// holds their names and directories.
inline void tell_earlier_stages(Job& stage, const std::vector<std::pair<std::string, std::string>>& earlier) {
  if (!earlier.empty()) stage.env(env::stage_dirs, format_stage_dirs(earlier));
}

/// The context stage `index` of a chain is rendered or launched with: `--resume DIR` is the first stage's alone; the
/// later stages run again on its results, as they would after it finished (a later stage given the first one's
/// checkpoint would load another model's, or write into its directory).
inline RenderContext stage_context(const RenderContext& context, std::size_t index) {
  if (index == 0) return context;
  RenderContext stage = context;
  stage.worker_args = detail::without_resume(std::move(stage.worker_args));
  return stage;
}

/// `--dry-run` of a chain: every stage's script, each under a line saying what it waits for.
inline std::string render_chain(const Job& job, const RenderContext& context) {
  auto jobs = chain_jobs(job);
  std::string text;
  std::vector<std::pair<std::string, std::string>> earlier;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    tell_earlier_stages(jobs[i], earlier);
    earlier.emplace_back(jobs[i].name(),
                         (job_root(jobs[i], context) / fmt::format("<job id of {}>", jobs[i].name())).string());
    text += fmt::format(
        "# ---- stage {} of {}: {}{} ----\n", i + 1, jobs.size(), jobs[i].name(),
        i == 0 ? "" : fmt::format(", submitted with --dependency=afterok:<job id of {}>", jobs[i - 1].name()));
    text += render_sbatch(jobs[i], stage_context(context, i));
  }
  return text;
}

/// Submits every stage, each afterok the one before; all or nothing: when one is refused, the stages already
/// queued are cancelled. The first stage's job directory gets chain.json; each stage's `last` names its job.
inline std::vector<SubmittedJob> submit_chain(const Job& job, const RenderContext& context) {
  auto jobs = chain_jobs(job);
  std::vector<SubmittedJob> submitted;
  std::vector<std::pair<std::string, std::string>> earlier;
  try {
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      auto& each = jobs[i];
      if (!submitted.empty()) each.after(submitted.back().id, After::ok);
      tell_earlier_stages(each, earlier);
      submitted.push_back(submit(each, stage_context(context, i)));
      earlier.emplace_back(each.name(), std::filesystem::absolute(submitted.back().directory).string());
    }
  } catch (...) {
    for (const auto& queued : submitted) run_process({"scancel", queued.id});
    throw;
  }
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& each : submitted) stages.push_back({{"id", each.id}, {"name", each.name}});
  for (const auto& each : submitted)
    detail::write_file_atomically(each.directory / chain_record_file,
                                  nlohmann::json{{"stages", stages}}.dump(2) + "\n");
  return submitted;
}

/// The chain a submitted job belongs to (its chain.json), or nothing for a job without stages. Throws
/// RuntimeError `[hpctrain.runtime.job_record]` for a damaged file.
inline std::optional<std::vector<ChainStage>> read_chain(const SubmittedJob& job) {
  const auto path = job.directory / chain_record_file;
  const auto text = hpctrain::detail::read_file_if_present(path, errors::runtime_job_record);
  if (!text) return std::nullopt;
  const auto record = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  const auto damaged = [&] {
    return RuntimeError(errors::runtime_job_record,
                        fmt::format("{}: not a chain record (edited or truncated?)", path.string()));
  };
  if (!record.is_object() || !record.contains("stages") || !record["stages"].is_array()) throw damaged();
  std::vector<ChainStage> stages;
  for (const auto& stage : record["stages"]) {
    if (!stage.is_object() || !stage.contains("id") || !stage["id"].is_string() || !stage.contains("name") ||
        !stage["name"].is_string())
      throw damaged();
    stages.push_back({stage["id"].get<std::string>(), stage["name"].get<std::string>()});
  }
  return stages;
}

/// `--status` of a chain: one line per stage, and for a stage that will never start, why: the first stage that
/// ended without success (Slurm marks only its direct successor DependencyNeverSatisfied; the ones after it
/// wait on a job that never runs).
inline std::string format_chain_status(const std::vector<ChainStage>& stages, const std::vector<JobState>& states) {
  std::string text =
      fmt::format("chain of {} stages (each starts when the one before completed successfully):\n", stages.size());
  std::optional<std::size_t> failed;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const auto& state = states.at(i);
    const auto shown = state.state.empty() ? std::string("unknown to squeue, sacct and scontrol") : state.state;
    text += fmt::format("  stage {} {} (job {}): {}", i + 1, stages[i].name, stages[i].id, shown);
    if (!state.detail.empty()) text += fmt::format(" ({}; from {})", state.detail, state.source);
    text += "\n";
    const bool pending = state.state == "PENDING";
    const bool never = state.detail.find("DependencyNeverSatisfied") != std::string::npos;
    if (pending && i > 0 && (never || failed)) {
      const auto cause = failed.value_or(i - 1);
      text += fmt::format(
          "    never starts: stage {} ({}, job {}) did not complete successfully; `--cancel` removes "
          "the chain's jobs\n",
          cause + 1, stages[cause].name, stages[cause].id);
    } else if (pending && i > 0 && state.detail.find("Dependency") != std::string::npos) {
      text += fmt::format("    waits for stage {} ({}, job {}) to complete\n", i, stages[i - 1].name, stages[i - 1].id);
    }
    const bool ended_without_success = !state.state.empty() && !pending && state.state != "RUNNING" &&
                                       state.state != "COMPLETED" && state.state != "COMPLETING" &&
                                       state.state != "CONFIGURING" && state.state != "REQUEUED";
    if (!failed && ended_without_success) failed = i;
  }
  return text;
}

}  // namespace hpctrain
