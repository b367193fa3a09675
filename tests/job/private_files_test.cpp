// What a submitted job leaves on a shared login node: nobody else may read it, and a secret (a variable
// declared with `secret_env`) is nowhere in it. docs/reliability.md says what counts as a secret.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>

#include <catch2/catch.hpp>

#include <hpctrain/job/process.hpp>
#include <hpctrain/job/submit.hpp>

#include "job_test_support.hpp"

namespace fs = std::filesystem;
namespace ht = hpctrain;

namespace {
// Runs `command` as the unprivileged user `nobody` (needs root; setpriv is util-linux).
ht::ProcessResult as_nobody(std::vector<std::string> command) {
  command.insert(command.begin(), {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"});
  return ht::run_process(command);
}

std::string canary_value() {
  std::random_device random;
  return fmt::format("hpctrain-canary-{:08x}{:08x}", random(), random());
}
}  // namespace

TEST_CASE("A submitted job's directory, script, record and log are private and hold no secret value",
          "[private][slurm]") {
  const auto dir = job_test::scratch_dir("private-files");
  fs::permissions(dir, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read |
                           fs::perms::others_exec);
  const std::string name = "private-probe";
  const std::string secret = canary_value();
  const auto submitted = job_test::run_probe(
      dir, {"--submit"},
      {{"PROBE_NAME", name}, {"PROBE_SECRET_NAME", "HPCTRAIN_TEST_CANARY"}, {"HPCTRAIN_TEST_CANARY", secret}});
  CAPTURE(submitted.out, submitted.err);
  REQUIRE(submitted.exit_code == 0);
  const auto id = job_test::submitted_id(submitted.out);
  REQUIRE_FALSE(id.empty());
  const auto state = job_test::wait_for_end(id);
  CHECK(state.state == "COMPLETED");

  const auto job_dir = dir / "hpctrain-jobs" / name / id;
  const auto log = job_dir / fmt::format("slurm-{}.out", id);
  REQUIRE(fs::exists(log));
  // The secret reached every rank (by length: the probe never prints it)...
  const auto log_text = job_test::read_file(log);
  CHECK(log_text.find(fmt::format("probe rank=0 secret HPCTRAIN_TEST_CANARY has {} bytes", secret.size())) !=
        std::string::npos);
  CHECK(log_text.find(fmt::format("probe rank=1 secret HPCTRAIN_TEST_CANARY has {} bytes", secret.size())) !=
        std::string::npos);
  // ...and no file the job left behind holds it, in the job directory or beside it (`last`).
  for (const auto& entry : fs::recursive_directory_iterator(dir / "hpctrain-jobs")) {
    if (!entry.is_regular_file()) continue;
    CAPTURE(entry.path());
    CHECK(job_test::read_file(entry.path()).find(secret) == std::string::npos);
  }

  // The job directory is the owner's alone: mode 0700 (the script and the record may hold pass_env and
  // --env values, the log whatever the program prints, and checkpoints under Slurm live here too).
  struct stat info {};
  REQUIRE(::stat(job_dir.c_str(), &info) == 0);
  CHECK((info.st_mode & 0777) == 0700);
  CHECK(info.st_uid == ::geteuid());

  if (::geteuid() != 0) {
    WARN("not root: cannot check as another user; the mode check above stands");
    return;
  }
  // The oracle: another user. The control proves that user reaches the directory above the job's...
  if (as_nobody({"ls", (dir / "hpctrain-jobs" / name).string()}).exit_code != 0) {
    WARN("user nobody cannot reach " << (dir / "hpctrain-jobs" / name)
                                     << " (umask or parent directories): only the mode was checked");
    return;
  }
  // ...and the job's own directory, script, record and log are closed to them.
  CHECK(as_nobody({"ls", job_dir.string()}).exit_code != 0);
  for (const auto& file : {job_dir / "job.sbatch", job_dir / "job.json", log}) {
    CAPTURE(file);
    CHECK(as_nobody({"cat", file.string()}).exit_code != 0);
  }
}
