// The site's fabric and nodes: the site file's keys, the presets rendered into the script (the job's variables win),
// the check of which network NCCL chose (on NCCL logs in the formats NCCL 2.18-2.27 and aws-ofi-nccl print), and
// the default cpus_per_task of jobs on whole nodes or GPUs.
#include <cstdlib>
#include <filesystem>
#include <map>

#include <hpctrain/job/cli.hpp>  // cluster_node_cpus
#include <hpctrain/job/fabric.hpp>
#include <hpctrain/job/nccl_network.hpp>
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
ht::SiteSettings site_from(const fs::path& dir, const std::string& text) {
  job_test::write_file(dir / "site.conf", text);
  const auto path = (dir / "site.conf").string();
  return ht::load_site_settings([path](const std::string& name) -> std::optional<std::string> {
    if (name == "HPCTRAIN_SITE_CONFIG") return path;
    return std::nullopt;
  });
}

bool has_line(const std::string& script, const std::string& line) {
  return script.find("\n" + line + "\n") != std::string::npos;
}

// Captured NCCL logs (NCCL_DEBUG=INFO), one per situation. The lines keep NCCL's formats; hosts and addresses
// are made up.
// An EFA node whose aws-ofi-nccl failed to start (libfabric found no EFA device): NCCL 2.23 falls back to sockets.
const std::string efa_plugin_failed =
    "ip-172-31-3-153:35113:35467 [0] NCCL INFO NCCL version 2.23.4+cuda12.6\n"
    "ip-172-31-3-153:35113:35467 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v9)\n"
    "ip-172-31-3-153:35113:35467 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.13.0-aws\n"
    "ip-172-31-3-153:35113:35467 [0] nccl_net_ofi_create_plugin:353 NCCL WARN NET/OFI aws-ofi-nccl initialization "
    "failed\n"
    "ip-172-31-3-153:35113:35467 [0] NCCL INFO Failed to initialize NET plugin Libfabric\n"
    "ip-172-31-3-153:35113:35467 [0] NCCL INFO NET/IB : No device found.\n"
    "ip-172-31-3-153:35113:35467 [0] NCCL INFO Failed to initialize NET plugin IB\n"
    "ip-172-31-3-153:35113:35467 [0] NCCL INFO NET/Socket : Using [0]ens32:172.31.3.153<0>\n"
    "ip-172-31-3-153:35113:35467 [0] NCCL INFO Initialized NET plugin Socket\n"
    "ip-172-31-3-153:35113:35467 [0] NCCL INFO Assigned NET plugin Socket to comm\n"
    "ip-172-31-3-153:35113:35467 [0] NCCL INFO Using network Socket\n";
// An image without the plugin at all (NCCL 2.20): no libnccl-net.so, no IB device, sockets.
const std::string no_plugin =
    "node1:880:887 [0] NCCL INFO Bootstrap : Using eth0:172.17.0.2<0>\n"
    "node1:880:887 [0] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or "
    "directory No plugin found (libnccl-net.so), using internal implementation\n"
    "node1:880:887 [0] NCCL INFO NET/IB : No device found.\n"
    "node1:880:887 [0] NCCL INFO NET/Socket : Using [0]eth0:172.17.0.2<0>\n"
    "node1:880:887 [0] NCCL INFO Using non-device net plugin version 0\n"
    "node1:880:887 [0] NCCL INFO Using network Socket\n";
// EFA working: aws-ofi-nccl chose libfabric's efa provider.
const std::string efa_ok =
    "p5-st-1:4212:4212 [0] NCCL INFO NET/Plugin: Loaded net plugin AWS Libfabric (v8)\n"
    "p5-st-1:4212:4212 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.9.1-aws\n"
    "p5-st-1:4212:4212 [0] NCCL INFO NET/OFI Using Libfabric version 1.21\n"
    "p5-st-1:4212:4212 [0] NCCL INFO NET/OFI Using CUDA driver version 12020\n"
    "p5-st-1:4212:4212 [0] NCCL INFO NET/OFI Selected Provider is efa (found 32 nics)\n"
    "p5-st-1:4212:4212 [0] NCCL INFO Using network AWS Libfabric\n";
