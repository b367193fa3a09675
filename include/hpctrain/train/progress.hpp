#pragma once
// Rank 0's progress line: step/total, loss, lr, samples/s, ETA. On a terminal it redraws one line with a
// bar; in a Slurm log file (not a TTY) it prints one line per log interval, which `tail -f` and grep like.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <unistd.h>  // isatty

namespace hpctrain {

namespace detail {
/// "1h02m", "3m07s", "12s".
inline std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "?";
  const auto s = static_cast<long>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}
}  // namespace detail

/// One progress report.
struct ProgressReport {
  std::int64_t step = 0, total_steps = 0, epoch = 0;
  double loss = 0, lr = 0, samples_per_second = 0, eta_seconds = 0;
};

/// The text of a progress line (without the bar).
inline std::string format_progress(const ProgressReport& r) {
  return fmt::format("step {}/{} epoch {} loss {:.4f} lr {:.3e} {:.0f} samples/s eta {}", r.step, r.total_steps,
                     r.epoch, r.loss, r.lr, r.samples_per_second, detail::format_duration(r.eta_seconds));
}

/// Prints progress lines to `stream` (stdout by default): a redrawn bar on a TTY, plain lines otherwise.
class Progress {
 public:
  /// `allow_bar` false forces plain lines: under srun --unbuffered a task's stdout is a pty although it
  /// ends up in the job's log file.
  explicit Progress(std::FILE* stream = stdout, bool allow_bar = true)
      : stream_(stream), tty_(allow_bar && ::isatty(::fileno(stream)) == 1) {}

  /// Reports `report`, followed by `extra` (further values, " 1234 tokens/s"); on a TTY the line is redrawn in place.
  void report(const ProgressReport& r, const std::string& extra = {}) {
    if (tty_) {
      constexpr int width = 24;
      const int filled = r.total_steps > 0 ? static_cast<int>(width * r.step / r.total_steps) : 0;
      fmt::print(stream_, "\r[{:<{}}] {}{}\x1b[K", std::string(static_cast<std::size_t>(filled), '#'), width,
                 format_progress(r), extra);
      pending_newline_ = true;
    } else {
      fmt::print(stream_, "{}{}\n", format_progress(r), extra);
    }
    std::fflush(stream_);
  }
  /// Prints a full line (an evaluation, a message), ending a redrawn bar first.
  void line(const std::string& text) {
    if (pending_newline_) fmt::print(stream_, "\n");
    pending_newline_ = false;
    fmt::print(stream_, "{}\n", text);
    std::fflush(stream_);
  }

 private:
  std::FILE* stream_;
  bool tty_;
  bool pending_newline_ = false;
};

}  // namespace hpctrain
