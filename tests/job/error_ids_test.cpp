// docs/errors.md lists exactly the error ids the code can raise. The ids are the named constants of
// include/hpctrain/error_ids.hpp; a spec error's field spelled as a literal (`SpecError("nodes", ...)`,
// `require(ok, "nodes", ...)`) must name one of them too (a RuntimeError takes an ErrorId only). Each failure says
// which id is missing where.
#include <filesystem>
#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

#include "job_test_support.hpp"

namespace fs = std::filesystem;

namespace {
std::string read(const fs::path& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

/// id -> constant name, from `inline constexpr ErrorId <name>{"<id>"};`.
std::map<std::string, std::string> declared_ids() {
  const auto text = read(job_test::source_dir() / "include/hpctrain/error_ids.hpp");
  const std::regex declaration(R"re(ErrorId\s+(\w+)\s*\{\s*"([^"]+)"\s*\})re");
  std::map<std::string, std::string> ids;
  for (std::sregex_iterator it(text.begin(), text.end(), declaration), end; it != end; ++it) ids[(*it)[2]] = (*it)[1];
  return ids;
}

/// The families docs/errors.md documents as patterns: `hpctrain.spec.gpt2.<field>` gives "hpctrain.spec.gpt2.".
std::vector<std::string> documented_families() {
  const auto text = read(job_test::source_dir() / "docs/errors.md");
  const std::regex pattern(
      R"re(`(hpctrain\.(?:spec|runtime)\.[a-z0-9_]+(?:\.[a-z0-9_]+)*\.)<[a-z_]+>`)re");  // not the bare family
  std::vector<std::string> families;
  for (std::sregex_iterator it(text.begin(), text.end(), pattern), end; it != end; ++it) families.push_back((*it)[1]);
  return families;
}

/// Every `hpctrain.<...>` id written in backquotes in docs/errors.md (patterns such as `hpctrain.spec.<field>`
/// excluded).
std::set<std::string> documented_ids() {
  const auto text = read(job_test::source_dir() / "docs/errors.md");
  const std::regex id(R"re(`(hpctrain\.(?:usage|spec\.[a-z0-9_.]*[a-z0-9_]|runtime\.[a-z0-9_.]*[a-z0-9_]))`)re");
  std::set<std::string> ids;
  for (std::sregex_iterator it(text.begin(), text.end(), id), end; it != end; ++it) ids.insert((*it)[1]);
  return ids;
}

struct Use {
  std::string id;
  std::string where;  // file:line
};

/// What the headers raise: `errors::<name>` uses, and ids still spelled as literals at a throw site.
std::vector<Use> raised_ids(const std::map<std::string, std::string>& declared) {
  std::map<std::string, std::string> by_name;
  for (const auto& [id, name] : declared) by_name[name] = id;
  const std::regex named(R"re(errors::(\w+))re");
  const std::regex usage(R"re(\bUsageError\s*\()re");  // always hpctrain.usage
  // The first identifier-like literal of a call that takes an id or a field first (reasons hold spaces).
  const std::regex call(R"re(\b(RuntimeError|SpecError|require|require_directive_value|set_directive)\s*\()re");
  // An argument that is a literal (not `x == "gelu_new"`): the id or field.
  const std::regex first_literal(R"re(^\s*"([a-z_](?:[a-z0-9_.]*[a-z0-9_])?)"\s*,)re");
  const std::regex literal(R"re((?:^|,)\s*"([a-z_](?:[a-z0-9_.]*[a-z0-9_])?)"\s*[,)])re");
  std::vector<Use> uses;
  const auto root = job_test::source_dir() / "include";
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    // error.hpp and error_ids.hpp define the error types and ids; they raise nothing themselves.
    const auto file = entry.path().filename();
    if (entry.path().extension() != ".hpp" || file == "error_ids.hpp" || file == "error.hpp") continue;
    const auto text = read(entry.path());
    const auto where = [&](std::ptrdiff_t offset) {
      return fmt::format("{}:{}", fs::relative(entry.path(), job_test::source_dir()).string(),
                         1 + std::count(text.begin(), text.begin() + offset, '\n'));
    };
    for (std::sregex_iterator it(text.begin(), text.end(), usage), end; it != end; ++it)
      uses.push_back({"hpctrain.usage", where(it->position())});
    for (std::sregex_iterator it(text.begin(), text.end(), named), end; it != end; ++it) {
      const auto found = by_name.find((*it)[1]);
      uses.push_back({found == by_name.end() ? "errors::" + (*it)[1].str() : found->second, where(it->position())});
    }
    for (std::sregex_iterator it(text.begin(), text.end(), call), end; it != end; ++it) {
      const auto begin = text.begin() + it->position() + it->length();
      const auto stop = std::find(begin, text.end(), ';');
      std::smatch field;
      // An error type's id is its first argument; require()'s field comes after the condition.
      const bool error_type = (*it)[1] == "RuntimeError" || (*it)[1] == "SpecError";
      if (!std::regex_search(begin, stop, field, error_type ? first_literal : literal)) continue;
      const bool runtime = (*it)[1] == "RuntimeError";
      const std::string value = field[1];
      uses.push_back(
          {value.starts_with("hpctrain.") ? value : fmt::format("hpctrain.{}.{}", runtime ? "runtime" : "spec", value),
           where(it->position())});
    }
  }
  return uses;
}
}  // namespace

TEST_CASE("docs/errors.md lists exactly the ids declared in error_ids.hpp", "[errors]") {
  const auto declared = declared_ids();
  const auto documented = documented_ids();
  REQUIRE(declared.size() > 40);
  std::string missing;
  for (const auto& [id, name] : declared)
    if (!documented.count(id)) missing += fmt::format("  {} (errors::{}) is not in docs/errors.md\n", id, name);
  for (const auto& id : documented)
    if (!declared.count(id))
      missing += fmt::format("  {} is in docs/errors.md but not declared in include/hpctrain/error_ids.hpp\n", id);
  INFO("add a row to docs/errors.md, or a constant to include/hpctrain/error_ids.hpp:\n" << missing);
  CHECK(missing.empty());
}

TEST_CASE("Every id a header raises is declared, and every declared id is raised somewhere", "[errors]") {
  const auto declared = declared_ids();
  std::string problems;
  std::set<std::string> used;
  const auto families = documented_families();
  const auto in_family = [&](const std::string& id) {
    return std::any_of(families.begin(), families.end(),
                       [&](const std::string& prefix) { return id.starts_with(prefix); });
  };
  for (const auto& use : raised_ids(declared)) {
    used.insert(use.id);
    if (!declared.count(use.id) && !in_family(use.id))
      problems +=
          fmt::format("  {} raised at {} is not declared in include/hpctrain/error_ids.hpp (nor a documented family)\n",
                      use.id, use.where);
  }
  for (const auto& [id, name] : declared)
    if (!used.count(id)) problems += fmt::format("  {} (errors::{}) is declared but nothing raises it\n", id, name);
  INFO(problems);
  CHECK(problems.empty());
}
