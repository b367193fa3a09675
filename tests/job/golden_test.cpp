// Renders representative jobs and compares them byte for byte with tests/golden/*.sbatch.
// After an intended change: HPCTRAIN_UPDATE_GOLDEN=1 build-x/tests/test_job "[golden]", then read the diff.
#include <cstdlib>
#include <functional>

#include <hpctrain/job/job.hpp>
#include <hpctrain/job/process.hpp>
#include <hpctrain/job/render.hpp>

#include <catch2/catch.hpp>

#include "job_test_support.hpp"

using namespace hpctrain::literals;
using namespace std::chrono_literals;
namespace ht = hpctrain;

namespace {
struct Golden {
  std::string file;
  std::function<ht::Job()> job;
  bool runs_on_local_cluster;  ///< sbatch --test-only must accept it here
  ht::SiteSettings site = {};  ///< the site file's settings it is rendered with
};

/// An AWS cluster's site file: EFA, the bootstrap kept off docker's and the loopback interfaces, what
/// all_reduce_perf measured there, longer rendezvous and checkpoint timeouts for a large job.
ht::SiteSettings efa_site() {
  ht::SiteSettings site;
  site.fabric.fabric = ht::Fabric::efa;
  site.fabric.source = "/etc/hpctrain/site.conf:3";
  site.fabric.socket_ifname = "^docker,lo";
  site.fabric.expected_busbw_gbps = 40;
  site.cores_per_node = 192;  // p5.48xlarge: 192 vCPUs, 24 per GPU's task
  site.rendezvous_timeout_s = 600;
  site.checkpoint_timeout_s = 1800;
  return site;
}

/// An InfiniBand cluster's site file: four adapters per node, IP over IB for the bootstrap.
ht::SiteSettings infiniband_site() {
  ht::SiteSettings site;
  site.fabric.fabric = ht::Fabric::infiniband;
  site.fabric.source = "/home/user/.config/hpctrain/site.conf:1";
  site.fabric.ib_hca = "mlx5_0,mlx5_1,mlx5_2,mlx5_3";
  site.fabric.socket_ifname = "ib0";
  return site;
}

std::vector<Golden> goldens() {
  return {
      // The multi-node job of torchrun practice: 2 nodes x 8 GPUs, one task per node, 32 CPUs each (hpctrain, one
      // rank per task, warns in the script that 7 GPUs per node would stay idle).
      {"multinode.sbatch",
       [] {
         return ht::Job("multinode")
             .nodes(2)
             .tasks_per_node(1)
             .cpus_per_task(32)
             .gpus_per_node(8)
             .time(10min)
             .account("proj42")
             .partition("gpu")
             .output("%j.out")
             .error("%j.err");
       },
       false},
      {"pyxis.sbatch",
       [] {
         return ht::Job("fashion")
             .nodes(2)
             .time(30min)
             .partition("debug")
             .container(ht::Pyxis("nvcr.io#nvidia/pytorch:24.05-py3").mount_home(false))
             .mount("/lustre/datasets", "/data", ht::read_only)
             .env("NCCL_DEBUG", "WARN");
       },
       true},
      {"apptainer.sbatch",
       [] {
         return ht::Job("apptainer-run")
             .nodes(1)
             .gpus_per_node("a100", 4)
             .cpus_per_task(8)
             .memory_per_gpu(32_GiB)
             .time(2h)
             .container(ht::Apptainer("/images/pytorch.sif"))
             .mount("/scratch/me", "/scratch")
             .mount("/datasets", "/data", ht::read_only)
             .module("cuda/12.4")
             .setup("ulimit -n 4096");
       },
       false},
      {"requeue.sbatch",
       [] {
         return ht::Job("long-run")
             .nodes(2)
             .time(4h)
             .partition("debug")
             .memory(2_GiB)
             .requeue_on_timeout(2min, 5)
             .mail("me@example.org", {"END", "FAIL"})
             .pass_env("WANDB_PROJECT")
             .secret_env("WANDB_API_KEY");
       },
       true},
      // GPUs in the gres syntax, a per-task GPU binding (a warning), an --sbatch override of --time that
      // replaces the directive, and a preparation step before the training step.
      {"gres-prepare.sbatch",
       [] {
         return ht::Job("tokens")
             .nodes(2)
             .gpus_per_node("a100", 4)
             .gpu_syntax(ht::GpuSyntax::gres)
             .cpus_per_task(8)
             .time(1h)
             .partition("gpu")
             .sbatch_option("time", "00:30:00")
             .srun_option("gpus-per-task", "1")
             .prepare([](const ht::PrepareContext&) {});
       },
       false},
      {"everything.sbatch",
       [] {
         return ht::Job("it's \"all\" $(here) #1")
             .nodes(2)
             .time(std::chrono::hours(36) + 5s)
             .partition("debug")
             .qos("normal")
             .constraint("a100&ib")
             .reservation("maint")
             .exclusive()
             .chdir("/home/user/project/runs")
             .after("41")
             .after("42", ht::After::any)
             .env("PROMPT", "it's $HOME `date` ; rm -rf / \n*")
             .sbatch_option("comment", "tuning run #3")
             .sbatch_option("hint", "nomultithread")
             .srun_option("cpu-bind", "cores")
             .srun_option("overlap")
             .container(ht::Charliecloud("/images/ubuntu"))
             .mount("/usr", "/usr");
       },
       false},
      // EFA (AWS's recipe: FI_* variables, whole nodes, every node up before the script runs) in a pyxis
      // container, which gets the site's variables through --container-env; the job's own
      // FI_EFA_USE_DEVICE_RDMA (an instance without GPUDirect RDMA) replaces the preset's.
      {"efa.sbatch",
       [] {
         return ht::Job("efa")
             .nodes(2)
             .gpus_per_node(8)
             .time(4h)
             .partition("p5")
             .container(ht::Pyxis("nvcr.io#nvidia/pytorch:24.05-py3"))
             .env("FI_EFA_USE_DEVICE_RDMA", "0");
       },
       false, efa_site()},
      // InfiniBand (NCCL_IB_HCA and NCCL_SOCKET_IFNAME from the site) in Apptainer, which re-exports them.
      {"infiniband.sbatch",
       [] {
         return ht::Job("ib").nodes(4).gpus_per_node("a100", 4).time(2h).partition("gpu").container(
             ht::Apptainer("/images/pytorch.sif"));
       },
       false, infiniband_site()},
  };
}
}  // namespace

