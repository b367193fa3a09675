// Site settings: the GPU request syntax (program, command line, HPCTRAIN_GPU_SYNTAX, the site file), the
// warning about per-task GPU binding, and --sbatch overrides that replace a directive instead of adding one.
#include <filesystem>

#include <hpctrain/job/cli.hpp>
#include <hpctrain/job/process.hpp>
#include <hpctrain/job/render.hpp>
#include <hpctrain/job/site.hpp>

#include <catch2/catch.hpp>

#include "job_test_support.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
namespace ht = hpctrain;
using namespace std::chrono_literals;

namespace {

using Env = std::map<std::string, std::string>;
std::function<std::optional<std::string>(const std::string&)> lookup(Env env) {
  return [env = std::move(env)](const std::string& name) -> std::optional<std::string> {
    const auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}
}  // namespace

TEST_CASE("The GPU request is written in the chosen syntax", "[site]") {
  auto [syntax, type, count_, expected] = GENERATE(table<std::string, std::string, int, std::string>({
      {"gpus-per-node", "", 4, "#SBATCH --gpus-per-node=4\n"},
      {"gpus-per-node", "v100", 4, "#SBATCH --gpus-per-node=v100:4\n"},
      {"gres", "", 4, "#SBATCH --gres=gpu:4\n"},
      {"gres", "a100", 8, "#SBATCH --gres=gpu:a100:8\n"},
  }));
  CAPTURE(syntax, type, count_);
  const auto script =
      ht::render_sbatch(ht::Job("g").gpus_per_node(type, count_).gpu_syntax(syntax), job_test::fixed_context());
  CHECK(script.find(expected) != std::string::npos);
  CHECK(ht::test::count_occurrences(script, "gpu") == 1);  // one GPU directive, no other
}

TEST_CASE("The site default comes from HPCTRAIN_GPU_SYNTAX, else the site file, the program's choice wins", "[site]") {
  const auto dir = job_test::scratch_dir("site");
  fs::create_directories(dir / ".config" / "hpctrain");
  job_test::write_file(dir / ".config" / "hpctrain" / "site.conf",
                       "# our cluster\n  gpu_syntax = gres   # old Slurm\n");
  const auto from_file = ht::load_site_settings(lookup({{"HOME", dir.string()}}));
  REQUIRE(from_file.gpu_syntax == ht::GpuSyntax::gres);
  CHECK(from_file.gpu_syntax_source == (dir / ".config" / "hpctrain" / "site.conf").string() + ":2");
  const auto from_env =
      ht::load_site_settings(lookup({{"HOME", dir.string()}, {"HPCTRAIN_GPU_SYNTAX", "gpus-per-node"}}));
  CHECK(from_env.gpu_syntax == ht::GpuSyntax::gpus_per_node);
  CHECK(from_env.gpu_syntax_source == "HPCTRAIN_GPU_SYNTAX");
  CHECK_FALSE(ht::load_site_settings(lookup({{"HOME", (dir / "nowhere").string()}})).gpu_syntax);

  auto context = job_test::fixed_context();
  context.site = from_file;
  CHECK(ht::render_sbatch(ht::Job("g").gpus_per_node(2), context).find("#SBATCH --gres=gpu:2\n") != std::string::npos);
  CHECK(ht::render_sbatch(ht::Job("g").gpus_per_node(2).gpu_syntax(ht::GpuSyntax::gpus_per_node), context)
            .find("#SBATCH --gpus-per-node=2\n") != std::string::npos);
}

TEST_CASE("A bad GPU syntax names the value and where it came from", "[site]") {
  const auto dir = job_test::scratch_dir("site-bad");
  job_test::write_file(dir / "site.conf", "gpu_syntax = gpus\n");
  CHECK_THROWS_WITH(ht::load_site_settings(lookup({{"HPCTRAIN_SITE_CONFIG", (dir / "site.conf").string()}})),
                    fmt::format("[hpctrain.spec.gpu_syntax] gpu_syntax = gpus: expected gpus-per-node or gres (from "
                                "{}:1)",
                                (dir / "site.conf").string()));
  job_test::write_file(dir / "site.conf", "gpu_sintax = gres\n");
  CHECK_THROWS_WITH(
      ht::load_site_settings(lookup({{"HPCTRAIN_SITE_CONFIG", (dir / "site.conf").string()}})),
      fmt::format(
          "[hpctrain.spec.site] site = gpu_sintax: unknown setting (did you mean gpu_syntax?); "
          "known: gpu_syntax, fabric, socket_ifname, ib_hca, expected_busbw_gbps, cores_per_node, "
          "rendezvous_timeout_s, collective_timeout_s, checkpoint_timeout_s, checkpoint_write_gbps, short_grace ({}:1)",
          (dir / "site.conf").string()));
  CHECK_THROWS_WITH(ht::load_site_settings(lookup({{"HPCTRAIN_GPU_SYNTAX", "GRES"}})),
                    "[hpctrain.spec.gpu_syntax] gpu_syntax = GRES: expected gpus-per-node or gres (from "
                    "HPCTRAIN_GPU_SYNTAX)");
  const auto result = job_test::run_probe(dir, {"--dry-run", "--gpu-syntax", "gress"});
  CHECK(result.exit_code == 2);
  CHECK(result.err == "[hpctrain.spec.gpu_syntax] gpu_syntax = gress: expected gpus-per-node or gres\n");
  CHECK(result.out.empty());
}

TEST_CASE("The option --gpu-syntax gres renders --gres=gpu:N from the command line", "[site][cli]") {
  const auto dir = job_test::scratch_dir("site-cli");
  const auto result = job_test::run_probe(dir, {"--dry-run", "--gpus-per-node", "4", "--gpu-syntax", "gres"});
  CAPTURE(result.err);
  REQUIRE(result.exit_code == 0);
  CHECK(result.out.find("#SBATCH --gres=gpu:4\n") != std::string::npos);
  CHECK(result.out.find("#SBATCH --gpus-per-node") == std::string::npos);
  const auto by_env =
      job_test::run_probe(dir, {"--dry-run", "--gpus-per-node", "a100:2"}, {{"HPCTRAIN_GPU_SYNTAX", "gres"}});
  CHECK(by_env.out.find("#SBATCH --gres=gpu:a100:2\n") != std::string::npos);
}

TEST_CASE("Per-task GPU binding is warned about, not refused", "[site]") {
  auto key = GENERATE(as<std::string>{}, "gpus-per-task", "gpu-bind");
  CAPTURE(key);
  const auto job = ht::Job("w").gpus_per_node(4).sbatch_option(key, "1");
  const auto warnings = ht::job_warnings(job);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].starts_with(fmt::format("--{} hides the other GPUs of a node from each rank", key)));
  CHECK(warnings[0].find("Lightning #16828") != std::string::npos);
  const auto script = ht::render_sbatch(job, job_test::fixed_context());
  CHECK(script.find("# warning: --" + key + " hides") != std::string::npos);
  CHECK(ht::job_warnings(ht::Job("w").gpus_per_node(4)).empty());
  // Fewer tasks than GPUs on a node: the rest would stay idle (one rank per task, one GPU per rank).
  const auto idle = ht::job_warnings(ht::Job("w").tasks_per_node(1).gpus_per_node(8));
  REQUIRE(idle.size() == 1);
  CHECK(idle[0].starts_with(
      "8 GPUs per node but 1 task(s) per node: hpctrain trains one rank per task on one GPU each, so 7 GPU(s)"));
  CHECK(ht::job_warnings(ht::Job("w").tasks_per_node(8).gpus_per_node(8)).empty());
  CHECK(ht::job_warnings(ht::Job("w").srun_option("gpu-bind", "closest")).size() == 1);
}

