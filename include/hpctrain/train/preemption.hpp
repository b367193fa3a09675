#pragma once
// Preemption: two signals mean "checkpoint and come back later".
// - Before the time limit Slurm sends the job's requeue signal (`srun --signal=USR2@grace`; USR2 by default
//   because NCCL may use USR1; `Job::requeue_signal` changes it and the script names it in
//   HPCTRAIN_PREEMPT_SIGNAL).
// - A preempting partition (`PreemptType=preempt/partition_prio`) sends SIGTERM, then SIGKILL after the
//   partition's GraceTime. So SIGTERM counts too.
// The handler only sets a flag — nothing else is async-signal-safe; the loop reads the flag at the next step
// boundary, the ranks agree (any_rank), checkpoint together and exit with exit_requeue. Once they agreed,
// the loop sets SIGTERM to SIG_IGN (srun --kill-on-bad-exit SIGTERMs the ranks still writing): that
// replaces this handler and keeps working.
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <string_view>

namespace hpctrain {

/// The variable the generated script sets to the requeue signal's name (USR2, USR1, URG, ...).
inline constexpr std::string_view preempt_signal_variable = "HPCTRAIN_PREEMPT_SIGNAL";

namespace detail {
inline std::atomic<bool>& preemption_flag() {
  static std::atomic<bool> flag{false};
  static_assert(std::atomic<bool>::is_always_lock_free, "the signal handler needs a lock-free flag");
  return flag;
}
inline void on_preemption_signal(int) { preemption_flag().store(true, std::memory_order_relaxed); }

inline void set_preemption_handler(int signal_number) {
  struct sigaction action {};
  action.sa_handler = on_preemption_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // collectives and file I/O in flight carry on; the loop polls the flag
  sigaction(signal_number, &action, nullptr);
}
}  // namespace detail

/// A signal number from its Slurm name (`USR2`, `SIGUSR2`, `TERM`...); SIGUSR2 for a name it does not know.
inline int signal_from_name(std::string_view name) {
  if (name.starts_with("SIG")) name.remove_prefix(3);
  if (name == "USR1") return SIGUSR1;
  if (name == "USR2") return SIGUSR2;
  if (name == "TERM") return SIGTERM;
  if (name == "INT") return SIGINT;
  if (name == "HUP") return SIGHUP;
  if (name == "ALRM") return SIGALRM;
  if (name == "URG") return SIGURG;
  return SIGUSR2;
}

/// The requeue signal the script names (HPCTRAIN_PREEMPT_SIGNAL), else SIGUSR2.
inline int preemption_signal_from_environment() {
  const char* name = std::getenv(preempt_signal_variable.data());
  return name != nullptr ? signal_from_name(name) : SIGUSR2;
}

/// Installs the handler for `signal_number` (idempotent) and clears the flag.
inline void install_preemption_handler(int signal_number) {
  detail::preemption_flag().store(false);
  detail::set_preemption_handler(signal_number);
}

/// Installs the handler for the job's requeue signal (HPCTRAIN_PREEMPT_SIGNAL, default USR2) and for SIGTERM
/// (preemption by a higher-priority partition), and clears the flag.
inline void install_preemption_handler() {
  install_preemption_handler(preemption_signal_from_environment());
  detail::set_preemption_handler(SIGTERM);
}

/// Whether a preemption signal arrived since the handler was installed.
inline bool preemption_requested() { return detail::preemption_flag().load(std::memory_order_relaxed); }

}  // namespace hpctrain
