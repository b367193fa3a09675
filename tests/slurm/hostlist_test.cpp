#include <hpctrain/slurm/hostlist.hpp>

#include <string>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

using hpctrain::slurm::compress_hostlist;
using hpctrain::slurm::expand_hostlist;
using hpctrain::slurm::HostlistError;
using Hosts = std::vector<std::string>;

TEST_CASE("A hostlist expands comma lists, ranges, zero padding and several bracket groups", "[hostlist]") {
  const auto [expression, hosts] = GENERATE(table<std::string, Hosts>({
      {"", Hosts{}},
      {"n1", {"n1"}},
      {"n1,n2,login", {"n1", "n2", "login"}},
      {"n[1-3]", {"n1", "n2", "n3"}},
      {"n[8-11]", {"n8", "n9", "n10", "n11"}},
      {"n[01-03]", {"n01", "n02", "n03"}},
      {"n[1-03]", {"n1", "n2", "n3"}},  // the low bound's digits set the width, as in Slurm
      {"n[098-101]", {"n098", "n099", "n100", "n101"}},
      {"n[1,3,5-6]", {"n1", "n3", "n5", "n6"}},
      {"n[1,1]", {"n1", "n1"}},
      {"n[3,1-2]", {"n3", "n1", "n2"}},
      {"[1-2]", {"1", "2"}},
      {"rack[1-2]-n[01-02]", {"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"}},
      {"n[1-2][3-4]", {"n13", "n14", "n23", "n24"}},
      // Three groups in Slurm's order: the last fastest, then the first, the middle slowest.
      {"m[1-2][3-4][5-6]", {"m135", "m136", "m235", "m236", "m145", "m146", "m245", "m246"}},
      {"gpu-a.ib[7-8],login-1.cluster", {"gpu-a.ib7", "gpu-a.ib8", "login-1.cluster"}},
      {"n[1-2] m,,x ", {"n1", "n2", "m", "x"}},  // Slurm also splits on whitespace and skips empty items
      {"n[1-2].ib", {"n1.ib", "n2.ib"}},         // a suffix after the last bracket: accepted (docs/slurm.md)
      {"n[99999999999-100000000000]", {"n99999999999", "n100000000000"}},
  }));
  CAPTURE(expression);
  CHECK(expand_hostlist(expression) == hosts);
}

TEST_CASE("A range of 65536 hosts expands, as in Slurm", "[hostlist]") {
  const auto hosts = expand_hostlist("n[0-65535]");
  REQUIRE(hosts.size() == 65536);
  CHECK(hosts.front() == "n0");
  CHECK(hosts.back() == "n65535");
}

TEST_CASE("A malformed hostlist is an error naming the expression and the position", "[hostlist]") {
  const auto [expression, message, position] = GENERATE(table<std::string, std::string, std::size_t>({
      {"n[1-", "hostlist \"n[1-\": unclosed '[' at position 1", 1},
      {"n[3-1]", "hostlist \"n[3-1]\": descending range 3-1 at position 2", 2},
      {"a,b[1-2", "hostlist \"a,b[1-2\": unclosed '[' at position 3", 3},
      {"n[]", "hostlist \"n[]\": expected a number at position 2", 2},
      {"n[a]", "hostlist \"n[a]\": expected a number, found 'a' at position 2", 2},
      {"n[ 1-2]", "hostlist \"n[ 1-2]\": expected a number, found ' ' at position 2", 2},
      {"n[1,]", "hostlist \"n[1,]\": expected a number at position 4", 4},
      {"n[-1]", "hostlist \"n[-1]\": expected a number, found '-' at position 2", 2},
      {"n[1-2-3]", "hostlist \"n[1-2-3]\": unexpected '-' in brackets at position 5", 5},
      {"n[1-2]]", "hostlist \"n[1-2]]\": ']' without '[' at position 6", 6},
      {"a]b", "hostlist \"a]b\": ']' without '[' at position 1", 1},
      {"n[[1]]", "hostlist \"n[[1]]\": '[' inside brackets at position 2", 2},
      {"n[1-70000]", "hostlist \"n[1-70000]\": range 1-70000 has more than 65536 hosts at position 2", 2},
      {"n[99999999999999999999]", "hostlist \"n[99999999999999999999]\": number too large at position 2", 2},
      {"a[0-1023]b[0-1024]", "hostlist \"a[0-1023]b[0-1024]\": expands to more than 1048576 hosts at position 0", 0},
  }));
  CAPTURE(expression);
  try {
    const auto hosts = expand_hostlist(expression);
    FAIL("expanded to " << hosts.size() << " hosts instead of failing");
  } catch (const HostlistError& e) {
    CHECK(e.what() == "[hpctrain.runtime.hostlist] " + message);
    CHECK(e.expression() == expression);
    CHECK(e.position() == position);
    CHECK(e.id() == "hpctrain.runtime.hostlist");
  }
}

TEST_CASE("Compressing keeps order and duplicates and ranges only what expands back", "[hostlist]") {
  const auto [hosts, expression] = GENERATE(table<Hosts, std::string>({
      {Hosts{}, ""},
      {{"n1"}, "n1"},
      {{"n1", "n2", "n3"}, "n[1-3]"},
      {{"n3", "n1", "n2"}, "n[3,1-2]"},
      {{"n9", "n10", "n11"}, "n[9-11]"},
      {{"n09", "n10"}, "n[09-10]"},
      {{"n001", "n002", "n3"}, "n[001-002,3]"},
      {{"n1", "n01", "n2"}, "n[1,01,2]"},
      {{"n1", "n1"}, "n[1,1]"},
      {{"n1", "m1", "n2"}, "n1,m1,n2"},
      {{"a1", "a2", "b1", "a3"}, "a[1-2],b1,a3"},
      {{"a1-b1", "a1-b2"}, "a1-b[1-2]"},
      {{"n1.ib", "n2.ib"}, "n1.ib,n2.ib"},
      {{"1", "2"}, "[1-2]"},
      {{"login", "n1", "n2"}, "login,n[1-2]"},
  }));
  CAPTURE(hosts);
  CHECK(compress_hostlist(hosts) == expression);
  CHECK(expand_hostlist(expression) == hosts);
}

TEST_CASE("Compressing more than 65536 consecutive hosts starts a new range", "[hostlist]") {
  const auto hosts = expand_hostlist("n[0-65535],n65536");
  CHECK(compress_hostlist(hosts) == "n[0-65535,65536]");
  CHECK(expand_hostlist(compress_hostlist(hosts)) == hosts);
}

TEST_CASE("Compressing a name that cannot be a host is an error naming it", "[hostlist]") {
  const auto [host, message] = GENERATE(table<std::string, std::string>({
      {"n[1]", "hostlist \"n[1]\": not a host name at position 1"},
      {"a,b", "hostlist \"a,b\": not a host name at position 1"},
      {"", "hostlist \"\": not a host name at position 0"},
  }));
  CAPTURE(host);
  try {
    const auto compressed = compress_hostlist({"n1", host});
    FAIL("compressed to " << compressed);
  } catch (const HostlistError& e) {
    CHECK(e.what() == "[hpctrain.runtime.hostlist] " + message);
  }
}
