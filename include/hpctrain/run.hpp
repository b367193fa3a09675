#pragma once
// The one call a user's main makes: checks the training description and its knob table, then dispatches on
// the mode — login-node commands (--dry-run, --submit, --status, ...) through job/, worker mode to the
// training loop. The knob table travels from here into the job layer, which never sees a Training.
#include <algorithm>
#include <cstddef>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <hpctrain/compiled_runtime.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/job/job.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/job/run_placement.hpp>
#include <hpctrain/train/training.hpp>
#if HPCTRAIN_RUNTIME_DEFINITIONS  // the command line and the worker: not parsed by a program that links the runtime
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include <hpctrain/job/chain.hpp>  // current_stage
#include <hpctrain/job/cli.hpp>
#include <hpctrain/job/cli_options.hpp>  // with_job_geometry
#include <hpctrain/job/spec_error_exit.hpp>
#include <hpctrain/job/stage_knobs.hpp>
#include <hpctrain/train/batch_fit.hpp>
#include <hpctrain/train/worker.hpp>
#endif

namespace hpctrain {

/// Runs the program described by `job` and `training` for this command line; returns the exit code.
HPCTRAIN_RUNTIME_INLINE int run(int argc, char** argv, const Job& job, const Training& training);

/// One stage of a program that trains in steps, SFT and then DPO from its export: the job that runs it and what
/// it trains.
struct Stage {
  Job job;
  Training training;
};

/// Runs a chain of stages, `hpctrain::run(argc, argv, {{sft_job, sft}, {dpo_job, dpo}})`: `--submit` queues each
/// stage as a job of its own, each after the one before completed successfully (as Job::then), and `--local N`
/// runs them in order; each stage's workers train its Training, and a later stage reads an earlier one's
/// directory through `stage_dir("sft")` (job/setting.hpp). One command line sets every stage's knobs: `--lr` each
/// stage's that has it, `--dpo.lr` stage dpo's alone (job/stage_knobs.hpp); a knob not given keeps each stage's
/// own default. The job options (`--nodes`, `--time`, `--after`) apply to the first stage, as for Job::then.
HPCTRAIN_RUNTIME_INLINE int run(int argc, char** argv, const std::vector<Stage>& stages);

#if HPCTRAIN_RUNTIME_DEFINITIONS
namespace detail {
/// `job` with the Training's data preparation (lm::sft_jsonl's tokenization) in its preparation step, after the
/// job's own, read with the knob values the step is given (run_job gives them).
inline Job with_data_preparation(const Job& job, const Training& training) {
  if (!training.prepares_data()) return job;
  Job prepared = job;
  prepared.prepare(PrepareStep{[own = job.preparation(), &training](const PrepareContext& context) {
                                 if (own) own(context);
                                 training.prepare_data(context.knobs, context.output_dir);
                               },
                               job.preparation_check()});
  return prepared;
}
}  // namespace detail

HPCTRAIN_RUNTIME_INLINE int run(int argc, char** argv, const Job& job, const Training& training) {
  Knobs knobs;
  const int refused = with_exit_codes([&] {
    training.validate();                           // a broken description fails here, before anything is submitted
    knobs = training_knobs(training, job.name());  // a bare --wandb logs to the project named after the job
    return exit_ok;
  });
  if (refused != exit_ok) return refused;
  Planner planner;
  if (training.memory_planner())
    planner = [&training](const Knobs& values, const PlanRequest& request, std::ostream& out) {
      return training.memory_planner()(training, values, request, out);
    };
  return run_job(
      argc, argv, detail::with_data_preparation(job, training), knobs,
      [&training](const Knobs& values, const RunPlacement& placement) {
        return run_worker(training, values, placement);
      },
      [&training](const Knobs& values, const LoginCheckFacts& facts) {
        check_training_at_login(training, values, facts);
      },
      planner);
}

namespace detail {
/// The index of the stage this process runs: HPCTRAIN_STAGE's of its `environment` (each stage's script exports it),
/// else the first (`--run` in an allocation).
inline std::size_t current_stage_index(const std::vector<Stage>& stages, const Environment& environment) {
  const auto name = current_stage(environment);
  if (!name) return 0;
  std::vector<std::string> names;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    if (stages[i].job.name() == *name) return i;
    names.push_back(stages[i].job.name());
  }
  throw SpecError(errors::spec_stage, fmt::format("{}={}", env::stage, *name),
                  fmt::format("names no stage of this program (its stages: {})", fmt::join(names, ", ")));
}

/// The stage's knob values for this command line's in a job, told the earlier stages' directories by the script
/// (HPCTRAIN_STAGE_DIRS of the process's `environment`).
inline Knobs values_of_stage_in_job(const std::vector<StageKnobs>& tables, const Knobs& values, std::size_t index,
                                    const Environment& environment) {
  return stage_knob_values(values, tables[index], environment.get(env::stage_dirs).value_or(""));
}

/// The same at login, where an earlier stage's directory is `<the sft job's directory>`, which no login check finds
/// (it is the earlier job's to write, as with --after).
inline Knobs values_of_stage_at_login(const std::vector<Stage>& stages, const std::vector<StageKnobs>& tables,
                                      const Knobs& values, std::size_t index) {
  std::vector<std::pair<std::string, std::string>> earlier;
  for (std::size_t i = 0; i < index; ++i)
    earlier.emplace_back(stages[i].job.name(), fmt::format("<the {} job's directory>", stages[i].job.name()));
  return stage_knob_values(values, tables[index], format_stage_dirs(earlier));
}

/// The chain's job: each stage's, with its preparation (the job's own, then its Training's data) where it has
/// one. A stage's job runs this program's preparation step, which prepares the stage HPCTRAIN_STAGE names; so the
/// first stage's job has that step when any stage does.
inline Job chain_of_stages(const std::vector<Stage>& stages, const std::vector<StageKnobs>& tables,
                           const Knobs& chain) {
  const auto prepares = [](const Stage& stage) {
    return static_cast<bool>(stage.job.preparation()) || stage.training.prepares_data();
  };
  const PrepareFunction prepare_current = [&stages, &tables, &chain](const PrepareContext& context) {
    const auto index = current_stage_index(stages, context.environment);
    RunPlacement resumed;  // the preparation reads the knobs only
    PrepareContext with_values = context;
    with_values.knobs = values_of_stage_in_job(tables, chain.with_arguments(take_resume(context.args, resumed)), index,
                                               context.environment);
    if (const auto& own = stages[index].job.preparation()) own(with_values);
    if (stages[index].training.prepares_data())
      stages[index].training.prepare_data(with_values.knobs, context.output_dir);
  };
  Job first = stages.front().job;
  if (std::any_of(stages.begin(), stages.end(), prepares)) first.prepare(PrepareStep{prepare_current, nullptr});
  for (std::size_t i = 1; i < stages.size(); ++i) {
    Job later = stages[i].job;
    if (prepares(stages[i])) later.prepare(PrepareStep{prepare_current, nullptr});
    first.then(std::move(later));
  }
  return first;
}

/// What a chain's plans say together: the first that refuses submission, else unknown if one is, else fits (or
/// cannot_plan when no stage could be planned).
inline PlanVerdict chain_verdict(const std::vector<PlanVerdict>& verdicts) {
  const auto any = [&](PlanVerdict v) { return std::find(verdicts.begin(), verdicts.end(), v) != verdicts.end(); };
  for (const auto refusing : {PlanVerdict::does_not_fit, PlanVerdict::short_grace})
    if (any(refusing)) return refusing;
  if (any(PlanVerdict::unknown)) return PlanVerdict::unknown;
  return any(PlanVerdict::fits) ? PlanVerdict::fits : PlanVerdict::cannot_plan;
}
}  // namespace detail

