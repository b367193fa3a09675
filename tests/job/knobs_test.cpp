// The knob table (job/knobs.hpp): one table reads the login command's and the workers' arguments, checks
// every value with the knob named, prints --help, and validates a sweep's values by name.
#include <cstdint>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

#include <hpctrain/job/knobs.hpp>
#include <hpctrain/job/setting.hpp>
#include <hpctrain/job/stage_knobs.hpp>
#include <hpctrain/job/sweep.hpp>

#include <catch2/catch.hpp>

namespace ht = hpctrain;

namespace {
ht::Knobs knob_table() {
  ht::Knobs knobs;
  knobs.declare_optional<std::int64_t>("epochs", "passes over the data", ht::positive())
      .declare<double>("lr", 1e-3, "base learning rate", ht::positive())
      .declare<std::int64_t>("warmup_steps", 100, "steps of linear warm-up", ht::non_negative())
      .declare<double>("dropout", 0.1, "dropout probability", ht::between(0, 1))
      .declare<bool>("compile", false, "a switch")
      .declare<std::string>("optimizer", "adamw", "adamw or sgd",
                            ht::KnobCheck<std::string>([](const std::string& v) { return v == "adamw" || v == "sgd"; },
                                                       "must be adamw or sgd"));
  return knobs;
}
}  // namespace

TEST_CASE("Knobs given as --name value, --name=value or a bare switch are read with their types", "[knobs]") {
  const auto knobs = knob_table().with_arguments(
      {"--epochs", "3", "--lr=0.01", "--warmup-steps", "0", "--compile", "--optimizer", "sgd", "--dropout", "1"});
  CHECK(knobs.get<std::int64_t>("epochs") == 3);
  CHECK(knobs.get<int>("epochs") == 3);
  CHECK(knobs.get<double>("lr") == 0.01);
  CHECK(knobs.get<std::int64_t>("warmup_steps") == 0);
  CHECK(knobs.get<bool>("compile"));
  CHECK(knobs.get<std::string>("optimizer") == "sgd");
  CHECK(knobs.get<double>("dropout") == 1.0);
  CHECK(knobs.given("lr"));
  CHECK(knobs.arguments() == std::vector<std::string>{"--epochs=3", "--lr=0.01", "--warmup-steps=0", "--dropout=1",
                                                      "--compile=true", "--optimizer=sgd"});
}

TEST_CASE("A knob that was not given has its default, or none when it was declared without one", "[knobs]") {
  const auto knobs = knob_table().with_arguments({});
  CHECK(knobs.get<double>("lr") == 1e-3);
  CHECK_FALSE(knobs.given("lr"));
  CHECK(knobs.get_if_given<std::int64_t>("epochs") == std::nullopt);
  CHECK_THROWS_WITH(knobs.get<std::int64_t>("epochs"),
                    "[hpctrain.spec.knob] --epochs = (not given): has no default; check given() first");
  CHECK(knobs.arguments().empty());
}

TEST_CASE("An invalid knob value names the knob, the value and the reason", "[knobs]") {
  auto [args, message] = GENERATE(table<std::vector<std::string>, std::string>({
      {{"--lr", "-1"}, "[hpctrain.spec.knob] --lr = -1: must be positive"},
      {{"--lr=0"}, "[hpctrain.spec.knob] --lr = 0: must be positive"},
      {{"--lr", "fast"}, "[hpctrain.spec.knob] --lr = fast: expected a number"},
      {{"--lr", "nan"}, "[hpctrain.spec.knob] --lr = nan: expected a number"},
      {{"--epochs", "2.5"}, "[hpctrain.spec.knob] --epochs = 2.5: expected an integer"},
      {{"--epochs", "0"}, "[hpctrain.spec.knob] --epochs = 0: must be positive"},
      {{"--warmup-steps", "-5"}, "[hpctrain.spec.knob] --warmup-steps = -5: must not be negative"},
      {{"--dropout", "1.5"}, "[hpctrain.spec.knob] --dropout = 1.5: must be between 0 and 1"},
      {{"--compile=maybe"}, "[hpctrain.spec.knob] --compile = maybe: expected true or false"},
      {{"--optimizer", "lamb"}, "[hpctrain.spec.knob] --optimizer = lamb: must be adamw or sgd"},
  }));
  CAPTURE(args);
  try {
    (void)knob_table().with_arguments(args);
    FAIL("expected a SpecError");
  } catch (const ht::SpecError& error) {
    CHECK(std::string(error.what()) == message);
    CHECK(error.id() == "hpctrain.spec.knob");
  }
}

