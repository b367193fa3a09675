// Fuzzes the whole environment a task reads to find its place (slurm/world.hpp, slurm/environment.hpp):
// the input is `NAME=VALUE` lines, served through the injectable lookup. An accepted environment gives a
// consistent World: a rank below the world size, a local rank below the local world size, a valid port.
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <hpctrain/slurm/world.hpp>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  std::map<std::string, std::string> variables;
  std::string_view text = hpctrain::fuzz::as_text(data, size);
  while (!text.empty()) {
    const auto end = std::min(text.find('\n'), text.size());
    const auto line = text.substr(0, end);
    if (const auto equals = line.find('='); equals != std::string_view::npos)
      variables[std::string(line.substr(0, equals))] = std::string(line.substr(equals + 1));
    text.remove_prefix(std::min(end + 1, text.size()));
  }
  const hpctrain::slurm::EnvironmentLookup lookup = [&](const std::string& name) -> std::optional<std::string> {
    const auto found = variables.find(name);
    if (found == variables.end() || found->second.empty()) return std::nullopt;  // like Environment::get
    return found->second;
  };
  hpctrain::fuzz::expect_clean_rejection([&] {
    const auto world = hpctrain::slurm::world_from_environment(lookup);
    FUZZ_CHECK(world.world_size >= 1);
    FUZZ_CHECK(world.rank >= 0 && world.rank < world.world_size);
    FUZZ_CHECK(world.local_world_size >= 1);
    FUZZ_CHECK(world.local_rank >= 0 && world.local_rank < world.local_world_size);
    FUZZ_CHECK(world.master_port >= 1 && world.master_port <= 65535);
    FUZZ_CHECK(!world.master_addr.empty());
  });
  return 0;
}
