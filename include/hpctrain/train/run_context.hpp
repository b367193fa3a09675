#pragma once
// What a worker knows when it builds the run, handed to the factories that ask for it (`.model`,
// `.train_data`, `.eval_data` taking `const RunContext&`) and to the hooks at the end (`Training::at_end`):
// the knobs, its place in the world, the run directory and where the job's preparation step left its
// results. docs/lm.md ("Interfaces") is the contract.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <hpctrain/error.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/models/lora/lora_config.hpp>
#include <hpctrain/models/model_units.hpp>

namespace hpctrain {

/// The run as a worker sees it before training starts.
struct RunContext {
  const Knobs& knobs;                                   ///< this run's knob values
  int rank = 0;                                         ///< this rank
  int world_size = 1;                                   ///< ranks in the run
  std::filesystem::path run_dir;                        ///< checkpoints, metrics, exports go below it
  std::optional<std::filesystem::path> prepared_dir;    ///< Job::prepare's output directory, when the job has one
  std::optional<std::filesystem::path> pretrained_dir;  ///< where the model factory's files are (lm::from_pretrained)
  std::optional<models::LoraConfig> lora;               ///< the adapters the run trains (Training::lora), if any
  /// The strategy reads its own slices of each block (ZeRO-3 without LoRA): a model factory may return blocks
  /// built empty, with ListsBlocks::deferred_blocks (lm::from_pretrained does); the model hooks then see them empty.
  bool defer_blocks = false;
  /// The Trainer reads the blocks itself once it has chosen their dtype (LoRA in bf16 on a strategy that holds the
  /// model whole reads the frozen base, blocks and edges, straight into bf16): a loader may leave them empty, as under
  /// defer_blocks.
  bool trainer_reads_blocks = false;
  std::int64_t seed = 0;  ///< the run's seed (Training::seed): data that draws at random (a mix) draws with it

  /// The preparation's output directory; RuntimeError naming `what` needs it when the job has none.
  const std::filesystem::path& require_prepared_dir(std::string_view what) const {
    if (!prepared_dir)
      throw RuntimeError(errors::runtime_io,
                         fmt::format("{} needs the job's preparation step (Job::prepare), and this run has none "
                                     "(HPCTRAIN_RUN_DIR is not set: run it with --local N or --submit)",
                                     what));
    return *prepared_dir;
  }
};

/// How a call of `train` ended.
struct TrainResult {
  int exit_code = exit_ok;                     ///< exit_ok, or exit_requeue after a preemption checkpoint
  std::int64_t steps_completed = 0;            ///< optimizer steps done in total (including before a resume)
  std::int64_t total_steps = 0;                ///< steps the run is meant to take
  std::optional<std::int64_t> resumed_from;    ///< step of the checkpoint this call resumed from
  std::optional<double> eval_loss;             ///< final evaluation, when there is eval data
  std::optional<double> eval_loss_at_start;    ///< evaluation before the first step (Training::evaluate_at_start)
  std::optional<double> eval_accuracy;         ///< final accuracy, when requested
  std::map<std::string, double> eval_metrics;  ///< every requested metric of the final evaluation
};

/// The model as the Trainer's strategy hands it to the hooks at the end (train/strategies/strategy.hpp's visit_units).
class FinishModel {
 public:
  virtual ~FinishModel() = default;
  /// Every parameter by name with its whole shape, in the order visit_units hands them out; nothing is gathered.
  virtual std::vector<models::ParameterShape> unit_shapes() = 0;
  /// Collective: calls `visit` with the parameters one unit at a time, each whole during the call (ZeRO-3: one
  /// block or edge gathered at a time, then the parameters every rank keeps whole).
  virtual void visit_units(const models::UnitVisitor& visit) = 0;
  /// Collective: makes the module hold the whole model (on every rank, until the run ends).
  virtual void gather_whole() = 0;
  /// Whether a forward of the module is collective (ZeRO-3, HSDP: each block gathered while it runs): every rank
  /// then runs the same forwards, in the same order.
  virtual bool forward_is_collective() const = 0;
  /// Collective: waits until every rank is here, as long as the checkpoint timeout allows (the ranks of a hook that
  /// write files of one directory: lm::hf_export).
  virtual void wait_for_writers() = 0;
};

/// What a hook at the end of a finished run sees: the model, the run and its result. Hooks run on every rank;
/// most act on rank 0 only (`run.rank == 0`). `module` is whole (gathered from its shards under ZeRO-3) for a
/// hook added as a plain callable; one made with FinishHook::unit_by_unit reads it through visit_units, or asks
/// for whole_model(), every rank alike: both are collective.
struct FinishContext {
  torch::nn::Module& module;
  const RunContext& run;
  const TrainResult& result;
  /// The Trainer's strategy; null: `module` is whole as it is.
  FinishModel* model = nullptr;