TEST_CASE("An unknown or incomplete argument is a usage error naming it and the closest knob", "[knobs]") {
  auto [args, message] = GENERATE(table<std::vector<std::string>, std::string>({
      {{"--epoch", "3"},
       "[hpctrain.usage] unknown option --epoch (did you mean --epochs?); the knobs are: --epochs --lr --warmup-steps "
       "--dropout --compile --optimizer"},
      {{"--momentum=0.9"},
       "[hpctrain.usage] unknown option --momentum; the knobs are: --epochs --lr --warmup-steps --dropout --compile "
       "--optimizer"},
      {{"3"}, "[hpctrain.usage] unexpected argument '3'; training knobs are given as --name value"},
      {{"--lr"}, "[hpctrain.usage] --lr needs a value (a number)"},
  }));
  CAPTURE(args);
  try {
    (void)knob_table().with_arguments(args);
    FAIL("expected a UsageError");
  } catch (const ht::UsageError& error) {
    CHECK(std::string(error.what()) == message);
  }
}

TEST_CASE("transformers' and TRL's spellings of a knob name the knob that means the same", "[knobs]") {
  auto knobs = knob_table();
  knobs.declare<std::int64_t>("batch_size", 8, "examples per step");
  auto [arg, hint] = GENERATE(table<std::string, std::string>({
      {"--learning-rate", "(transformers' and TRL's name; here it is --lr)"},
      {"--num_train_epochs", "(transformers' and TRL's name; here it is --epochs)"},
      {"--per-device-train-batch-size",
       "(transformers' and TRL's name; here it is --batch-size, whose scope, per rank or global, "
       "the program declares)"},
      {"--gradient-accumulation-steps",
       "(transformers' and TRL's name; here the program sets it: Training::gradient_accumulation(n))"},
      {"--resume-from-checkpoint", "(transformers' name; here it is --resume [DIR], given with --submit or --local)"},
  }));
  CAPTURE(arg);
  CHECK_THROWS_WITH(knobs.with_arguments({arg, "1"}),
                    Catch::StartsWith("[hpctrain.usage] unknown option " + arg + " " + hint));
  // A spelling whose knob this program does not have gets no hint.
  CHECK_THROWS_WITH(knob_table().with_arguments({"--per-device-train-batch-size", "1"}),
                    Catch::StartsWith("[hpctrain.usage] unknown option --per-device-train-batch-size; the knobs are"));
}

TEST_CASE("A sweep validates values by knob name with the same table", "[knobs]") {
  const auto knobs = knob_table();
  CHECK(std::get<double>(knobs.validate("lr", "3e-4")) == 3e-4);
  CHECK(std::get<std::int64_t>(knobs.validate("warmup-steps", "10")) == 10);
  CHECK_THROWS_WITH(knobs.validate("lr", "-3e-4"), "[hpctrain.spec.knob] --lr = -3e-4: must be positive");
  CHECK_THROWS_WITH(knobs.validate("lrr", "1"), "[hpctrain.spec.knob] lrr: no such knob (did you mean --lr?)");
}