// aws-ofi-nccl up, but libfabric gave it its TCP provider (FI_PROVIDER unset, no EFA device in the container).
const std::string libfabric_tcp =
    "h1:77:77 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.7.4-aws\n"
    "h1:77:77 [0] NCCL INFO NET/OFI Selected Provider is tcp;ofi_rxm (found 1 nics)\n"
    "h1:77:77 [0] NCCL INFO Using network AWS Libfabric\n";
// InfiniBand working (NCCL 2.21).
const std::string ib_ok =
    "gpu01:5101:5101 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.\n"
    "gpu01:5101:5101 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB ; OOB "
    "ib0:192.168.10.1<0>\n"
    "gpu01:5101:5101 [0] NCCL INFO Using non-device net plugin version 0\n"
    "gpu01:5101:5101 [0] NCCL INFO Using network IB\n";
// InfiniBand requested, no device (NCCL 2.26): "NET/IB : Using [RO]" lists no adapter, then sockets.
const std::string ib_missing =
    "lab:1425048:1425048 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so\n"
    "lab:1425048:1425048 [0] NCCL INFO NET/IB : No device found.\n"
    "lab:1425048:1425048 [0] NCCL INFO NET/IB : Using [RO]; OOB enp129s0:128.114.59.195<0>\n"
    "lab:1425048:1425048 [0] NCCL INFO Failed to initialize NET plugin IB\n"
    "lab:1425048:1425048 [0] NCCL INFO NET/Socket : Using [0]enp129s0:128.114.59.195<0>\n"
    "lab:1425048:1425048 [0] NCCL INFO Initialized NET plugin Socket\n"
    "lab:1425048:1425048 [0] NCCL INFO Assigned NET plugin Socket to comm\n";
// An older NCCL's log cut before "Using network": the device lines decide (IB here).
const std::string ib_devices_only =
    "gpu02:9:9 [0] NCCL INFO Bootstrap : Using [0]ib0:192.168.10.2<0>\n"
    "gpu02:9:9 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:192.168.10.2<0>\n";
// NCCL_DEBUG=WARN: nothing to read.
const std::string quiet = "gpu03:9:9 [0] NCCL WARN Cuda failure 'out of memory'\n";
}  // namespace

TEST_CASE("The site file's fabric keys are read, checked, and a typo names the closest", "[site][fabric]") {
  const auto dir = job_test::scratch_dir("fabric-site");
  const auto site = site_from(dir,
                              "fabric = efa  # p5\nsocket_ifname = ^docker,lo\nexpected_busbw_gbps = 42.5\n"
                              "cores_per_node = 96\nrendezvous_timeout_s = 600\ncollective_timeout_s = 900\n"
                              "checkpoint_timeout_s = 1800\ncheckpoint_write_gbps = 3.5\n");
  CHECK(site.fabric.fabric == ht::Fabric::efa);
  CHECK(site.fabric.source == (dir / "site.conf").string() + ":1");
  CHECK(site.fabric.socket_ifname == "^docker,lo");
  CHECK(site.fabric.expected_busbw_gbps == 42.5);
  CHECK(site.cores_per_node == 96);
  CHECK(site.rendezvous_timeout_s == 600);
  CHECK(site.collective_timeout_s == 900);
  CHECK(site.checkpoint_timeout_s == 1800);
  CHECK(site.checkpoint_write_gbps == 3.5);
  CHECK(site_from(dir, "fabric = infiniband\nib_hca = mlx5_0,mlx5_1\n").fabric.ib_hca == "mlx5_0,mlx5_1");

  const auto where = (dir / "site.conf").string() + ":1";
  auto [text, message] = GENERATE_COPY(table<std::string, std::string>({
      {"fabric = infinband\n",
       "[hpctrain.spec.fabric] fabric = infinband: expected efa, infiniband or ethernet (did you "
       "mean infiniband?) (" +
           where + ")"},
      {"fabric = EFA\n", "[hpctrain.spec.fabric] fabric = EFA: expected efa, infiniband or ethernet (" + where + ")"},
      {"fabric =\n", "[hpctrain.spec.fabric] fabric = \"\": expected efa, infiniband or ethernet (" + where + ")"},
      {"fabrc = efa\n",
       "[hpctrain.spec.site] site = fabrc: unknown setting (did you mean fabric?); known: gpu_syntax, "
       "fabric, socket_ifname, ib_hca, expected_busbw_gbps, cores_per_node, rendezvous_timeout_s, "
       "collective_timeout_s, checkpoint_timeout_s, checkpoint_write_gbps, short_grace (" +
           where + ")"},
      {"socket_ifname = eth0 eth1\n",
       "[hpctrain.spec.site] socket_ifname = eth0 eth1: expected one word (" + where + ")"},
      {"expected_busbw_gbps = fast\n",
       "[hpctrain.spec.site] expected_busbw_gbps = fast: expected a positive number of GB/s (" + where + ")"},
      {"checkpoint_write_gbps = 0\n",
       "[hpctrain.spec.site] checkpoint_write_gbps = 0: expected a positive number of GB/s (" + where + ")"},
      {"short_grace = sometimes\n",
       "[hpctrain.spec.site] short_grace = sometimes: expected warn or refuse (" + where + ")"},
      {"cores_per_node = 0\n",
       "[hpctrain.spec.site] cores_per_node = 0: expected a whole number in [1, 65536] (" + where + ")"},
      {"rendezvous_timeout_s = 5min\n",
       "[hpctrain.spec.site] rendezvous_timeout_s = 5min: expected a whole number in [1, 86400] (" + where + ")"},
  }));
  CAPTURE(text);
  CHECK_THROWS_WITH(site_from(dir, text), message);
}

