// Real multi-process tests: two ranks of tests/dist/programs/dist_worker.cpp over real Gloo on loopback.
// The ranks check their property themselves (against a single-process reference, or against rank 0) and
// exit 0 when it holds; here we start them, wait, and compare what both printed.
#include <catch2/catch.hpp>

#include "multi_process_support.hpp"

#include <csignal>

namespace {

using namespace hpctrain_test;
using namespace std::chrono_literals;

void require_both_succeed(Ranks& ranks) {
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank, ranks.output(rank), ranks.errors(rank));
    REQUIRE(ranks.wait(rank) == std::optional<int>(0));
  }
}

}  // namespace

TEST_CASE("World-2 gradients after one step equal one process's gradients on the concatenated batch",
          "[dist][gradient_sync]") {
  // micro_steps 2: gradient accumulation, the first micro-step without communication.
  const auto micro_steps = GENERATE(1, 2);
  CAPTURE(micro_steps);
  Ranks ranks(2, {"gradients", std::to_string(micro_steps)});
  require_both_succeed(ranks);
  // Each rank compared with its own reference (relative 1e-5, absolute 1e-6) and printed its worst difference.
  for (int rank = 0; rank < 2; ++rank) REQUIRE(value_of(ranks.output(rank), "max_abs_difference").has_value());
}

TEST_CASE("Parameters stay bit-identical across ranks after many steps from different initialisations",
          "[dist][gradient_sync]") {
  Ranks ranks(2, {"steps", "60"});
  require_both_succeed(ranks);
  const auto hash0 = value_of(ranks.output(0), "parameter_hash");
  const auto hash1 = value_of(ranks.output(1), "parameter_hash");
  REQUIRE(hash0.has_value());
  REQUIRE(hash0 == hash1);
}

TEST_CASE("The first bucket's all-reduce is launched before backward reaches the first layer",
          "[dist][gradient_sync]") {
  Ranks ranks(2, {"overlap"});
  require_both_succeed(ranks);
  for (int rank = 0; rank < 2; ++rank) {
    // The rank checked: at least 3 buckets, >= 1 launched when backward reached the first layer, not all yet.
    CAPTURE(rank, ranks.output(rank));
    const auto buckets = std::stoul(value_of(ranks.output(rank), "buckets").value());
    const auto launched = std::stoul(value_of(ranks.output(rank), "launched_at_first_layer").value());
    REQUIRE(buckets >= 3);
    REQUIRE(launched >= 1);
    REQUIRE(launched < buckets);
  }
}

TEST_CASE(
    "Without overlap every bucket is launched in finish(), and the averaged gradients are the overlapped ones bit for "
    "bit",
    "[dist][gradient_sync]") {
  Ranks ranks(2, {"no-overlap"});
  require_both_succeed(ranks);
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank, ranks.output(rank));
    REQUIRE(value_of(ranks.output(rank), "launched_after_backward") == "0");
    REQUIRE(value_of(ranks.output(rank), "launched_after_finish") == value_of(ranks.output(rank), "buckets"));
    REQUIRE(value_of(ranks.output(rank), "gradients_equal") == "yes");
  }
}

TEST_CASE(
    "Sums, any_rank, a lagged vote, barrier and bucketed broadcasts agree across ranks, non-contiguous tensors "
    "included",
    "[dist]") {
  Ranks ranks(2, {"collectives"});
  require_both_succeed(ranks);
  for (int rank = 0; rank < 2; ++rank) REQUIRE(value_of(ranks.output(rank), "collectives") == std::string("ok"));
}

TEST_CASE(
    "Subgroups of a 4-rank world (two pairs, and the pairs' counterparts) reduce, gather and broadcast among their "
    "members only",
    "[dist][subgroup]") {
  Ranks ranks(4, {"subgroups"});
  for (int rank = 0; rank < 4; ++rank) {
    CAPTURE(rank, ranks.output(rank), ranks.errors(rank));
    REQUIRE(ranks.wait(rank) == std::optional<int>(0));
    REQUIRE(value_of(ranks.output(rank), "subgroups") == std::string("ok"));
  }
}

TEST_CASE("A rank waiting on a collective a peer joins 2 s late sleeps: it does not burn a core while it waits",
          "[dist][wait]") {
  // Issue 54: a wait that polls the host (c10d's Work::wait with a timeout on NCCL does) holds a core the whole
  // time. Gloo's wait blocks; the ratio of CPU to wall seconds is what is checked, not a duration.
  Ranks ranks(2, {"idle-wait"});
  require_both_succeed(ranks);
  const auto wall = std::stod(value_of(ranks.output(0), "wait_wall_s").value());
  const auto cpu = std::stod(value_of(ranks.output(0), "wait_cpu_s").value());
  CAPTURE(wall, cpu);
  REQUIRE(wall >= 1.0);       // it did wait for the late peer
  REQUIRE(cpu < 0.2 * wall);  // and slept meanwhile (a polling wait: about 1.0)
}

TEST_CASE("A parameter one rank does not use is averaged with zeros and reported on that rank",
          "[dist][gradient_sync]") {
  Ranks ranks(2, {"unused"});
  require_both_succeed(ranks);
  REQUIRE(value_of(ranks.output(0), "without_gradient") == std::string(""));
  REQUIRE(value_of(ranks.output(1), "without_gradient") == std::string("extra.weight,extra.bias"));
}

TEST_CASE("Killing one rank mid-run makes the other exit non-zero within the timeout", "[dist][failure]") {
  const auto killed = GENERATE(0, 1);  // rank 0 also hosts the TCPStore
  const int survivor = 1 - killed;
  CAPTURE(killed);
  const auto timeout = 20s;
  Ranks ranks(2, {"forever"}, timeout);
  REQUIRE(ranks.wait_for_output(killed, "training"));
  ranks.kill(killed);
  REQUIRE(ranks.wait(killed) == std::optional<int>(128 + SIGKILL));
  // The survivor's next collective fails (connection reset) or times out; it must not hang past the timeout
  // (plus slack for a loaded machine: this guards against a hang, it does not measure speed).
  const auto exit_code = ranks.wait(survivor, timeout + 30s);
  CAPTURE(ranks.errors(survivor));
  REQUIRE(exit_code.has_value());
  REQUIRE(*exit_code == 1);
  REQUIRE_THAT(ranks.errors(survivor),
               Catch::Matchers::StartsWith("[hpctrain.runtime.collective] rank " + std::to_string(survivor) +
                                           " of 2: gradient all_reduce failed (collective timeout 20 s: "
                                           "HPCTRAIN_COLLECTIVE_TIMEOUT_S, site file collective_timeout_s): "));
}