HPCTRAIN_RUNTIME_INLINE int run(int argc, char** argv, const std::vector<Stage>& stages) {
  std::vector<StageKnobs> tables;
  Knobs chain;
  const int refused = with_exit_codes([&] {
    detail::require(!stages.empty(), errors::spec_stage, stages.size(), "hpctrain::run needs at least one stage");
    for (const auto& stage : stages) {
      detail::require(stage.job.stages().empty(), errors::spec_stage, stage.job.name(),
                      "a stage of hpctrain::run's chain declares no stages of its own (Job::then): list them all");
      detail::require(!stage.job.sweep(), errors::spec_stage, stage.job.name(),
                      "a chain of stages cannot sweep (each point would be a chain): sweep a one-stage program");
      stage.training.validate();
      tables.push_back({stage.job.name(), training_knobs(stage.training, stage.job.name())});
    }
    chain = chain_knob_table(tables);
    return exit_ok;
  });
  if (refused != exit_ok) return refused;
  Planner planner;
  if (std::any_of(stages.begin(), stages.end(), [](const Stage& s) { return bool(s.training.memory_planner()); }))
    planner = [&](const Knobs& values, const PlanRequest& request, std::ostream& out) {
      std::vector<PlanVerdict> verdicts;
      for (std::size_t i = 0; i < stages.size(); ++i) {
        const auto& training = stages[i].training;
        if (!training.memory_planner()) continue;
        out << fmt::format("stage {} of {}: {}\n", i + 1, stages.size(), stages[i].job.name());
        verdicts.push_back(
            training.memory_planner()(training, detail::values_of_stage_at_login(stages, tables, values, i),
                                      i == 0 ? request : with_job_geometry(request, stages[i].job), out));
      }
      return detail::chain_verdict(verdicts);
    };
  return run_job(
      argc, argv, detail::chain_of_stages(stages, tables, chain), chain,
      [&](const Knobs& values, const RunPlacement& placement) {
        const auto index = detail::current_stage_index(stages, placement.environment);
        return run_worker(stages[index].training,
                          detail::values_of_stage_in_job(tables, values, index, placement.environment), placement);
      },
      [&](const Knobs& values, const LoginCheckFacts& facts) {
        for (std::size_t i = 0; i < stages.size(); ++i) {
          const auto own = detail::values_of_stage_at_login(stages, tables, values, i);
          if (const auto& check = stages[i].job.preparation_check()) check(own);
          check_training_at_login(stages[i].training, own,
                                  {i == 0 ? facts.world : std::nullopt, facts.waits_for_jobs || i > 0});
        }
      },
      planner);
}
#endif

}  // namespace hpctrain