TEST_CASE("Each fabric renders its recipe's variables and directives, and the job's own variables win",
          "[site][fabric]") {
  auto context = job_test::fixed_context();
  context.site.fabric = {ht::Fabric::efa, "site.conf:1", std::string("^docker,lo"), std::nullopt, std::nullopt};
  const auto efa = ht::render_sbatch(ht::Job("f").nodes(2).gpus_per_node(8).env("NCCL_SOCKET_IFNAME", "ens5"), context);
  CHECK(has_line(efa, "# Site: fabric efa (site.conf:1); the job's own variables win."));
  CHECK(has_line(efa, "export FI_PROVIDER=efa  # libfabric's EFA provider, never its TCP one"));
  CHECK(efa.find("\nexport FI_EFA_USE_DEVICE_RDMA=1  #") != std::string::npos);
  CHECK(efa.find("\nexport FI_EFA_FORK_SAFE=1  #") != std::string::npos);
  CHECK(has_line(efa, "export HPCTRAIN_FABRIC=efa  # rank 0 checks that NCCL uses it"));
  CHECK(efa.find("NCCL_PROTO") == std::string::npos);  // AWS's current guidance: only for aws-ofi-nccl <= 1.5
  // The job names NCCL_SOCKET_IFNAME itself: the site's value is not written at all.
  CHECK(ht::test::count_occurrences(efa, "NCCL_SOCKET_IFNAME") == 1);
  CHECK(has_line(efa, "export NCCL_SOCKET_IFNAME=ens5"));
  CHECK(has_line(efa, "#SBATCH --exclusive"));
  CHECK(has_line(efa, "#SBATCH --wait-all-nodes=1"));
  // The site's variables come before the job's.
  CHECK(efa.find("export FI_PROVIDER") < efa.find("export NCCL_SOCKET_IFNAME"));

  context.site.fabric = {ht::Fabric::infiniband, "site.conf:1", std::string("ib0"), std::string("mlx5_0,mlx5_1"), 25.0};
  const auto ib = ht::render_sbatch(ht::Job("f").nodes(2), context);
  CHECK(has_line(ib, "export NCCL_IB_HCA=mlx5_0,mlx5_1  # the site's adapters"));
  CHECK(has_line(ib, "export NCCL_SOCKET_IFNAME=ib0  # the site's interface for NCCL's bootstrap"));
  CHECK(has_line(ib, "export HPCTRAIN_EXPECTED_BUSBW_GBPS=25  # for --check-fabric"));
  CHECK(ib.find("FI_") == std::string::npos);
  CHECK(has_line(ib, "#SBATCH --exclusive"));
  CHECK(ib.find("wait-all-nodes") == std::string::npos);

  context.site.fabric = {ht::Fabric::ethernet, "site.conf:1", std::nullopt, std::nullopt, std::nullopt};
  const auto ethernet = ht::render_sbatch(ht::Job("f").nodes(2), context);
  CHECK(has_line(ethernet, "export HPCTRAIN_FABRIC=ethernet  # no check: sockets"));
  CHECK(ethernet.find("--exclusive") == std::string::npos);

  // Without a site file nothing changes.
  const auto plain = ht::render_sbatch(ht::Job("f").nodes(2), job_test::fixed_context());
  CHECK(plain.find("# Site") == std::string::npos);
  CHECK(plain.find("HPCTRAIN_FABRIC") == std::string::npos);
}

