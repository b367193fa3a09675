#include <hpctrain/error.hpp>

#include <catch2/catch.hpp>

TEST_CASE("A spec error names the field and the value in a stable format", "[error]") {
  const hpctrain::SpecError e("nodes", "0", "must be at least 1");
  CHECK(std::string(e.what()) == "[hpctrain.spec.nodes] nodes = 0: must be at least 1");
  CHECK(e.field() == "nodes");
  CHECK(e.id() == "hpctrain.spec.nodes");
}
