#pragma once
// hpctrain's two error families (as CLI11 keeps them): the program described its job wrongly
// (SpecError, exit 2, raised while the description is built, before anything is written), or the world
// failed (RuntimeError: sbatch refused, a rendezvous timed out, a rank died). Every message starts with a
// stable id, `[hpctrain.spec.<field>]` or `[hpctrain.runtime.<what>]`, listed in docs/errors.md.
#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace hpctrain {

/// Exit codes of an hpctrain binary (DESIGN.md's command-line contract).
inline constexpr int exit_ok = 0;
/// A runtime failure: the world failed.
inline constexpr int exit_failure = 1;
/// Bad usage or an invalid job description; nothing was written or submitted.
inline constexpr int exit_usage = 2;
/// "Checkpointed, requeue me": workers exit with it after a pre-time-limit signal (EX_TEMPFAIL).
inline constexpr int exit_requeue = 75;

/// Base of every hpctrain error; `id()` is the stable id without brackets.
class Error : public std::runtime_error {
 public:
  Error(std::string id, const std::string& message)
      : std::runtime_error(fmt::format("[{}] {}", id, message)), id_(std::move(id)) {}
  const std::string& id() const noexcept { return id_; }

 private:
  std::string id_;
};

/// The job or training description is invalid: names the field and the offending value.
class SpecError : public Error {
 public:
  /// `[hpctrain.spec.<field>] <field> = <value>: <reason>`
  SpecError(std::string_view field, std::string_view value, std::string_view reason)
      : Error(fmt::format("hpctrain.spec.{}", field), fmt::format("{} = {}: {}", field, value, reason)),
        field_(field) {}
  const std::string& field() const noexcept { return field_; }

 private:
  std::string field_;
};

/// Bad command-line usage (unknown flag, malformed override): exit 2 like a SpecError.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error("hpctrain.usage", message) {}
};

/// The world failed: a command, a peer or the file system.
class RuntimeError : public Error {
 public:
  RuntimeError(std::string_view what, const std::string& message)
      : Error(fmt::format("hpctrain.runtime.{}", what), message) {}
};

namespace detail {
/// Throws SpecError(field, value, reason) unless `ok`; `value` is formatted with fmt.
template <class T>
void require(bool ok, std::string_view field, const T& value, std::string_view reason) {
  if (!ok) throw SpecError(field, fmt::format("{}", value), reason);
}
}  // namespace detail

}  // namespace hpctrain