TEST_CASE("The site's timeouts are exported, the submitting shell's value winning", "[site][fabric]") {
  auto context = job_test::fixed_context();
  context.site.rendezvous_timeout_s = 600;
  context.site.checkpoint_timeout_s = 1800;
  const auto script = ht::render_sbatch(ht::Job("t"), context);
  CHECK(has_line(script,
                 "export HPCTRAIN_RENDEZVOUS_TIMEOUT_S=\"${HPCTRAIN_RENDEZVOUS_TIMEOUT_S:-600}\"  # seconds; the "
                 "submitting shell's value wins"));
  CHECK(script.find("HPCTRAIN_CHECKPOINT_TIMEOUT_S:-1800}") != std::string::npos);
  CHECK(script.find("HPCTRAIN_COLLECTIVE_TIMEOUT_S") == std::string::npos);
  // bash reads it so: the shell's value, else the site's.
  const auto shell = [&](std::vector<std::pair<std::string, std::string>> env) {
    return ht::run_process({"bash", "-c",
                            "export HPCTRAIN_RENDEZVOUS_TIMEOUT_S=\"${HPCTRAIN_RENDEZVOUS_TIMEOUT_S:-600}\"; "
                            "echo $HPCTRAIN_RENDEZVOUS_TIMEOUT_S"},
                           env)
        .out;
  };
  CHECK(shell({}) == "600\n");
  CHECK(shell({{"HPCTRAIN_RENDEZVOUS_TIMEOUT_S", "30"}}) == "30\n");
}

TEST_CASE("A dry run shows the site file's fabric preset", "[site][fabric][cli]") {
  const auto dir = job_test::scratch_dir("fabric-dry-run");
  job_test::write_file(dir / "site.conf", "fabric = efa\nexpected_busbw_gbps = 40\n");
  const auto result =
      job_test::run_probe(dir, {"--dry-run", "--nodes", "2"}, {{"HPCTRAIN_SITE_CONFIG", (dir / "site.conf").string()}});
  CAPTURE(result.err);
  REQUIRE(result.exit_code == 0);
  CHECK(result.out.find("# Site: fabric efa (" + (dir / "site.conf").string() + ":1)") != std::string::npos);
  CHECK(has_line(result.out, "export FI_PROVIDER=efa  # libfabric's EFA provider, never its TCP one"));
  CHECK(has_line(result.out, "#SBATCH --wait-all-nodes=1"));
  job_test::write_file(dir / "site.conf", "fabric = ef\n");
  const auto bad = job_test::run_probe(dir, {"--dry-run"}, {{"HPCTRAIN_SITE_CONFIG", (dir / "site.conf").string()}});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("[hpctrain.spec.fabric] fabric = ef: expected efa, infiniband or ethernet (did you mean efa?)") !=
        std::string::npos);
  CHECK(bad.out.empty());
}

TEST_CASE("NCCL's choice of network is read from its log", "[fabric][nccl]") {
  using T = ht::NcclTransport;
  auto [log, name, transport, provider, sockets] = GENERATE_COPY(table<std::string, std::string, T, std::string, bool>({
      {efa_plugin_failed, "Socket", T::socket, "", true},
      {no_plugin, "Socket", T::socket, "", true},
      {efa_ok, "AWS Libfabric", T::libfabric, "efa", false},
      {libfabric_tcp, "AWS Libfabric", T::libfabric, "tcp;ofi_rxm", true},
      {ib_ok, "IB", T::infiniband, "", false},
      {ib_missing, "Socket", T::socket, "", true},
      {ib_devices_only, "IB", T::infiniband, "", false},
  }));
  CAPTURE(log);
  const auto network = ht::nccl_network_from_log(log);
  REQUIRE(network);
  CHECK(network->name == name);
  CHECK(network->transport == transport);
  CHECK(network->provider == provider);
  CHECK(network->uses_sockets() == sockets);
  CHECK_FALSE(ht::nccl_network_from_log(quiet));
  CHECK_FALSE(ht::nccl_network_from_log(""));
}