TEST_CASE("Rendered scripts match the golden files byte for byte", "[golden]") {
  auto context = job_test::fixed_context();
  context.worker_args = {"--epochs", "2"};
  for (const auto& golden : goldens()) {
    CAPTURE(golden.file);
    context.site = golden.site;
    const auto script = ht::render_sbatch(golden.job(), context);
    const auto path = job_test::source_dir() / "tests" / "golden" / golden.file;
    if (std::getenv("HPCTRAIN_UPDATE_GOLDEN")) job_test::write_file(path, script);
    CHECK(script == job_test::read_file(path));
    // And it is valid bash.
    const auto check = ht::run_process({"bash", "-n", path.string()});
    CHECK(check.exit_code == 0);
  }
}

TEST_CASE("sbatch --test-only accepts every golden script the local cluster can run", "[golden][slurm]") {
  for (const auto& golden : goldens()) {
    if (!golden.runs_on_local_cluster) continue;
    CAPTURE(golden.file);
    const auto path = job_test::source_dir() / "tests" / "golden" / golden.file;
    const auto result = ht::run_process({"sbatch", "--test-only", path.string()});
    CAPTURE(result.err);
    CHECK(result.exit_code == 0);
    CHECK(result.err.find("to start at") != std::string::npos);
  }
}
