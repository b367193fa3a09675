#pragma once
// What `--plan` asks a program (job/cli.hpp): the job's geometry and one GPU's memory; the program's answer
// is a Planner (Training::memory_plan, lm::causal_lm_training's). Torch-free.
#include <cctype>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/job/knobs.hpp>
#include <hpctrain/names.hpp>

namespace hpctrain {

/// A test seam's number above 0 in `environment` (docs/seams.md), or nothing where it is unset; SpecError
/// `[hpctrain.spec.simulated_link]` naming the variable for any other value.
inline std::optional<double> test_seam_number(const Environment& environment, const char* variable,
                                              std::string_view unit) {
  return positive_number_from_environment(environment, variable, [&](const std::string& value) {
    throw SpecError(errors::spec_simulated_link, fmt::format("{}={}", variable, value),
                    fmt::format("a number of {} above 0 is needed", unit));
  });
}

/// What `--plan` is asked about: the job's geometry and one GPU's memory, when known.
struct PlanRequest {
  int world = 1;  ///< ranks: nodes × tasks per node
  int ranks_per_node = 1;
  int gpus_per_node = 0;                        ///< 0: a CPU job
  std::optional<double> gpu_bytes;              ///< --gpu-memory, else what the GPU type's name says
  std::string gpu_type;                         ///< the Slurm GPU type the job asks for ("h100"), empty when none
  std::optional<std::string> fabric;            ///< the site's fabric between nodes (efa, infiniband, ethernet)
  std::optional<double> expected_busbw_gbps;    ///< the site's stated bus bandwidth between nodes
  std::optional<double> checkpoint_write_gbps;  ///< the site's write bandwidth of one node to the checkpoints' disk
  std::optional<double> requeue_grace_s;        ///< requeue_on_timeout's grace, when the job has one
  bool refuse_short_grace = false;              ///< the site file's `short_grace = refuse`
  /// Test seams (docs/seams.md), from the login shell's environment: a CPU job's step time is planned at a simulated
  /// link of HPCTRAIN_SIMULATED_LINK_GBPS and HPCTRAIN_PLAN_CPU_TFLOPS; unset in a user's plan.
  std::optional<double> simulated_link_gbps, cpu_tflops;
};
/// What a plan concluded.
enum class PlanVerdict {
  fits,          ///< the peak fits one GPU's memory
  unknown,       ///< planned, but one GPU's memory is not known (a CPU job, a GPU type hpctrain does not know)
  does_not_fit,  ///< the peak exceeds one GPU's memory: --plan exits 2, --submit refuses
  cannot_plan,   ///< the program's model cannot be sized before it is built (the stream says why)
  short_grace,   ///< requeue_on_timeout's grace cannot hold a save, and the site refuses such jobs (short_grace)
};
/// A program's memory plan (Training::memory_plan): prints it to the stream and says what it concluded. Its lines that
/// begin `hpctrain: warning:` are warnings --submit prints even when it does not print the plan.
using Planner = std::function<PlanVerdict(const Knobs& knobs, const PlanRequest& request, std::ostream& out)>;

/// The memory of one GPU of a Slurm GPU type, in bytes, when its name says it (GB as sold): h200 141, h100 80
/// (94 for an NVL name with "94"), a100 80 (40 when the name says "40"), l40 48, a10 24. nullopt otherwise.
inline std::optional<double> gpu_memory_of_type(std::string type) {
  for (auto& c : type) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const auto has = [&](const char* part) { return type.find(part) != std::string::npos; };
  if (has("h200")) return 141e9;
  if (has("h100")) return has("94") ? 94e9 : 80e9;
  if (has("a100")) return has("40") ? 40e9 : 80e9;
  if (has("l40")) return 48e9;
  if (has("a10")) return 24e9;
  return std::nullopt;
}

}  // namespace hpctrain