TEST_CASE("A fallback to sockets on an efa or infiniband site is an error naming the fix", "[fabric][nccl]") {
  const auto failed = *ht::nccl_network_from_log(efa_plugin_failed);
  const auto efa_error = ht::socket_fallback_error(ht::Fabric::efa, failed);
  REQUIRE(efa_error);
  CHECK(
      efa_error->starts_with("the site's fabric is efa but NCCL chose TCP sockets (`Using network Socket`); "
                             "`NET/IB : No device found.`, so the job would run many times slower"));
  CHECK(efa_error->find("aws-ofi-nccl plugin (libnccl-net.so) on LD_LIBRARY_PATH") != std::string::npos);
  CHECK(efa_error->ends_with("or run over sockets anyway with --allow-socket-fallback"));
  const auto missing = ht::socket_fallback_error(ht::Fabric::efa, *ht::nccl_network_from_log(no_plugin));
  REQUIRE(missing);
  CHECK(missing->find("`NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file") != std::string::npos);
  const auto tcp = ht::socket_fallback_error(ht::Fabric::efa, *ht::nccl_network_from_log(libfabric_tcp));
  REQUIRE(tcp);
  CHECK(tcp->find("NCCL chose libfabric's tcp;ofi_rxm provider (`NET/OFI Selected Provider is tcp;ofi_rxm (found 1 "
                  "nics)`)") != std::string::npos);
  const auto ib = ht::socket_fallback_error(ht::Fabric::infiniband, *ht::nccl_network_from_log(ib_missing));
  REQUIRE(ib);
  CHECK(ib->find("(`Assigned NET plugin Socket to comm`)") != std::string::npos);
  CHECK(ib->find("ib_hca (NCCL_IB_HCA)") != std::string::npos);
  // The right network, or a site on ethernet: no error.
  CHECK_FALSE(ht::socket_fallback_error(ht::Fabric::efa, *ht::nccl_network_from_log(efa_ok)));
  CHECK_FALSE(ht::socket_fallback_error(ht::Fabric::infiniband, *ht::nccl_network_from_log(ib_ok)));
  CHECK_FALSE(ht::socket_fallback_error(ht::Fabric::ethernet, failed));
}

