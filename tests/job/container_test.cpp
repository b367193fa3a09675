// Container end-to-end: the probe runs inside Charliecloud's ch-run, under srun, on both local nodes.
// The image is built here: a directory with the mount points ch-run needs, the host's /usr bound in.
#include <filesystem>

#include <pwd.h>
#include <unistd.h>

#include <hpctrain/job/process.hpp>
#include <hpctrain/job/submit.hpp>

#include <catch2/catch.hpp>

#include "job_test_support.hpp"

namespace fs = std::filesystem;
namespace ht = hpctrain;

namespace {
/// A minimal Charliecloud image: ch-run binds /etc/passwd and /etc/group and needs the usual mount
/// points; /bin, /lib and /lib64 point into /usr as on the host (Debian's merged /usr).
fs::path build_image(const fs::path& root, const std::vector<fs::path>& mount_points) {
  for (const auto* dir : {"usr", "proc", "dev", "sys", "tmp", "etc", "home", "root", "mnt", "run", "var/tmp"})
    fs::create_directories(root / dir);
  for (const auto* file : {"etc/passwd", "etc/group", "etc/hosts", "etc/resolv.conf"})
    job_test::write_file(root / file, "");
  fs::create_directory_symlink("usr/bin", root / "bin");
  fs::create_directory_symlink("usr/lib", root / "lib");
  fs::create_directory_symlink("usr/lib64", root / "lib64");
  for (const auto& point : mount_points) fs::create_directories(root / point.relative_path());
  // The image's own environment (what `ch-run --set-env` would apply) sets a variable the job sets too.
  fs::create_directories(root / "ch");
  job_test::write_file(root / "ch" / "environment", "PROBE_ENV_WINS=image\n");
  return root;
}
}  // namespace

TEST_CASE("A Charliecloud job runs the binary inside ch-run under srun on both nodes", "[container][slurm]") {
  const auto dir = job_test::scratch_dir("charliecloud");
  const auto work = dir / "work";
  fs::create_directories(work);
  const auto image = build_image(dir / "image", {fs::path(job_test::probe()).parent_path(), work});
  const char* user = std::getenv("USER");
  const std::string user_name = user ? user : ::getpwuid(::getuid())->pw_name;  // ch-run requires $USER
  const std::vector<std::pair<std::string, std::string>> env = {
      {"PROBE_NAME", "charliecloud"}, {"PROBE_CHARLIECLOUD", image.string()}, {"USER", user_name}};

  const auto dry = job_test::run_probe(work, {"--dry-run"}, env);
  REQUIRE(dry.exit_code == 0);
  CHECK(dry.out.find(fmt::format("ch-run -b /usr:/usr -b {0}:{0} -b {1}:{1} --cd {1} {2} -- \\\n",
                                 fs::path(job_test::probe()).parent_path().string(), work.string(), image.string())) !=
        std::string::npos);

  const auto submitted = job_test::run_probe(work, {"--submit", "--env", "PROBE_ENV_WINS=job", "in", "container"}, env);
  CAPTURE(submitted.err);
  REQUIRE(submitted.exit_code == 0);
  const auto id = job_test::submitted_id(submitted.out);
  const auto state = job_test::wait_for_end(id);
  const auto log = job_test::read_file(work / "hpctrain-jobs" / "charliecloud" / id / fmt::format("slurm-{}.out", id));
  CAPTURE(log);
  CHECK(state.state == "COMPLETED");
  // ch-run sets CH_RUNNING inside the container (0.31 sets it to "Weird Al Yankovic"); the probe reports it.
  CHECK(log.find(fmt::format("probe rank=0 ntasks=2 node=n1 nodeid=0 localid=0 job={} container=ch-run", id)) !=
        std::string::npos);
  CHECK(log.find(fmt::format("probe rank=1 ntasks=2 node=n2 nodeid=1 localid=0 job={} container=ch-run", id)) !=
        std::string::npos);
  CHECK(log.find(fmt::format("probe rank=1 arg1={}\n", job_test::hex("container"))) != std::string::npos);
  // The job's variable wins over the image's environment inside the container, on every rank.
  for (const auto* rank : {"0", "1"})
    CHECK(log.find(fmt::format("probe rank={} env PROBE_ENV_WINS={}\n", rank, job_test::hex("job"))) !=
          std::string::npos);
}