TEST_CASE("Declaring a knob twice, with a malformed name or a default that fails its check is a spec error",
          "[knobs]") {
  auto knobs = knob_table();
  CHECK_THROWS_WITH(knobs.declare<double>("lr", 1.0, "again"), "[hpctrain.spec.knob] lr: is declared twice");
  CHECK_THROWS_WITH(knobs.declare<double>("Warmup-Steps", 1.0, ""),
                    "[hpctrain.spec.knob] Warmup-Steps: a knob name is snake_case: [a-z][a-z0-9_]*");
  CHECK_THROWS_WITH(knobs.declare<double>("beta", -1.0, "", ht::positive()),
                    "[hpctrain.spec.knob] --beta = -1: its default must be positive");
  ht::Knobs builtins;
  builtins.declare<double>("lr", 1.0, "the built-in");
  CHECK_THROWS_WITH(builtins.extend(knob_table()),
                    "[hpctrain.spec.knob] lr: is declared twice (a built-in knob has this name)");
}

TEST_CASE("A value set in code is checked like one from the command line, and get checks the type", "[knobs]") {
  auto knobs = knob_table();
  knobs.set("lr", 0.5);
  CHECK(knobs.get<double>("lr") == 0.5);
  CHECK_THROWS_WITH(knobs.set("lr", -0.5), "[hpctrain.spec.knob] --lr = -0.5: must be positive");
  CHECK_THROWS_WITH(knobs.set("lr", std::int64_t{2}), "[hpctrain.spec.knob] --lr = 2: expected a number");
  CHECK_THROWS_WITH(knobs.get<bool>("lr"),
                    "[hpctrain.spec.knob] --lr = 0.5: is a number; get<true or false> asks for another type");
}

TEST_CASE("Knobs::help lists every knob with its type, default and requirement", "[knobs]") {
  const auto help = knob_table().help();
  CHECK(help.find("  --epochs N                  passes over the data (must be positive)\n") != std::string::npos);
  CHECK(help.find("  --lr X                      base learning rate (default: 0.001; must be positive)\n") !=
        std::string::npos);
  CHECK(help.find("  --compile [true|false]      a switch (default: false)\n") != std::string::npos);
  CHECK(help.find("  --optimizer TEXT            adamw or sgd (default: adamw; must be adamw or sgd)\n") !=
        std::string::npos);
  // A flag wider than the column: its text on the next line, in the column.
  ht::Knobs wide;
  wide.declare<bool>("activation_checkpointing", false, "recompute each block");
  CHECK(wide.help().find("  --activation-checkpointing [true|false]\n" + std::string(30, ' ') +
                         "recompute each block (default: false)\n") != std::string::npos);
}

TEST_CASE("A knob's flag is spelled in one place, both ways, and a sweep's arguments use it", "[knobs]") {
  CHECK(ht::knob_flag("warmup_steps") == "--warmup-steps");
  CHECK(ht::knob_name("warmup-steps") == "warmup_steps");
  CHECK(ht::knob_name("warmup_steps") == "warmup_steps");
  CHECK(knob_table().find("warmup-steps")->flag() == "--warmup-steps");
  const auto sweep = ht::unchecked_sweep(ht::Sweep().grid("warmup_steps", {0, 10}));
  REQUIRE(sweep.args.size() == 2);
  CHECK(sweep.args[0] == std::vector<std::string>{"--warmup-steps=0"});
  // A Setting from a knob names the knob by its flag when the knob's path is empty.
  const ht::Setting<std::filesystem::path> path(ht::knob("inline_test_path", "", "a path"));
  CHECK_THROWS_WITH(path.get(ht::detail::inline_knobs()),
                    "[hpctrain.spec.knob] --inline-test-path: is required (a path)");
}

