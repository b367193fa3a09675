#pragma once
// Preemption: two signals mean "checkpoint and come back later".
// - Before the time limit Slurm sends the job's requeue signal (`srun --signal=USR2@grace`; USR2 by default
//   because NCCL may use USR1; `Job::requeue_signal` changes it and the script names it in
//   HPCTRAIN_PREEMPT_SIGNAL).
// - A preempting partition (`PreemptType=preempt/partition_prio`) sends SIGTERM, then SIGKILL after the
//   partition's GraceTime. So SIGTERM counts too.
// The handler only sets a flag — nothing else is async-signal-safe; the loop reads the flag at the next step
// boundary, the ranks agree (a vote read a step later: dist::LaggedSum), checkpoint together and exit with
// exit_requeue. Once they agreed, the loop sets SIGTERM to SIG_IGN (srun --kill-on-bad-exit SIGTERMs the ranks
// still writing): that replaces this handler and keeps working.
//
// SIGTERM also comes from srun tearing a step down after one rank failed (--kill-on-bad-exit), and then the
// ranks cannot agree: a peer is gone. A collective with a dead peer fails at once on Gloo (the exception ends
// the rank), but may wait for the process group's timeout (minutes) on NCCL or when a peer hangs. So after a
// SIGTERM a watchdog thread watches the loop's progress: while steps complete, the ranks are on their way to
// the agreement (a preemption); when none completes for PreemptionSettings::termination_stall and they have not agreed,
// the rank is stuck behind a failed peer, and it exits 143 (128 + SIGTERM) with a message saying so.
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>

#include <hpctrain/names.hpp>

namespace hpctrain {

namespace detail {
inline std::atomic<bool>& preemption_flag() {
  static std::atomic<bool> flag{false};
  static_assert(std::atomic<bool>::is_always_lock_free, "the signal handler needs a lock-free flag");
  return flag;
}
inline void on_preemption_signal(int) { preemption_flag().store(true, std::memory_order_relaxed); }

/// What the termination watchdog reads: whether SIGTERM came, whether the ranks agreed since, the loop's
/// progress (steps completed), and its settings (the stall bound, the rank it names; -1: unknown).
struct TerminationWatch {
  std::atomic<bool> terminated{false};
  std::atomic<bool> agreed{false};
  std::atomic<std::int64_t> progress{0};
  std::atomic<bool> started{false};
  std::atomic<std::int64_t> stall_ms{30000};
  std::atomic<int> rank{-1};
};
inline TerminationWatch& termination_watch() {
  static TerminationWatch watch;
  return watch;
}
inline void on_termination_signal(int) {
  preemption_flag().store(true, std::memory_order_relaxed);
  termination_watch().terminated.store(true, std::memory_order_relaxed);
}

/// The watchdog (one per process, detached): idle until SIGTERM, then exits the process when the loop makes no
/// progress for the stall timeout and the ranks have not agreed to checkpoint.
inline void start_termination_watchdog() {
  auto& watch = termination_watch();
  if (watch.started.exchange(true)) return;
  std::thread([&watch] {
    using clock = std::chrono::steady_clock;
    while (!watch.terminated.load(std::memory_order_relaxed))
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto stall = std::chrono::milliseconds(watch.stall_ms.load());
    auto progress = watch.progress.load();
    auto since = clock::now();
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (watch.agreed.load()) return;  // a preemption: the checkpoint has the partition's GraceTime
      if (const auto now_progress = watch.progress.load(); now_progress != progress) {
        progress = now_progress;
        since = clock::now();
      } else if (clock::now() - since >= stall) {
        const int known = watch.rank.load();
        const std::string rank = known >= 0 ? std::to_string(known) : "?";
        std::fprintf(stderr,
                     "rank %s: SIGTERM, then no step completed for %lld ms and the ranks did not agree to checkpoint: "
                     "a peer is gone (srun tears the step down after a failed rank); exiting 143 without a "
                     "checkpoint\n",
                     rank.c_str(), static_cast<long long>(stall.count()));
        std::fflush(stderr);
        std::_Exit(128 + SIGTERM);
      }
    }
  }).detach();
}

inline void set_preemption_handler(int signal_number) {
  struct sigaction action {};
  action.sa_handler = signal_number == SIGTERM ? on_termination_signal : on_preemption_signal;
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

/// What a rank's preemption handling is given by its launcher: the job's requeue signal and how long the
/// watchdog waits for a step after a SIGTERM.
struct PreemptionSettings {
  int signal = SIGUSR2;  ///< HPCTRAIN_PREEMPT_SIGNAL (the script names Job::requeue_signal), else SIGUSR2
  std::chrono::milliseconds termination_stall{std::chrono::seconds(30)};  ///< HPCTRAIN_TERM_STALL_SECONDS, else 30 s
};

/// The settings `environment` (the rank's) gives; a stall bound that is not a number of seconds above 0 is ignored.
inline PreemptionSettings preemption_settings(const Environment& environment) {
  PreemptionSettings settings;
  if (const auto name = environment.get(env::preempt_signal)) settings.signal = signal_from_name(*name);
  if (const auto text = environment.get(env::term_stall_seconds)) {
    char* end = nullptr;
    const double seconds = std::strtod(text->c_str(), &end);
    if (end != text->c_str() && *end == '\0' && seconds > 0)
      settings.termination_stall = std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
  }
  return settings;
}

/// Installs the handler for `signal_number` (idempotent) and clears the flag.
inline void install_preemption_handler(int signal_number) {
  detail::preemption_flag().store(false);
  detail::set_preemption_handler(signal_number);
}

/// Installs the handler for the job's requeue signal (`settings.signal`) and for SIGTERM (preemption by a
/// higher-priority partition), and clears the flag; the watchdog names `rank`.
inline void install_preemption_handler(const PreemptionSettings& settings, int rank) {
  install_preemption_handler(settings.signal);
  detail::termination_watch().stall_ms.store(settings.termination_stall.count());
  detail::termination_watch().rank.store(rank);
  detail::termination_watch().terminated.store(false);
  detail::termination_watch().agreed.store(false);
  detail::set_preemption_handler(SIGTERM);
  detail::start_termination_watchdog();
}

/// The loop completed a step: after a SIGTERM, progress tells a preemption on its way to the agreement from a
/// rank stuck behind a failed peer (the watchdog above). One relaxed atomic increment.
inline void note_training_progress() { detail::termination_watch().progress.fetch_add(1, std::memory_order_relaxed); }

/// The ranks agreed to checkpoint for a preemption: the watchdog stands down.
inline void note_preemption_agreed() { detail::termination_watch().agreed.store(true); }

/// Whether a preemption signal arrived since the handler was installed.
inline bool preemption_requested() { return detail::preemption_flag().load(std::memory_order_relaxed); }

}  // namespace hpctrain
