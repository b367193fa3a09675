#include <functional>

#include <hpctrain/job/job.hpp>
#include <hpctrain/job/render.hpp>

#include <catch2/catch.hpp>

#include "job_test_support.hpp"

using namespace hpctrain::literals;
using namespace std::chrono_literals;
namespace ht = hpctrain;

namespace {
std::string spec_error_of(const std::function<void()>& build) {
  try {
    build();
  } catch (const ht::SpecError& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("An invalid description fails while it is built, naming the field and the value", "[spec]") {
  using Build = std::function<void()>;
  auto [what, build, message] = GENERATE(table<std::string, Build, std::string>({
      {"zero nodes", [] { ht::Job("a").nodes(0); }, "[hpctrain.spec.nodes] nodes = 0: must be at least 1"},
      {"non-positive time", [] { ht::Job("a").time(0s); }, "[hpctrain.spec.time] time = 0s: must be positive"},
      {"negative time", [] { ht::Job("a").time(-5min); }, "[hpctrain.spec.time] time = -300s: must be positive"},
      {"empty partition", [] { ht::Job("a").partition(""); },
       "[hpctrain.spec.partition] partition = \"\": must not be empty"},
      {"GPU type with no count", [] { ht::Job("a").gpus_per_node(std::string_view("a100")); },
       "[hpctrain.spec.gpus_per_node] gpus_per_node = a100: a GPU type needs a count (a100:4)"},
      {"GPU type with a zero count", [] { ht::Job("a").gpus_per_node("a100", 0); },
       "[hpctrain.spec.gpus_per_node] gpus_per_node = a100: a GPU type needs a count (a100:4)"},
      {"empty name", [] { ht::Job(""); }, "[hpctrain.spec.name] name = \"\": must not be empty"},
      {"name with a newline", [] { ht::Job("a\nb"); },
       "[hpctrain.spec.name] name = a\nb: an #SBATCH value cannot hold a newline or NUL"},
      {"zero tasks per node", [] { ht::Job("a").tasks_per_node(0); },
       "[hpctrain.spec.tasks_per_node] tasks_per_node = 0: must be at least 1"},
      {"zero cpus per task", [] { ht::Job("a").cpus_per_task(0); },
       "[hpctrain.spec.cpus_per_task] cpus_per_task = 0: must be at least 1"},
      {"both memory kinds", [] { ht::Job("a").memory(4_GiB).memory_per_gpu(2_GiB); },
       "[hpctrain.spec.memory_per_gpu] memory_per_gpu = 2G: memory (per node) is already set; pick one"},
      {"bad env name", [] { ht::Job("a").env("1X", "v"); },
       "[hpctrain.spec.env] env = 1X: an environment variable name is [A-Za-z_][A-Za-z0-9_]*"},
      {"bad mail type", [] { ht::Job("a").mail("me@x", {"SOMETIMES"}); },
       "[hpctrain.spec.mail_type] mail_type = SOMETIMES: expected BEGIN, END, FAIL, REQUEUE, ALL, "
       "TIME_LIMIT[_50|_80|_90]..."},
      {"relative chdir", [] { ht::Job("a").chdir("work"); },
       "[hpctrain.spec.chdir] chdir = work: must be an absolute path"},
      {"dependency that is not a job id", [] { ht::Job("a").after("12;rm"); },
       "[hpctrain.spec.dependency] dependency = 12;rm: expected a job id"},
      {"requeue grace of zero", [] { ht::Job("a").requeue_on_timeout(0s); },
       "[hpctrain.spec.requeue_on_timeout] requeue_on_timeout = 0s: the grace must be between 1 s and 65535 s "
       "(srun --signal)"},
      {"pyxis mount with a comma", [] { ht::Job("a").container(ht::Pyxis("ubuntu:22.04")).mount("/data,x", "/d"); },
       "[hpctrain.spec.mount] mount = /data,x: pyxis separates mounts with ',' and fields with ':', so a path "
       "cannot hold them"},
      {"apptainer mount with a colon", [] { ht::Job("a").mount("/a:b", "/d").container(ht::Apptainer("x.sif")); },
       "[hpctrain.spec.mount] mount = /a:b: apptainer separates mounts with ',' and fields with ':', so a path "
       "cannot hold them"},
      {"charliecloud read-only mount",
       [] { ht::Job("a").container(ht::Charliecloud("/img")).mount("/data", "/data", ht::read_only); },
       "[hpctrain.spec.mount] mount = /data: ch-run -b cannot make a bind mount read-only"},
      {"relative mount", [] { ht::Job("a").container(ht::Charliecloud("/img")).mount("data", "/data"); },
       "[hpctrain.spec.mount] mount = data: mount paths must be absolute"},
      {"relative squashfs image", [] { ht::Pyxis("images/pytorch.sqsh"); },
       "[hpctrain.spec.container.image] container.image = images/pytorch.sqsh: a squashfs path must start with / "
       "or ./ (pyxis reads anything else as a registry reference)"},
      {"sbatch option with dashes", [] { ht::Job("a").sbatch_option("--mem", "1G"); },
       "[hpctrain.spec.sbatch_option] sbatch_option = --mem: expected an option name without dashes"},
  }));
  CAPTURE(what);
  CHECK(spec_error_of(build) == message);
}

TEST_CASE("Checks across fields fail before anything is rendered", "[spec]") {
  const auto context = job_test::fixed_context();
  using Build = std::function<ht::Job()>;
  auto [what, build, message] = GENERATE(table<std::string, Build, std::string>({
      {"memory per GPU without GPUs", [] { return ht::Job("a").memory_per_gpu(8_GiB); },
       "[hpctrain.spec.memory_per_gpu] memory_per_gpu = 8G: needs gpus_per_node"},
      {"grace longer than the limit", [] { return ht::Job("a").time(1min).requeue_on_timeout(2min); },
       "[hpctrain.spec.requeue_on_timeout] requeue_on_timeout = 120s: the grace must be shorter than the time "
       "limit (0-00:01:00)"},
      {"mounts without a container", [] { return ht::Job("a").mount("/data", "/data"); },
       "[hpctrain.spec.mount] mount = /data: mounts need a container"},
      {"pass_env of an unset variable", [] { return ht::Job("a").pass_env("NOT_SET_ANYWHERE"); },
       "[hpctrain.spec.env] env = NOT_SET_ANYWHERE: is not set in the submitting environment (pass_env)"},
  }));
  CAPTURE(what);
  CHECK(spec_error_of([&] { ht::render_sbatch(build(), context); }) == message);
}

TEST_CASE("Tasks per node default to GPUs per node, else one", "[spec]") {
  CHECK(ht::Job("a").tasks_per_node() == 1);
  CHECK(ht::Job("a").gpus_per_node(4).tasks_per_node() == 4);
  CHECK(ht::Job("a").gpus_per_node(std::string_view("a100:8")).tasks_per_node() == 8);
  CHECK(ht::Job("a").gpus_per_node(4).tasks_per_node(1).tasks_per_node() == 1);
}

TEST_CASE("The enroot import helper prepares a squashfs from a registry reference", "[container]") {
  CHECK(ht::enroot_import_command("nvcr.io#nvidia/pytorch:24.05-py3", "./pytorch.sqsh") ==
        std::vector<std::string>{"enroot", "import", "-o", "./pytorch.sqsh",
                                 "docker://nvcr.io#nvidia/pytorch:24.05-py3"});
}

TEST_CASE("The binary's directory and the working directory are mounted unless the user opts out", "[container]") {
  const auto context = job_test::fixed_context();
  auto job = ht::Job("a").container(ht::Charliecloud("/img"));
  const auto script = ht::render_sbatch(job, context);
  CHECK(script.find("ch-run -b /home/user/project/build:/home/user/project/build -b "
                    "/home/user/project:/home/user/project --cd /home/user/project /img --") != std::string::npos);
  const auto opted_out = ht::render_sbatch(job.mount_program(false), context);
  CHECK(opted_out.find("ch-run --cd /home/user/project /img --") != std::string::npos);
}

TEST_CASE("An image reference with '#' never lands on an #SBATCH line", "[container]") {
  const auto script = ht::render_sbatch(ht::Job("a").container(ht::Pyxis("nvcr.io#nvidia/pytorch:24.05-py3")),
                                        job_test::fixed_context());
  std::istringstream lines(script);
  for (std::string line; std::getline(lines, line);) {
    CAPTURE(line);
    if (line.starts_with("#SBATCH")) CHECK(line.find("nvcr.io") == std::string::npos);
  }
  CHECK(script.find("'--container-image=nvcr.io#nvidia/pytorch:24.05-py3'") != std::string::npos);
}