TEST_CASE("Rank 0 of a multi-node job captures NCCL's lines and fails on a fallback unless allowed", "[fabric][nccl]") {
  const auto dir = job_test::scratch_dir("fabric-capture");
  // The worker's environment, as its launcher gave it: read into settings, never from this process.
  const auto environment_of = [&](std::map<std::string, std::string> variables) {
    ht::Environment environment;
    environment.set(ht::env::run_dir, dir.string());
    for (const auto& [name, value] : variables) environment.set(name, value);
    return environment;
  };
  const auto settings_of = [&](std::map<std::string, std::string> variables) {
    return ht::nccl_network_settings(environment_of(std::move(variables)));
  };
  {
    // NCCL reads its configuration from the environment its process began with: rank 0 starts again with this one.
    const auto given = environment_of({{"HPCTRAIN_FABRIC", "efa"}, {"NCCL_DEBUG", "WARN"}});
    const auto settings = ht::nccl_network_settings(given);
    CHECK_FALSE(ht::nccl_network_check(1, true, settings));   // not rank 0
    CHECK_FALSE(ht::nccl_network_check(0, false, settings));  // one node: NCCL's network carries nothing
    const auto check = ht::nccl_network_check(0, true, settings);
    REQUIRE(check);
    CHECK(check->fabric == ht::Fabric::efa);
    CHECK(check->log == dir / fmt::format("nccl-rank0-{}.log", ::getpid()));
    const auto restart = ht::nccl_capture_environment(*check, settings, given);
    REQUIRE(restart);
    CHECK(restart->get("NCCL_DEBUG_FILE") == check->log.string());
    CHECK(restart->get("NCCL_DEBUG") == "INFO");
    CHECK(restart->get("NCCL_DEBUG_SUBSYS") == "INIT,NET");
    CHECK(restart->get("HPCTRAIN_FABRIC") == "efa");  // the rest as given
    // Started again with it (the same pid), the rank finds the same log and needs no further start.
    const auto again = ht::nccl_network_settings(*restart);
    const auto same = ht::nccl_network_check(0, true, again);
    REQUIRE(same);
    CHECK(same->log == check->log);
    CHECK_FALSE(ht::nccl_capture_environment(*same, again, *restart));
    job_test::write_file(check->log, efa_plugin_failed);
    try {
      ht::check_nccl_network(*check);
      FAIL("no error for a fallback to sockets");
    } catch (const ht::RuntimeError& error) {
      CHECK(std::string(error.what())
                .starts_with("[hpctrain.runtime.fabric] the site's fabric is efa but NCCL chose TCP"));
    }
    const auto allowed = ht::nccl_network_check(
        0, true, settings_of({{"HPCTRAIN_FABRIC", "efa"}, {"HPCTRAIN_ALLOW_SOCKET_FALLBACK", "1"}}));
    REQUIRE(allowed);
    job_test::write_file(allowed->log, efa_plugin_failed);
    CHECK(
        ht::check_nccl_network(*allowed).starts_with("hpctrain: warning: the site's fabric is efa but NCCL chose TCP"));
    job_test::write_file(check->log, efa_ok);
    CHECK(ht::check_nccl_network(*check) ==
          "hpctrain: NCCL uses network AWS Libfabric, provider efa (the site's fabric is efa)");
    job_test::write_file(check->log, quiet);
    CHECK(ht::check_nccl_network(*check).starts_with("hpctrain: warning: cannot tell which network NCCL chose"));
  }
  {
    // The user's own NCCL_DEBUG_FILE (with NCCL's %h and %p) is read where NCCL writes it; their level and
    // subsystems are kept when they already include INFO: nothing to start again for.
    const auto users = environment_of({{"HPCTRAIN_FABRIC", "infiniband"},
                                       {"NCCL_DEBUG", "TRACE"},
                                       {"NCCL_DEBUG_SUBSYS", "ALL"},
                                       {"NCCL_DEBUG_FILE", (dir / "nccl.%h.%p").string()}});
    const auto settings = ht::nccl_network_settings(users);
    const auto check = ht::nccl_network_check(0, true, settings);
    REQUIRE(check);
    CHECK(check->log.filename().string().ends_with(fmt::format(".{}", ::getpid())));
    CHECK(check->log.filename().string().find("%") == std::string::npos);
    CHECK_FALSE(ht::nccl_capture_environment(*check, settings, users));
    // Their file at level WARN: only the level is raised.
    auto warn = users;
    warn.set("NCCL_DEBUG", "WARN");
    const auto raised = ht::nccl_capture_environment(*check, ht::nccl_network_settings(warn), warn);
    REQUIRE(raised);
    CHECK(raised->get("NCCL_DEBUG") == "INFO");
    CHECK(raised->get("NCCL_DEBUG_FILE") == (dir / "nccl.%h.%p").string());
    CHECK(raised->get("NCCL_DEBUG_SUBSYS") == "ALL");
  }
  CHECK_FALSE(ht::nccl_network_check(0, true, settings_of({{"HPCTRAIN_FABRIC", "ethernet"}})));
  CHECK_THROWS_WITH(settings_of({{"HPCTRAIN_FABRIC", "efa2"}}),
                    "[hpctrain.runtime.fabric] [hpctrain.spec.fabric] fabric = efa2: expected efa, infiniband or "
                    "ethernet (did you mean efa?) (HPCTRAIN_FABRIC)");
}

