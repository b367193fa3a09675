#pragma once
// What the cluster itself says about a job before it is queued: `sbatch --test-only` on the rendered script.
// Slurm schedules the job without queueing it, so it refuses what no amount of waiting would run: a partition
// that does not exist, more nodes, CPUs, GPUs or memory than any node of the partition has, an unknown feature
// or GRES, a time over the partition's limit, an account or QOS that is not the user's. hpctrain's own checks
// cannot know these; they are the cluster's. A refusal is a SpecError naming the job's field and its value, with
// sbatch's words and the command that shows what the cluster has: --submit exits 2 with nothing written or
// queued; --dry-run prints it as a warning beside the script (which may be meant for another cluster).
// Where no cluster answers (no sbatch on the PATH, no slurm.conf), nothing is checked.
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <unistd.h>

#include <hpctrain/error.hpp>
#include <hpctrain/job/job.hpp>
#include <hpctrain/job/process.hpp>
#include <hpctrain/job/units.hpp>
#include <hpctrain/names.hpp>

namespace hpctrain {

namespace detail {
/// The SLURM_* variables of this process that sbatch must not see: submitted from inside a job (a batch
/// script, an array task, a step), the parent's SLURM_* would travel into the child with sbatch's default
/// --export=ALL, and the child's srun and hpctrain read some of them as input where the child's own are not
/// set (SLURM_CPUS_PER_TASK, SLURM_NTASKS, SLURM_STEP_*, SLURM_PTY_PORT...: submitit #1782). Kept:
/// SLURM_CONF (which cluster), SLURM_CLUSTERS. The job's own variables are in its script.
inline std::vector<std::string> inherited_slurm_variables(const Environment& environment) {
  std::vector<std::string> names;
  for (const auto& [name, value] : environment.variables())
    if (name.starts_with("SLURM_") && name != "SLURM_CONF" && name != "SLURM_CLUSTERS") names.push_back(name);
  return names;
}

/// The sbatch options of `job`'s resource request, as a user would type them (the value of a `resources` refusal).
inline std::string resource_request(const Job& job) {
  std::string out = fmt::format("--nodes={} --ntasks-per-node={}", job.nodes(), job.tasks_per_node());
  if (job.cpus_per_task()) out += fmt::format(" --cpus-per-task={}", *job.cpus_per_task());
  if (job.gpus() && job.gpus()->count > 0)
    out +=
        fmt::format(" --gpus-per-node={}{}", job.gpus()->type.empty() ? "" : job.gpus()->type + ":", job.gpus()->count);
  if (job.memory()) out += " --mem=" + to_slurm(*job.memory());
  if (job.memory_per_gpu()) out += " --mem-per-gpu=" + to_slurm(*job.memory_per_gpu());
  if (job.partition()) out += " --partition=" + *job.partition();
  return out;
}

/// The field of `job` that `sbatch --test-only` refused, from its message (Slurm's wording from 21.08 to 24.11),
/// as a SpecError with sbatch's words and what to try. A value given as a raw sbatch option (`--sbatch
/// constraint=a100`), which replaces the field's directive, is named as that option.
inline SpecError refusal_from_sbatch(const Job& job, std::string_view sbatch_error) {
  const auto has = [&](std::string_view text) { return sbatch_error.find(text) != std::string_view::npos; };
  const auto words = std::string(sbatch_error.substr(0, sbatch_error.find_last_not_of(" \n") + 1));
  const auto refused = [&](std::string_view field, const std::optional<std::string>& value,
                           std::initializer_list<std::string_view> keys, std::string_view hint) {
    const auto reason = fmt::format("this cluster refuses it (sbatch --test-only: {})\nhint: {}", words, hint);
    for (const auto& [key, given] : job.sbatch_options())  // a raw option replaces the field's directive
      for (const auto wanted : keys)
        if (key == wanted) return SpecError("sbatch_option", given.empty() ? key : key + "=" + given, reason);
    return SpecError(field, value.value_or("(the cluster's default)"), reason);
  };
  const auto gpus = job.gpus() && job.gpus()->count > 0
                        ? std::optional<std::string>(fmt::format(
                              "{}{}", job.gpus()->type.empty() ? "" : job.gpus()->type + ":", job.gpus()->count))
                        : std::nullopt;
  const auto time = job.time() ? std::optional<std::string>(format_slurm_time(*job.time())) : std::nullopt;
  if (has("nvalid partition"))
    return refused("partition", job.partition(), {"partition", "p"},
                   "`sinfo -s` lists the partitions you can submit to.");
  if (has("nvalid feature"))
    return refused("constraint", job.constraint(), {"constraint", "C"},
                   "`sinfo -o '%P %f'` lists each partition's node features.");
  if (has("nvalid generic resource") || has("nvalid GRES"))
    return refused("gpus_per_node", gpus, {"gres", "gpus", "gpus-per-node", "G"},
                   "`sinfo -o '%P %G'` lists each partition's GPUs (GRES).");
  if (has("nvalid account"))
    return refused("account", job.account(), {"account", "A"},
                   "`sacctmgr show associations user=$USER format=account,partition` lists your accounts.");
  if (has("nvalid qos"))
    return refused("qos", job.qos(), {"qos", "q"},
                   "`sacctmgr show associations user=$USER format=qos` lists your QOS.");
  if (has("ime limit"))
    return refused("time", time, {"time", "t"}, "`sinfo -o '%P %l'` shows each partition's maximum time.");
  if (has("nvalid reservation") || has("eservation"))
    return refused("reservation", job.reservation(), {"reservation"},
                   "`scontrol show reservation` lists the reservations.");
  return SpecError(
      "resources", resource_request(job),
      fmt::format("this cluster refuses it (sbatch --test-only: {})\nhint: `sinfo -o '%P %D %c %G %m'` shows each "
                  "partition's nodes, CPUs per node, GPUs and memory (MB).",
                  words));
}

/// A file under the temporary directory (TMPDIR of `environment`, else /tmp) holding `text`, removed when this goes
/// away.
class TemporaryScript {
 public:
  TemporaryScript(const std::string& text, const Environment& environment) {
    path_ = std::filesystem::path(environment.get("TMPDIR").value_or("/tmp")) / "hpctrain-test-only-XXXXXX";
    std::string name = path_.string();
    const int fd = ::mkstemp(name.data());
    if (fd < 0) throw RuntimeError(errors::runtime_io, fmt::format("cannot create {}: {}", name, std::strerror(errno)));
    path_ = name;
    std::size_t written = 0;
    while (written < text.size()) {
      const auto n = ::write(fd, text.data() + written, text.size() - written);
      if (n <= 0) break;
      written += static_cast<std::size_t>(n);
    }
    ::close(fd);
  }
  ~TemporaryScript() {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
  TemporaryScript(const TemporaryScript&) = delete;
  TemporaryScript& operator=(const TemporaryScript&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace detail

/// What the cluster says about `job` (rendered as `script`): the refusal of `sbatch --test-only`, or nothing when
/// the cluster would run it or no cluster answers (no sbatch, no Slurm configuration). `environment`: the login
/// shell's, in which sbatch runs (without this job's SLURM_*).
inline std::optional<SpecError> cluster_refusal(const Job& job, const std::string& script,
                                                const Environment& environment) {
  const detail::TemporaryScript file(script, environment);
  ProcessResult tested;
  try {
    tested = run_process({"sbatch", "--test-only", file.path().string()}, {}, "",
                         detail::inherited_slurm_variables(environment));
  } catch (const RuntimeError&) {  // no sbatch here
    return std::nullopt;
  }
  if (tested.exit_code == 0) return std::nullopt;
  const auto& err = tested.err;
  // No cluster to ask: slurm.conf not found (a DNS SRV lookup is Slurm's last resort), or slurmctld down.
  if (err.find("SRV") != std::string::npos || err.find("configuration source") != std::string::npos ||
      err.find("Unable to contact slurm controller") != std::string::npos)
    return std::nullopt;
  return detail::refusal_from_sbatch(job, err);
}

}  // namespace hpctrain