  /// Every parameter by name with its whole shape, in the order visit_units hands them out.
  std::vector<models::ParameterShape> unit_shapes() const {
    return model != nullptr ? model->unit_shapes() : models::shapes_of(models::whole_unit(module));
  }
  /// Collective: the model's parameters one unit at a time (FinishModel::visit_units).
  void visit_units(const models::UnitVisitor& visit) const {
    if (model != nullptr) model->visit_units(visit);
    else visit(models::whole_unit(module));
  }
  /// Whether a forward of `module` is collective (FinishModel::forward_is_collective): a hook that computes
  /// with it unit by unit (lm::sample_at_end) then runs it on every rank alike.
  bool forward_is_collective() const { return model != nullptr && model->forward_is_collective(); }
  /// Collective: every rank here, under the checkpoint timeout (FinishModel::wait_for_writers).
  void wait_for_writers() const {
    if (model != nullptr) model->wait_for_writers();
  }
  /// Collective: `module`, whole.
  torch::nn::Module& whole_model() const {
    if (model != nullptr) model->gather_whole();
    return module;
  }
};

/// A hook at the end of a finished run (not after a preemption): exports, samples, reports. Any callable taking
/// the FinishContext; the Trainer gathers the whole model into `module` before it runs. A hook made with
/// unit_by_unit is not given the whole model: it visits it (FinishContext::visit_units), so that no rank holds it
/// whole (lm::hf_export), or does not read it at all (lm::print_eval_loss).
class FinishHook {
 public:
  template <class F>
  requires(!std::is_same_v<std::decay_t<F>, FinishHook> && std::is_invocable_v<const F&, const FinishContext&>)
      FinishHook(F hook)
      : call_(std::move(hook)) {}  // NOLINT: implicit, so that a lambda is a hook

  /// `hook`, run without gathering the whole model first.
  static FinishHook unit_by_unit(std::function<void(const FinishContext&)> hook) {
    FinishHook made(std::move(hook));
    made.needs_whole_model_ = false;
    return made;
  }

  void operator()(const FinishContext& at_end) const { call_(at_end); }
  /// Whether the Trainer gathers the whole model into FinishContext::module before the hook runs.
  bool needs_whole_model() const { return needs_whole_model_; }

 private:
  std::function<void(const FinishContext&)> call_;
  bool needs_whole_model_ = true;
};

/// A check on the login node once the knobs are parsed, before anything is written or queued (a data file
/// that is visible there is validated); throws SpecError naming the field and the value.
using LoginCheck = std::function<void(const Knobs&)>;
/// What a data factory's login check read of its data's size: at most `examples` examples (fewer rows may reach the
/// ranks: examples dropped, or packed together), in `what` (the file and its split). The batch is checked against it
/// there: a batch larger than an epoch would fail every rank after the queue.
struct DataSizeAtLogin {
  std::int64_t examples = 0;
  std::string what;
};
/// Called on every rank with the model its factory made and the run's knobs, before LoRA, the move to the
/// device and the strategy (lm::causal_lm_training's --activation-checkpointing is one).
using ModelHook = std::function<void(torch::nn::Module&, const Knobs&)>;

}  // namespace hpctrain