TEST_CASE(
    "A knob declared where it is used has its type from its default, reads the given value, and joins run()'s table",
    "[knobs]") {
  const auto windows = ht::knob("inline_test_windows", 128, "tokens per window", ht::positive());
  const auto prompt = ht::knob("inline_test_prompt", "Q: ", "prompt");
  const auto decay = ht::knob("inline_test_decay", 0.1, "weight decay", ht::non_negative());
  const auto packing = ht::knob("inline_test_packing", false, "a switch");
  static_assert(std::is_same_v<decltype(windows), const ht::Knob<std::int64_t>>);
  static_assert(std::is_same_v<decltype(prompt), const ht::Knob<std::string>>);
  CHECK(windows.flag() == "--inline-test-windows");

  // The table hpctrain::run extends with them (train/worker.hpp): --help lists them, the command line wins.
  ht::Knobs table = knob_table();
  table.extend(ht::detail::inline_knobs());
  CHECK_THAT(table.help(), Catch::Contains("--inline-test-windows N") &&
                               Catch::Contains("tokens per window (default: 128; must be positive)"));
  const auto given = table.with_arguments({"--inline-test-windows", "64", "--inline-test-packing"});
  CHECK(windows(given) == 64);
  CHECK(windows(table) == 128);  // not given: the default
  CHECK(prompt(given) == "Q: ");
  CHECK(decay(given) == 0.1);
  CHECK(packing(given));
  CHECK(ht::Setting<std::int64_t>(windows).get(given) == 64);
  CHECK(ht::Setting<std::int64_t>(std::int64_t{7}).get(given) == 7);  // a value written in the program
  CHECK_THROWS_WITH(table.with_arguments({"--inline-test-windows", "0"}),
                    "[hpctrain.spec.knob] --inline-test-windows = 0: must be positive");
}

TEST_CASE(
    "The same inline declaration again is the same knob, and the same name with another default or help is a spec "
    "error",
    "[knobs]") {
  ht::knob("inline_test_twice", 256, "tokens per example", ht::at_least(8));
  CHECK(ht::knob("inline_test_twice", 256, "tokens per example", ht::at_least(8)).name() == "inline_test_twice");
  CHECK_THROWS_WITH(ht::knob("inline_test_twice", 512, "tokens per example", ht::at_least(8)),
                    "[hpctrain.spec.knob] --inline-test-twice: is declared twice: default 256, \"tokens per example\" "
                    "and default 512, \"tokens per example\"");
  CHECK_THROWS_WITH(ht::knob("inline_test_twice", 256, "other help", ht::at_least(8)),
                    Catch::StartsWith("[hpctrain.spec.knob] --inline-test-twice: is declared twice"));
  CHECK_THROWS_WITH(ht::knob("Inline-Bad", 1, "help"),
                    Catch::StartsWith("[hpctrain.spec.knob] Inline-Bad: a knob name is snake_case"));
  CHECK_THROWS_WITH(ht::knob("inline_test_bad_default", -1, "help", ht::positive()),
                    "[hpctrain.spec.knob] --inline-test-bad-default = -1: its default must be positive");
}

// A chain of stages that train different descriptions (hpctrain::run over stages, job/stage_knobs.hpp): one command
// line, `--lr` for every stage that has it, `--dpo.lr` for one; each stage keeps its own default otherwise.
namespace {
std::vector<ht::StageKnobs> sft_then_dpo() {
  ht::Knobs sft, dpo;
  sft.declare<double>("lr", 3e-4, "base learning rate", ht::positive())
      .declare<std::int64_t>("epochs", 3, "passes", ht::positive())
      .declare<std::string>("data", "", "SFT data");
  dpo.declare<double>("lr", 5e-6, "base learning rate", ht::positive())
      .declare<std::int64_t>("epochs", 3, "passes", ht::positive())
      .declare<double>("beta", 0.1, "DPO's beta", ht::positive());
  return {{"sft", sft}, {"dpo", dpo}};
}
}  // namespace

