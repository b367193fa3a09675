#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include <hpctrain/job/units.hpp>
#include <hpctrain/names.hpp>

#include <catch2/catch.hpp>

using namespace hpctrain::literals;
using namespace std::chrono_literals;

TEST_CASE("Memory is written in the largest unit that divides it", "[units]") {
  auto [memory, text] = GENERATE(table<hpctrain::Memory, std::string>(
      {{64_GiB, "64G"}, {1536_MiB, "1536M"}, {2_TiB, "2T"}, {1024_GiB, "1T"}, {1_MiB, "1M"}}));
  CAPTURE(memory.mebibytes);
  CHECK(hpctrain::to_slurm(memory) == text);
}

TEST_CASE("Time limits are rendered as D-HH:MM:SS", "[units]") {
  auto [seconds, text] = GENERATE(table<long long, std::string>({{600, "0-00:10:00"},
                                                                 {1, "0-00:00:01"},
                                                                 {2 * 3600, "0-02:00:00"},
                                                                 {86400 + 3600 + 61, "1-01:01:01"},
                                                                 {7 * 86400, "7-00:00:00"}}));
  CAPTURE(seconds);
  CHECK(hpctrain::format_slurm_time(std::chrono::seconds(seconds)) == text);
}

TEST_CASE("Command-line time limits accept Slurm's forms and unit suffixes", "[units]") {
  auto [text, seconds] = GENERATE(table<std::string, long long>({{"10", 600},
                                                                 {"10:30", 630},
                                                                 {"01:02:03", 3723},
                                                                 {"2-00", 2 * 86400},
                                                                 {"1-02:03", 86400 + 7200 + 180},
                                                                 {"1-02:03:04", 86400 + 7200 + 184},
                                                                 {"90s", 90},
                                                                 {"30min", 1800},
                                                                 {"5m", 300},
                                                                 {"2h", 7200},
                                                                 {"1d", 86400}}));
  CAPTURE(text);
  CHECK(hpctrain::parse_slurm_time(text).count() == seconds);
}

TEST_CASE("A malformed command-line time limit is a spec error naming time", "[units]") {
  auto text = GENERATE(as<std::string>{}, "", "abc", "1:2:3:4", "-5", "1-", "5x", "h");
  CAPTURE(text);
  try {
    hpctrain::parse_slurm_time(text);
    FAIL("no error");
  } catch (const hpctrain::SpecError& e) {
    CHECK(std::string(e.what()) == "[hpctrain.spec.time] time = " + text +
                                       ": expected D-HH:MM:SS, HH:MM:SS, MM:SS, MM or a number with s/min/h/d");
  }
}

TEST_CASE(
    "One GPU's memory on the command line (--gpu-memory) reads GB as GPUs are sold, GiB and TiB as binary, and a bare "
    "number as GiB",
    "[units]") {
  auto [text, bytes, bare] = GENERATE(table<std::string, double, bool>({{"80GB", 80e9, false},
                                                                        {"74.5GiB", 74.5 * 1073741824.0, false},
                                                                        {"1TB", 1e12, false},
                                                                        {"1TiB", 1099511627776.0, false},
                                                                        {"80", 80 * 1073741824.0, true},
                                                                        {"0.5", 536870912.0, true}}));
  CAPTURE(text);
  const auto memory = hpctrain::parse_gpu_memory(text);
  REQUIRE(memory);
  CHECK(memory->bytes == bytes);
  CHECK(memory->bare == bare);
  for (const char* bad : {"", "GB", "0", "-80GB", "80XB", "80 GB", "eighty", "80GBs", "nan", "inf"}) {
    CAPTURE(bad);
    CHECK_FALSE(hpctrain::parse_gpu_memory(bad));
  }
}

TEST_CASE("A positive number from the environment: nothing when unset, each other value refused by its caller",
          "[units]") {
  const std::string name = "HPCTRAIN_UNITS_TEST_NUMBER";
  std::string refused;
  const auto refuse = [&](const std::string& value) {
    refused = value;
    throw std::invalid_argument(value);
  };
  hpctrain::Environment environment;
  CHECK_FALSE(hpctrain::positive_number_from_environment(environment, name, refuse).has_value());
  environment.set(name, "");  // empty counts as unset, as for every setting
  CHECK_FALSE(hpctrain::positive_number_from_environment(environment, name, refuse).has_value());
  for (const auto& [text, number] : {std::pair<std::string, double>{"2.5", 2.5}, {"45", 45.0}, {"1e-4", 1e-4}}) {
    environment.set(name, text);
    CHECK(hpctrain::positive_number_from_environment(environment, name, refuse) == number);
  }
  for (const std::string text : {"0", "-1", "x", "3GB", "1e999", "nan", "2.5 "}) {
    CAPTURE(text);
    environment.set(name, text);
    CHECK_THROWS_AS(hpctrain::positive_number_from_environment(environment, name, refuse), std::invalid_argument);
    CHECK(refused == text);
  }
}

TEST_CASE("An environment as a value: this process's read whole, a child's changed without touching this process's",
          "[units]") {
  const std::string name = "HPCTRAIN_UNITS_TEST_ENVIRONMENT";
  ::setenv(name.c_str(), "", 1);
  auto environment = hpctrain::Environment::of_this_process();
  CHECK(environment.get(name, hpctrain::EmptyValue::kept) == "");  // an empty value is one where it is kept
  CHECK_FALSE(environment.get(name));                              // and unset for a setting, as getenv reads it
  CHECK(environment.get("PATH") == std::string(std::getenv("PATH")));
  const auto count = environment.variables().size();
  environment.set(name, "child").set("HPCTRAIN_UNITS_TEST_NEW", "a=b");
  CHECK(environment.variables().size() == count + 1);  // set in place, or last
  CHECK(environment.variables().back() == std::pair<std::string, std::string>{"HPCTRAIN_UNITS_TEST_NEW", "a=b"});
  CHECK(environment.get(name) == "child");
  CHECK(std::string(std::getenv(name.c_str())) == "");  // this process's is unchanged
  environment.remove(name);
  CHECK_FALSE(environment.get(name));
  const auto entries = environment.entries();
  CHECK(entries.back() == "HPCTRAIN_UNITS_TEST_NEW=a=b");
  CHECK(std::none_of(entries.begin(), entries.end(), [&](const auto& entry) { return entry.starts_with(name + "="); }));
  ::unsetenv(name.c_str());
}
