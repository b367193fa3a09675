// Every user string is shell-quoted: adversarial strings go through render -> bash -> the worker and
// must arrive byte-identical in its argv and environment, with nothing executed on the way.
#include <filesystem>
#include <map>
#include <random>

#include <hpctrain/job/job.hpp>
#include <hpctrain/job/local_run.hpp>
#include <hpctrain/job/process.hpp>
#include <hpctrain/job/render.hpp>
#include <hpctrain/job/shell.hpp>
#include <hpctrain/names.hpp>

#include <catch2/catch.hpp>

#include "job_test_support.hpp"

namespace ht = hpctrain;

namespace {
/// Strings built from the pieces that break naive quoting; `canary` is a file they try to create.
std::vector<std::string> adversarial_strings(std::uint32_t seed, int count, const std::string& canary) {
  const std::vector<std::string> pieces = {"'",
                                           "\"",
                                           "$(touch " + canary + ")",
                                           "`touch " + canary + "`",
                                           ";touch " + canary + ";",
                                           "\n",
                                           "\r",
                                           "\t",
                                           " ",
                                           "*",
                                           "?",
                                           "[a-z]",
                                           "~",
                                           "~root",
                                           "$HOME",
                                           "${PATH}",
                                           "$1",
                                           "$$",
                                           "\\",
                                           "\\'",
                                           "!",
                                           "!!",
                                           "#",
                                           "&",
                                           "|",
                                           ">",
                                           "<",
                                           "{a,b}",
                                           "%j",
                                           "=",
                                           "--",
                                           "-x",
                                           "λ→😀",
                                           "\xff\xfe",
                                           "x",
                                           "é",
                                           "$'\\n'",
                                           "\"'\"",
                                           "''"};
  std::mt19937 random(seed);
  std::uniform_int_distribution<std::size_t> pick(0, pieces.size() - 1);
  std::uniform_int_distribution<int> length(0, 6);
  std::vector<std::string> strings;
  for (int i = 0; i < count; ++i) {
    std::string s;
    for (int n = length(random); n > 0; --n) s += pieces[pick(random)];
    strings.push_back(s);
  }
  return strings;
}

/// "probe rank=? <key>=<hex>" lines of the probe's output, keyed.
std::map<std::string, std::string> reported(const std::string& out) {
  std::map<std::string, std::string> values;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const auto space = line.find(' ', std::string("probe rank=").size());
    if (!line.starts_with("probe rank=") || space == std::string::npos) continue;
    auto rest = line.substr(space + 1);
    if (rest.starts_with("env ")) rest = rest.substr(4);
    const auto equals = rest.rfind('=');
    values[rest.substr(0, equals)] = rest.substr(equals + 1);
  }
  return values;
}
}  // namespace

TEST_CASE("shell_quote leaves plain words bare and single-quotes the rest", "[quoting]") {
  auto [text, quoted] = GENERATE(table<std::string, std::string>({{"abc", "abc"},
                                                                  {"/a/b-c_d.e:1,2", "/a/b-c_d.e:1,2"},
                                                                  {"", "''"},
                                                                  {"a b", "'a b'"},
                                                                  {"it's", "'it'\\''s'"},
                                                                  {"$(x)", "'$(x)'"},
                                                                  {"a#b", "'a#b'"}}));
  CAPTURE(text);
  CHECK(ht::shell_quote(text) == quoted);
}

TEST_CASE("sbatch_quote writes what sbatch's directive parser reads back", "[quoting]") {
  auto [text, quoted] = GENERATE(table<std::string, std::string>(
      {{"abc", "abc"}, {"a b", "\"a b\""}, {"a\"b", "\"a\\\"b\""}, {"a\\b", "\"a\\\\b\""}, {"#1", "\"#1\""}}));
  CAPTURE(text);
  CHECK(ht::sbatch_quote(text) == quoted);
}

TEST_CASE("Adversarial strings reach the worker byte-identical through render and bash", "[quoting]") {
  const auto dir = job_test::scratch_dir("quoting");
  const auto canary = (dir / "CANARY").string();
  const auto seed = GENERATE(1u, 2u, 3u, 4u, 5u);
  CAPTURE(seed);
  const auto strings = adversarial_strings(seed, 40, canary);

  auto job = ht::Job("quoting");
  for (std::size_t i = 0; i < strings.size(); ++i) job.env(fmt::format("PROBE_V{}", i), strings[i]);
  auto context = job_test::fixed_context();
  context.program = job_test::probe();
  context.worker_args = strings;
  context.argv = strings;  // the header comment must survive them too
  const auto script_path = dir / "job.sbatch";
  job_test::write_file(script_path, ht::render_sbatch(job, context));

  // The step runs without Slurm here: `srun` drops its own options and runs the command.
  const auto result =
      ht::run_process({"bash", "-c", "srun() { while [[ $1 == --* ]]; do shift; done; \"$@\"; }; source \"$1\"", "bash",
                       script_path.string()},
                      {{"SLURM_JOB_ID", "4242"}},
                      dir.string());  // in the scratch directory: should quoting break, a stray `>` writes there
  CAPTURE(result.err);
  REQUIRE(result.exit_code == 0);
  const auto values = reported(result.out);
  for (std::size_t i = 0; i < strings.size(); ++i) {
    CAPTURE(i, strings[i]);
    CHECK(values.at(fmt::format("arg{}", i)) == job_test::hex(strings[i]));
    CHECK(values.at(fmt::format("PROBE_V{}", i)) == job_test::hex(strings[i]));
  }
  CHECK(values.count(fmt::format("arg{}", strings.size())) == 0);
  CHECK_FALSE(std::filesystem::exists(canary));
}