TEST_CASE("A rank starts itself again with another environment: the same pid and arguments, the variable added",
          "[fabric][nccl][process]") {
  // Any byte in the arguments survives (an empty one, a newline, a space); the output flushed before the exec is kept.
  const auto result =
      ht::run_process({job_test::probe(), std::string(ht::worker_flag), "--restart-self", "a b", "", "line\nbreak"}, {},
                      "", {"PROBE_RESTARTED"});
  CAPTURE(result.out, result.err);
  REQUIRE(result.exit_code == 0);
  const auto first = result.out.find("probe pid=");
  REQUIRE(first != std::string::npos);
  const auto pid = result.out.substr(first + 10, result.out.find(' ', first + 10) - first - 10);
  CHECK(result.out.starts_with(fmt::format("probe pid={} restarted=no\nprobe pid={} restarted=1\n", pid, pid)));
  CHECK(result.out.find("env PROBE_RESTARTED=31\n") != std::string::npos);     // "1", hex
  CHECK(result.out.find("arg1=612062\n") != std::string::npos);                // "a b"
  CHECK(result.out.find("arg2=\n") != std::string::npos);                      // ""
  CHECK(result.out.find("arg3=6c696e650a627265616b\n") != std::string::npos);  // "line\nbreak"
}

TEST_CASE("A job on whole nodes or GPUs gets the node's CPUs divided among its tasks, bound to cores", "[site][cpus]") {
  auto context = job_test::fixed_context();
  context.site.cores_per_node = 96;
  const auto gpus = ht::render_sbatch(ht::Job("c").gpus_per_node(8), context);
  CHECK(has_line(gpus,
                 "# cpus-per-task: 12 = 96 CPUs per node (the site file's cores_per_node) / 8 task(s) per node, "
                 "for a job on GPUs"));
  CHECK(has_line(gpus, "#SBATCH --cpus-per-task=12"));
  CHECK(gpus.find("  --cpus-per-task=12 \\\n  --cpu-bind=cores \\\n") != std::string::npos);
  const auto exclusive = ht::render_sbatch(ht::Job("c").tasks_per_node(4).exclusive(), context);
  CHECK(has_line(exclusive, "#SBATCH --cpus-per-task=24"));
  CHECK(exclusive.find("for a job on whole nodes") != std::string::npos);
  // The job's own count stands; a job asking for neither whole nodes nor GPUs keeps Slurm's default, unbound.
  const auto own = ht::render_sbatch(ht::Job("c").gpus_per_node(8).cpus_per_task(3), context);
  CHECK(has_line(own, "#SBATCH --cpus-per-task=3"));
  CHECK(own.find("# cpus-per-task:") == std::string::npos);
  const auto plain = ht::render_sbatch(ht::Job("c").tasks_per_node(4), context);
  CHECK(plain.find("cpus-per-task") == std::string::npos);
  CHECK(plain.find("--cpu-bind") == std::string::npos);
  // The job's own binding is not doubled; without the site's count, sinfo's.
  const auto own_bind = ht::render_sbatch(ht::Job("c").gpus_per_node(4).srun_option("cpu-bind", "sockets"), context);
  CHECK(ht::test::count_occurrences(own_bind, "cpu-bind") == 1);
  context.site.cores_per_node.reset();
  context.sinfo_node_cpus = 2;
  const auto sinfo = ht::render_sbatch(ht::Job("c").gpus_per_node(2), context);
  CHECK(sinfo.find("# cpus-per-task: 1 = 2 CPUs per node (sinfo) / 2 task(s) per node") != std::string::npos);
  context.sinfo_node_cpus.reset();
  CHECK(ht::render_sbatch(ht::Job("c").gpus_per_node(2), context).find("cpus-per-task") == std::string::npos);
}

TEST_CASE("sinfo's count of a node's CPUs is scontrol's CPUTot", "[cpus][slurm]") {
  auto context = job_test::fixed_context();
  const auto cpus = ht::cluster_node_cpus(ht::Job("c").partition("debug").exclusive(), context);
  REQUIRE(cpus);
  const auto node = ht::run_process({"scontrol", "--oneliner", "show", "node", "n1"});
  REQUIRE(node.exit_code == 0);
  const auto at = node.out.find("CPUTot=");
  REQUIRE(at != std::string::npos);
  CHECK(*cpus == std::stoi(node.out.substr(at + 7)));
  // Not asked when nothing needs it.
  CHECK_FALSE(ht::cluster_node_cpus(ht::Job("c").partition("debug"), context));
}
