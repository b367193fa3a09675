// ht::FileLogger (train/loggers/logger.hpp), the base of a logger that writes one file of the run directory: a fresh
// run writes the header, a requeued or resumed run (the same directory, started again) appends without it, and a file
// that cannot be opened is an error naming it.
#include <cstdlib>
#include <filesystem>
#include <string>

#include <catch2/catch.hpp>

#include <hpctrain/files.hpp>
#include <hpctrain/train/loggers/logger.hpp>

namespace {

std::filesystem::path file_logger_scratch(const std::string& name) {
  const char* build = std::getenv("HPCTRAIN_BUILD_DIR");
  const auto dir = std::filesystem::path(build ? build : "/tmp") / "test-scratch" / "loggers" / name;
  hpctrain::detail::remove_tree(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

/// The example's logger: `step,loss` per train record.
struct StepLoss : hpctrain::FileLogger {
  StepLoss() : FileLogger("curve.csv", "step,loss") {}
  void log(const hpctrain::LogRecord& record) override {
    if (record.phase == "train") file() << record.step << "," << *record.get("loss") << "\n";
  }
};

/// One run of `logger` in `run_dir`: start, a train and an eval record at `step`, finish.
void run_once(const std::filesystem::path& run_dir, std::int64_t step) {
  StepLoss logger;
  hpctrain::RunInfo info;
  info.run_dir = run_dir;
  logger.start(info);
  logger.log({step, "train", {{"loss", 1.5}}});
  logger.log({step, "eval", {{"loss", 9.0}}});
  logger.finish();
}

}  // namespace

TEST_CASE("A FileLogger writes its header once: a resumed run appends to the same file", "[loggers]") {
  const auto dir = file_logger_scratch("file-logger");
  run_once(dir, 10);
  CHECK(hpctrain::detail::read_file(dir / "curve.csv") == "step,loss\n10,1.5\n");
  run_once(dir, 20);  // the requeued job starts its loggers again in the same run directory
  CHECK(hpctrain::detail::read_file(dir / "curve.csv") == "step,loss\n10,1.5\n20,1.5\n");
}

TEST_CASE("A FileLogger whose file cannot be opened names it", "[loggers]") {
  const auto dir = file_logger_scratch("file-logger-unopenable");
  std::filesystem::create_directories(dir / "curve.csv");  // a directory where the file should be
  StepLoss logger;
  hpctrain::RunInfo info;
  info.run_dir = dir;
  CHECK_THROWS_WITH(logger.start(info),
                    "[hpctrain.runtime.io] cannot open " + (dir / "curve.csv").string() + " for appending");
}
