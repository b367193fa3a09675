#pragma once
// What a program says of its W&B run (`Training::wandb(ht::Wandb("project")...)`): the project, entity, names, tags
// and mode, checked as W&B checks them. Apart from the logger (train/loggers/wandb.hpp, with its live stream through
// libcurl and its JSON) so that a program's description parses the settings only.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>

namespace hpctrain {

/// Whether a W&B run goes online, as wandb's `mode`: `ht::Wandb(...).mode(ht::WandbMode::offline)`.
enum class WandbMode {
  automatic,  ///< WANDB_MODE when set, else online where an API key is found, else offline
  online,     ///< stream live (the offline run is written too)
  offline,    ///< only the offline run, for `--wandb-sync`
  disabled,   ///< no W&B run at all (WANDB_MODE=disabled, as wandb's)
};

namespace detail {
/// Why W&B refuses `name` as a project or entity (`what`), or nothing: W&B's rule is at most 128 characters and
/// none of `/ \ # ? % :`.
inline std::optional<std::string> wandb_name_problem(std::string_view name) {
  if (name.empty()) return "must not be empty";
  if (name.size() > 128) return "must be at most 128 characters";
  if (name.find_first_of("/\\#?%:") != std::string_view::npos) return "must not hold / \\ # ? % or :";
  return std::nullopt;
}
}  // namespace detail

/// Where a run goes on W&B and under which names: `ht::Wandb("fashion").tags({"baseline"})`. Required: the
/// project. Throws SpecError `[hpctrain.spec.wandb]` for a name W&B refuses.
class Wandb {
 public:
  Wandb(std::string project)
      : project_(checked("project", std::move(project))) {}    // NOLINT: implicit, `.wandb("fashion")`
  Wandb(const char* project) : Wandb(std::string(project)) {}  // NOLINT

  /// The project (also set by `--wandb PROJECT`).
  Wandb& project(std::string name) {
    project_ = checked("project", std::move(name));
    return *this;
  }
  /// The team or user the run belongs to. Default: the default entity of whoever runs `wandb sync`.
  Wandb& entity(std::string name) {
    entity_ = checked("entity", std::move(name));
    return *this;
  }
  /// The run's name in the W&B UI. Default: `<job name>-<job id>` (`fashion-12345`; an array task adds its
  /// `_<task>`), else the run directory's name.
  Wandb& name(std::string name) {
    name_ = std::move(name);
    return *this;
  }
  /// The group of runs it belongs to. Default: for an array task (a sweep), `<job name>-<job id>`.
  Wandb& group(std::string name) {
    group_ = limited("group", std::move(name));
    return *this;
  }
  /// The kind of run ("train", "sft"). Default: none.
  Wandb& job_type(std::string name) {
    job_type_ = limited("job_type", std::move(name));
    return *this;
  }
  /// Tags shown beside the run. Default: none.
  Wandb& tags(std::vector<std::string> tags) {
    tags_ = std::move(tags);
    return *this;
  }
  /// A description of the run. Default: none.
  Wandb& notes(std::string text) {
    notes_ = std::move(text);
    return *this;
  }
  /// Online (streamed live, and written offline too), offline (written for `--wandb-sync`) or disabled, as wandb's
  /// `init(mode=...)`, which wins over WANDB_MODE. Default: automatic: WANDB_MODE, else online where an API key is
  /// found (WANDB_API_KEY, ~/.netrc), else offline.
  Wandb& mode(WandbMode mode) {
    mode_ = mode;
    return *this;
  }

  const std::string& project() const { return project_; }
  const std::string& entity() const { return entity_; }
  const std::string& name() const { return name_; }
  const std::string& group() const { return group_; }
  const std::string& job_type() const { return job_type_; }
  const std::vector<std::string>& tags() const { return tags_; }
  const std::string& notes() const { return notes_; }
  WandbMode mode() const { return mode_; }

 private:
  static std::string checked(std::string_view field, std::string value) {
    if (auto problem = detail::wandb_name_problem(value))
      throw SpecError(errors::spec_wandb, fmt::format("wandb.{} = \"{}\"", field, value), *problem);
    return value;
  }
  static std::string limited(std::string_view field, std::string value) {
    if (value.size() > 128)
      throw SpecError(errors::spec_wandb, fmt::format("wandb.{} = \"{}\"", field, value),
                      "must be at most 128 characters");
    return value;
  }

  std::string project_, entity_, name_, group_, job_type_, notes_;
  std::vector<std::string> tags_;
  WandbMode mode_ = WandbMode::automatic;
};

}  // namespace hpctrain
