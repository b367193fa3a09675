#pragma once
// hpctrain's two error families (as CLI11 keeps them): the program described its job wrongly
// (SpecError, exit 2, raised while the description is built, before anything is written), or the world
// failed (RuntimeError: sbatch refused, a rendezvous timed out, a rank died). Every message starts with a
// stable id, `[hpctrain.spec.<field>]` or `[hpctrain.runtime.<what>]`, listed in docs/errors.md.
#include <cstdio>
#include <exception>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include <hpctrain/error_ids.hpp>

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
  Error(ErrorId id, const std::string& message) : Error(std::string(id.str()), message) {}
  const std::string& id() const noexcept { return id_; }
  /// The exit code of a program this error ends (DESIGN.md's contract): exit_failure, the world failed.
  virtual int exit_code() const noexcept { return exit_failure; }

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
  /// `[<id>] <subject>: <reason>`, for ids that are not one description field (`hpctrain.spec.knob`).
  SpecError(ErrorId id, std::string_view subject, std::string_view reason)
      : Error(id, fmt::format("{}: {}", subject, reason)),
        field_(id.str().substr(std::string_view("hpctrain.spec.").size())) {}
  /// The same error with `where` (a file) before its message: `[<id>] <where>: <message>`.
  SpecError(const SpecError& error, std::string_view where)
      : Error(error.id(), fmt::format("{}: {}", where, std::string_view(error.what()).substr(error.id().size() + 3))),
        field_(error.field()) {}
  const std::string& field() const noexcept { return field_; }
  /// exit_usage: the description is wrong, nothing was written or queued.
  int exit_code() const noexcept override { return exit_usage; }

 private:
  std::string field_;
};

/// Bad command-line usage (unknown flag, malformed override): exit 2 like a SpecError.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error(errors::usage, message) {}
  /// exit_usage, as a SpecError.
  int exit_code() const noexcept override { return exit_usage; }
};

/// The world failed: a command, a peer or the file system.
class RuntimeError : public Error {
 public:
  /// `[<id>] <message>`: `RuntimeError(errors::runtime_sbatch, "...")`.
  RuntimeError(ErrorId id, const std::string& message) : Error(id, message) {}

 protected:
  /// `cause`'s id with another message: a subclass that raises an error again (train/strategies/strategy.hpp's
  /// CheckpointRefused).
  RuntimeError(const Error& cause, const std::string& message) : Error(cause.id(), message) {}
};

namespace detail {
/// Throws SpecError(field, value, reason) unless `ok`; `value` is formatted with fmt.
template <class T>
void require(bool ok, std::string_view field, const T& value, std::string_view reason) {
  if (!ok) throw SpecError(field, fmt::format("{}", value), reason);
}
/// The same with a named id: `require(n >= 1, errors::spec_nodes, n, "must be at least 1")`.
template <class T>
void require(bool ok, ErrorId id, const T& value, std::string_view reason) {
  if (!ok)
    throw SpecError(id.str().substr(std::string_view("hpctrain.spec.").size()), fmt::format("{}", value), reason);
}
}  // namespace detail

/// The one place an exception becomes an exit code: its own (`Error::exit_code`: 2 for a SpecError or
/// UsageError, 1 for a RuntimeError), and exit_failure for any other exception (LibTorch's c10::Error, std::).
/// Every catch that ends a program, a command or a rank asks it: with_exit_codes (the login commands and the
/// worker dispatch, job/cli.hpp), run(), the workers (train/worker.hpp) and the terminate handler
/// (job/spec_error_exit.hpp).
inline int exit_code_of(const std::exception& error) noexcept {
  const auto* ours = dynamic_cast<const Error*>(&error);
  return ours != nullptr ? ours->exit_code() : exit_failure;
}

/// Runs `body` — a tool's work once its command line is parsed (models/generation/generate_tool.hpp,
/// examples/fill_mask.cpp) — and keeps the command-line contract for what it throws: the message on stderr, then its
/// exit_code_of. Programs built on hpctrain::run get this from run().
template <class Body>
int with_exit_codes(Body&& body) {
  try {
    return body();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s\n", error.what());
    return exit_code_of(error);
  }
}

/// The same, the message written to `err` (the login commands print to the streams they are given).
template <class Body>
int with_exit_codes(std::ostream& err, Body&& body) {
  try {
    return body();
  } catch (const std::exception& error) {
    err << error.what() << "\n";
    return exit_code_of(error);
  }
}

}  // namespace hpctrain