TEST_CASE("An --sbatch override of a key with its own directive replaces that directive", "[cli]") {
  const auto dir = job_test::scratch_dir("sbatch-override");
  const auto result = job_test::run_probe(
      dir, {"--dry-run", "--sbatch", "time=00:07:00", "--sbatch", "nodes=1", "--sbatch", "job-name=renamed", "--sbatch",
            "comment=one", "--sbatch", "comment=two", "--sbatch", "exclusive"});
  CAPTURE(result.err);
  REQUIRE(result.exit_code == 0);
  const auto& script = result.out;
  CHECK(ht::test::count_occurrences(script, "#SBATCH --time=") == 1);
  CHECK(script.find("#SBATCH --time=00:07:00\n") != std::string::npos);
  CHECK(ht::test::count_occurrences(script, "#SBATCH --nodes=") == 1);
  CHECK(script.find("#SBATCH --nodes=1\n") != std::string::npos);
  CHECK(ht::test::count_occurrences(script, "#SBATCH --job-name=") == 1);
  CHECK(script.find("#SBATCH --job-name=renamed\n") != std::string::npos);
  CHECK(ht::test::count_occurrences(script, "#SBATCH --comment=") == 1);
  CHECK(script.find("#SBATCH --comment=two\n") != std::string::npos);
  CHECK(script.find("#SBATCH --exclusive\n") != std::string::npos);
  // In place: the overridden time stays where --time goes, before the partition and output lines.
  CHECK(script.find("#SBATCH --time=00:07:00\n") < script.find("#SBATCH --output="));
}

TEST_CASE("sbatch --test-only reads either GPU syntax as a GPU request", "[site][slurm]") {
  // The local cluster has no GRES: Slurm answers both spellings with the same GRES refusal, while the same
  // job without GPUs is accepted. That shows the directive is read as a GPU request (not ignored, not a
  // parse error); the exact grammar is pinned by the goldens.
  const auto dir = job_test::scratch_dir("site-test-only");
  for (const auto* syntax : {"gpus-per-node", "gres"}) {
    CAPTURE(syntax);
    const auto path = dir / fmt::format("{}.sbatch", syntax);
    job_test::write_file(path,
                         ht::render_sbatch(ht::Job("g").gpus_per_node("a100", 2).gpu_syntax(syntax).partition("debug"),
                                           job_test::fixed_context()));
    const auto result = ht::run_process({"sbatch", "--test-only", path.string()});
    CHECK(result.exit_code == 1);
    CHECK(result.err.find("Invalid generic resource (gres) specification") != std::string::npos);
  }
  const auto plain = dir / "plain.sbatch";
  job_test::write_file(plain, ht::render_sbatch(ht::Job("g").partition("debug"), job_test::fixed_context()));
  const auto accepted = ht::run_process({"sbatch", "--test-only", plain.string()});
  CHECK(accepted.exit_code == 0);
  CHECK(accepted.err.find("to start at") != std::string::npos);
}
