#pragma once
// Preemption: Slurm sends USR2 (`srun --signal=USR2@grace`, USR2 because NCCL may use USR1) before the
// time limit. The handler only sets a flag — nothing else is async-signal-safe; the loop reads the flag at
// the next step boundary, the ranks agree (any_rank), checkpoint together and exit with exit_requeue.
#include <atomic>
#include <csignal>

namespace hpctrain {

namespace detail {
inline std::atomic<bool>& preemption_flag() {
  static std::atomic<bool> flag{false};
  static_assert(std::atomic<bool>::is_always_lock_free, "the signal handler needs a lock-free flag");
  return flag;
}
inline void on_preemption_signal(int) { preemption_flag().store(true, std::memory_order_relaxed); }
}  // namespace detail

/// Installs the USR2 handler (idempotent) and clears the flag.
inline void install_preemption_handler(int signal_number = SIGUSR2) {
  detail::preemption_flag().store(false);
  struct sigaction action {};
  action.sa_handler = detail::on_preemption_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // collectives and file I/O in flight carry on; the loop polls the flag
  sigaction(signal_number, &action, nullptr);
}

/// Whether a preemption signal arrived since the handler was installed.
inline bool preemption_requested() { return detail::preemption_flag().load(std::memory_order_relaxed); }

}  // namespace hpctrain