TEST_CASE(
    "prepend_env and append_env add an entry to a path list where the job runs, through render and bash, and "
    "in --local's environment",
    "[quoting]") {
  const auto dir = job_test::scratch_dir("path-entries");
  const auto canary = (dir / "CANARY").string();
  const std::string entry = "/opt/a b/'lib'$(touch " + canary + ")";  // a directory name is any bytes but NUL
  auto job = ht::Job("paths")
                 .prepend_env("PROBE_UNSET", entry)
                 .prepend_env("PROBE_SET", entry)
                 .append_env("PROBE_APPENDED", entry)
                 .append_env("PROBE_EMPTY", entry);
  // Where the job runs, PROBE_SET and PROBE_APPENDED hold a path list, PROBE_EMPTY is empty, PROBE_UNSET unset
  // (under set -u: the script must not fail on it).
  const std::vector<std::pair<std::string, std::string>> node_env = {
      {"SLURM_JOB_ID", "4242"}, {"PROBE_SET", "/usr/lib:/lib"}, {"PROBE_APPENDED", "/usr/bin"}, {"PROBE_EMPTY", ""}};
  const std::map<std::string, std::string> expected = {{"PROBE_UNSET", entry},
                                                       {"PROBE_SET", entry + ":/usr/lib:/lib"},
                                                       {"PROBE_APPENDED", "/usr/bin:" + entry},
                                                       {"PROBE_EMPTY", entry}};
  SECTION("the sbatch script") {
    auto context = job_test::fixed_context();
    context.program = job_test::probe();
    const auto script_path = dir / "job.sbatch";
    job_test::write_file(script_path, ht::render_sbatch(job, context));
    const auto result =
        ht::run_process({"bash", "-c", "srun() { while [[ $1 == --* ]]; do shift; done; \"$@\"; }; source \"$1\"",
                         "bash", script_path.string()},
                        node_env, dir.string(), {"PROBE_UNSET"});
    CAPTURE(result.err);
    REQUIRE(result.exit_code == 0);
    const auto values = reported(result.out);
    for (const auto& [name, value] : expected) {
      CAPTURE(name, value);
      CHECK(values.at(name) == job_test::hex(value));
    }
  }
  // pyxis and Apptainer: the image's own value of a variable it sets wins (pyxis: a name --container-env does not
  // list; Apptainer: %environment), so the entries travel in carriers and a /bin/sh before the binary adds them to
  // the image's value. The stubs do what the runtimes do with the environment; the image sets PROBE_SET and
  // PROBE_APPENDED.
  const std::map<std::string, std::string> expected_in_image = {{"PROBE_UNSET", entry},
                                                                {"PROBE_SET", entry + ":/image/PROBE_SET"},
                                                                {"PROBE_APPENDED", "/image/PROBE_APPENDED:" + entry},
                                                                {"PROBE_EMPTY", entry}};
  const std::string image_env = "for name in PROBE_SET PROBE_APPENDED; do ";
  const std::map<std::string, std::pair<ht::Job, std::string>> runtimes = {
      {"pyxis",
       {ht::Job(job).container(ht::Pyxis("ubuntu:24.04")),
        "srun() { local keep=,; while [[ $1 == --* ]]; do [[ $1 != --container-env=* ]] || keep=\",${1#*=},\"; shift; "
        "done; " +
            image_env + "[[ $keep == *\",$name,\"* ]] || export \"$name=/image/$name\"; done; \"$@\"; }; "}},
      {"apptainer",
       {ht::Job(job).container(ht::Apptainer("image.sif")),
        "srun() { while [[ $1 == --* ]]; do shift; done; \"$@\"; }; apptainer() { shift; while [[ $1 == --* ]]; do "
        "[[ $1 == --nv ]] && shift || shift 2; done; shift; " +
            image_env +
            "export \"$name=/image/$name\"; done; for name in $(compgen -e); do [[ $name != APPTAINERENV_* ]] || "
            "export \"${name#APPTAINERENV_}=${!name}\"; done; \"$@\"; }; "}}};
  for (const auto& [runtime, job_and_stubs] : runtimes) {
    SECTION("the sbatch script under " + runtime + ": the entries added to the image's value inside the container") {
      auto context = job_test::fixed_context();
      context.program = job_test::probe();
      const auto script_path = dir / "job.sbatch";
      const auto script = ht::render_sbatch(job_and_stubs.first, context);
      job_test::write_file(script_path, script);
      const auto result =
          ht::run_process({"bash", "-c", job_and_stubs.second + "source \"$1\"", "bash", script_path.string()},
                          node_env, dir.string(), {"PROBE_UNSET"});
      CAPTURE(script, result.err);
      REQUIRE(result.exit_code == 0);
      const auto values = reported(result.out);
      for (const auto& [name, value] : expected_in_image) {
        CAPTURE(name, value);
        CHECK(values.at(name) == job_test::hex(value));
      }
    }
  }
  SECTION("--local: the entries added to the shell's environment, as the script adds them") {
    ht::Environment shell;
    for (const auto& [name, value] : node_env) shell.set(name, value);
    const auto environment = ht::detail::job_environment(job, job_test::fixed_context(), shell);
    for (const auto& [name, value] : expected) {
      CAPTURE(name, value);
      CHECK(environment.get(name).value_or("<unset>") == value);
    }
    CHECK(environment.get("SLURM_JOB_ID") == "4242");  // the shell's own kept
    CHECK(std::getenv("PROBE_SET") == nullptr);        // nothing set in this process
  }
  CHECK_FALSE(std::filesystem::exists(canary));
  // An empty entry would add the current directory to the list: refused, naming the call and the variable.
  CHECK_THROWS_WITH(ht::Job("paths").prepend_env("LD_LIBRARY_PATH", ""),
                    Catch::Contains("prepend_env") && Catch::Contains("LD_LIBRARY_PATH"));
}
