// Catch2's main, compiled once for every test executable. It also sets the variables tests use to find
// the source tree, the build tree and the local cluster (unless ctest or the user set them), so a test
// binary behaves the same whether ctest starts it or a developer does; catch_discover_tests cannot pass
// more than one ENVIRONMENT entry through its PROPERTIES.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdlib>

int main(int argc, char* argv[]) {
  setenv("HPCTRAIN_SOURCE_DIR", HPCTRAIN_TEST_SOURCE_DIR, 0);
  setenv("HPCTRAIN_BUILD_DIR", HPCTRAIN_TEST_BUILD_DIR, 0);
  setenv("SLURM_CONF", HPCTRAIN_TEST_SLURM_CONF, 0);
  return Catch::Session().run(argc, argv);
}