TEST_CASE("A chain's knobs: a knob for every stage that has it, --<stage>.<knob> for one, else each stage's default",
          "[knobs][stages]") {
  const auto stages = sft_then_dpo();
  const auto chain = ht::chain_knob_table(stages);
  // Not given: each stage's own default, the shared one alike.
  auto sft = ht::stage_knob_values(chain.with_arguments({}), stages[0], "");
  auto dpo = ht::stage_knob_values(chain.with_arguments({}), stages[1], "sft=/jobs/sft/7");
  CHECK(sft.get<double>("lr") == 3e-4);
  CHECK(dpo.get<double>("lr") == 5e-6);
  CHECK(dpo.get<std::int64_t>("epochs") == 3);
  CHECK(sft.find("beta") == nullptr);  // a stage's values hold its own knobs only
  // --epochs for both, --dpo.lr and --dpo.epochs for one, and the stage's own wins over the shared one.
  const auto given = chain.with_arguments({"--epochs", "2", "--dpo.lr=1e-6", "--dpo.epochs", "1", "--beta", "0.2"});
  sft = ht::stage_knob_values(given, stages[0], "");
  dpo = ht::stage_knob_values(given, stages[1], "");
  CHECK(sft.get<std::int64_t>("epochs") == 2);
  CHECK(sft.get<double>("lr") == 3e-4);
  CHECK(dpo.get<std::int64_t>("epochs") == 1);
  CHECK(dpo.get<double>("lr") == 1e-6);
  CHECK(dpo.get<double>("beta") == 0.2);
  // What the workers get is what the login read: the arguments round-trip.
  const auto forwarded = chain.with_arguments(given.arguments());
  CHECK(ht::stage_knob_values(forwarded, stages[1], "").get<double>("lr") == 1e-6);
  // Every value checked with the stage's own check, and an unknown stage's knob refused with the closest name.
  CHECK_THROWS_WITH(chain.with_arguments({"--dpo.lr", "-1"}), Catch::Contains("--dpo.lr = -1"));
  CHECK_THROWS_WITH(chain.with_arguments({"--dpo.data", "x"}), Catch::Contains("unknown option --dpo.data"));
  // --help: one line per knob (the defaults that differ named by stage), one paragraph for the stages' own.
  const auto help = chain.help();
  CHECK_THAT(help, Catch::Contains("base learning rate (default: sft 0.0003, dpo 5e-06) (must be positive)"));
  CHECK_THAT(help, Catch::Contains("passes (default: 3; must be positive)"));
  CHECK_THAT(help, Catch::Contains("--<stage>.<knob> sets it for one stage of the chain (sft, dpo)"));
  CHECK_THAT(help, !Catch::Contains("--dpo.beta"));
  CHECK(chain.with_arguments({}).arguments().empty());  // nothing given, nothing forwarded
}

TEST_CASE("A chain's knob of two types is refused, naming both stages", "[knobs][stages]") {
  auto stages = sft_then_dpo();
  stages[1].table.declare<std::int64_t>("data", 0, "a number here");
  CHECK_THROWS_WITH(ht::chain_knob_table(stages),
                    Catch::Contains("--data") && Catch::Contains("is a text in stage sft and an integer in stage dpo"));
}

TEST_CASE("stage_dir reads an earlier stage's directory from a later stage's values, and refuses anywhere else",
          "[knobs][stages]") {
  const auto stages = sft_then_dpo();
  const auto chain = ht::chain_knob_table(stages).with_arguments({});
  const ht::Setting<std::filesystem::path> from = ht::stage_dir("sft") / "export";
  CHECK(from.get(ht::stage_knob_values(chain, stages[1], "pre=/a\nsft=/jobs/sft/7")) ==
        std::filesystem::path("/jobs/sft/7/export"));
  CHECK_THROWS_WITH(from.get(ht::stage_knob_values(chain, stages[1], "pre=/a")),
                    Catch::Contains("stage_dir(\"sft\")") && Catch::Contains("(earlier: pre)"));
  CHECK_THROWS_WITH(from.get(ht::stage_knob_values(chain, stages[0], "")),
                    Catch::Contains("no stage runs before this one"));
  CHECK_THROWS_WITH(from.get(stages[0].table), Catch::Contains("only a later stage of hpctrain::run's stages"));
}
