// Our hostlist grammar against the real oracle: the local Slurm's `scontrol show hostnames` (expand) and
// `scontrol show hostlist` (compress), on expressions generated from a fixed seed.
#include <hpctrain/slurm/hostlist.hpp>

#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "test_support.hpp"

namespace {

using Hosts = std::vector<std::string>;

Hosts lines_of(const std::string& text) {
  Hosts lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Hostlists as Slurm 22.05 accepts them: names with letters, digits, dashes and dots; items with up to three
// bracket groups of ranges and single numbers, zero padded or not; nothing after the last bracket (22.05
// rejects that; ours accepts it, see docs/slurm.md).
class ExpressionGenerator {
 public:
  explicit ExpressionGenerator(unsigned seed) : rng_(seed) {}

  std::string expression() {
    std::string out;
    const int items = uniform(1, 4);
    for (int i = 0; i < items; ++i) {
      if (i > 0) out += chance(0.85) ? "," : " ";
      out += item();
    }
    return out;
  }

  Hosts host_names() {
    // Runs of numbered hosts (ascending, shuffled, padded, duplicated) mixed with literal names.
    Hosts hosts;
    const int runs = uniform(1, 4);
    for (int r = 0; r < runs; ++r) {
      const std::string prefix = chance(0.2) ? name() + "." + name() : name();
      int n = uniform(0, 120);
      const int width = chance(0.3) ? uniform(2, 4) : 0;
      const int count = uniform(1, 6);
      for (int k = 0; k < count; ++k) {
        const int value = chance(0.7) ? n++ : uniform(0, 130);
        std::string digits = std::to_string(value);
        if (static_cast<int>(digits.size()) < width)
          digits.insert(0, static_cast<std::size_t>(width) - digits.size(), '0');
        hosts.push_back(prefix + digits);
        if (chance(0.05)) hosts.push_back(hosts.back());
      }
      if (chance(0.3)) hosts.push_back(name() + "-" + name() + ".ib");
    }
    return hosts;
  }

 private:
  int uniform(int low, int high) { return std::uniform_int_distribution<int>(low, high)(rng_); }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }

  std::string name() {
    static const std::string letters = "abcdefghijklmnopqrstuvwxyz";
    std::string out;
    const int length = uniform(1, 4);
    for (int i = 0; i < length; ++i) out += letters[static_cast<std::size_t>(uniform(0, 25))];
    if (chance(0.3)) out += std::to_string(uniform(0, 9));
    return out;
  }

  std::string number(int value, int width) {
    std::string digits = std::to_string(value);
    if (static_cast<int>(digits.size()) < width) digits.insert(0, static_cast<std::size_t>(width) - digits.size(), '0');
    return digits;
  }

  std::string bracket() {
    std::string out = "[";
    const int parts = uniform(1, 3);
    for (int p = 0; p < parts; ++p) {
      if (p > 0) out += ',';
      const int low = uniform(0, 120);
      const int width = chance(0.35) ? uniform(2, 4) : 0;
      out += number(low, width);
      if (chance(0.6)) out += '-' + number(low + uniform(0, 12), chance(0.2) ? uniform(2, 4) : 0);
    }
    return out + "]";
  }

  std::string item() {
    if (chance(0.2)) {  // a literal host, dashes and dots included
      std::string host = name();
      if (chance(0.5)) host += (chance(0.5) ? "-" : ".") + name();
      return host;
    }
    std::string out;
    if (!chance(0.05)) {  // an empty prefix is valid ("[1-2]"); a leading dash would make scontrol see an option
      out += name();
      if (chance(0.3)) out += chance(0.5) ? "-" : ".";
    }
    const int groups = chance(0.7) ? 1 : uniform(2, 3);
    for (int g = 0; g < groups; ++g) {
      if (g > 0) out += chance(0.3) ? "" : (chance(0.5) ? "-" : "." + name());
      out += bracket();
    }
    return out;
  }

  std::mt19937 rng_;
};

constexpr unsigned generator_seed = 20261122;
constexpr int generated_expressions = 250;

}  // namespace

TEST_CASE("Our hostlist expansion agrees with scontrol show hostnames on generated expressions", "[slurm][hostlist]") {
  ExpressionGenerator generator(generator_seed);
  for (int i = 0; i < generated_expressions; ++i) {
    const std::string expression = generator.expression();
    CAPTURE(i, expression);
    const auto oracle = hpctrain::test::run_command({"scontrol", "show", "hostnames", expression});
    REQUIRE(oracle.exit_code == 0);
    REQUIRE(oracle.err.empty());
    CHECK(hpctrain::slurm::expand_hostlist(expression) == lines_of(oracle.out));
  }
}

TEST_CASE("Our hostlist compression writes what scontrol show hostlist writes", "[slurm][hostlist]") {
  ExpressionGenerator generator(generator_seed + 1);
  for (int i = 0; i < generated_expressions; ++i) {
    const Hosts hosts = generator.host_names();
    std::string joined;
    for (const auto& host : hosts) joined += (joined.empty() ? "" : ",") + host;
    CAPTURE(i, joined);
    const auto oracle = hpctrain::test::run_command({"scontrol", "show", "hostlist", joined});
    REQUIRE(oracle.exit_code == 0);
    const std::string ours = hpctrain::slurm::compress_hostlist(hosts);
    CHECK(ours + "\n" == oracle.out);
    CHECK(hpctrain::slurm::expand_hostlist(ours) == hosts);
  }
}

TEST_CASE("Hostlists that scontrol rejects are errors for us too", "[slurm][hostlist]") {
  const std::string expression = GENERATE(as<std::string>{}, "n[3-1]", "n[]", "n[a]", "n[1-2]]", "n[1,]", "n[,1]",
                                          "n[1-2-3]", "n[-1]", "n[1--2]", "n[1-70000]", "a[2-1]b");
  CAPTURE(expression);
  const auto oracle = hpctrain::test::run_command({"scontrol", "show", "hostnames", expression});
  CHECK((oracle.out + oracle.err).find("Invalid hostlist") != std::string::npos);
  CHECK_THROWS_AS(hpctrain::slurm::expand_hostlist(expression), hpctrain::slurm::HostlistError);
}
