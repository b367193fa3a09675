// The knob table (job/knobs.hpp): one table reads the login command's and the workers' arguments, checks
// every value with the knob named, prints --help, and validates a sweep's values by name.
#include <cstdint>
#include <string>
#include <vector>

#include <hpctrain/job/knobs.hpp>

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
      {"--per-device-train-batch-size", "(transformers' and TRL's name; here it is --batch-size, whose scope, per rank or global, "
                                        "the program declares)"},
      {"--gradient-accumulation-steps", "(transformers' and TRL's name; here the program sets it: Training::gradient_accumulation(n))"},
      {"--resume-from-checkpoint", "(transformers' name; here it is --resume [DIR], given with --submit or --local)"},
  }));
  CAPTURE(arg);
  CHECK_THROWS_WITH(knobs.with_arguments({arg, "1"}), Catch::StartsWith("[hpctrain.usage] unknown option " + arg + " " + hint));
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

TEST_CASE("Declaring a knob twice, with a malformed name or a default that fails its check is a spec error", "[knobs]") {
  auto knobs = knob_table();
  CHECK_THROWS_WITH(knobs.declare<double>("lr", 1.0, "again"), "[hpctrain.spec.knob] lr: is declared twice");
  CHECK_THROWS_WITH(knobs.declare<double>("Warmup-Steps", 1.0, ""),
                    "[hpctrain.spec.knob] Warmup-Steps: a knob name is snake_case: [a-z][a-z0-9_]*");
  CHECK_THROWS_WITH(knobs.declare<double>("beta", -1.0, "", ht::positive()),
                    "[hpctrain.spec.knob] --beta = -1: its default must be positive");
  ht::Knobs builtins;
  builtins.declare<double>("lr", 1.0, "the built-in");
  CHECK_THROWS_WITH(builtins.extend(knob_table()), "[hpctrain.spec.knob] lr: is declared twice (a built-in knob has this name)");
}

TEST_CASE("A value set in code is checked like one from the command line, and get checks the type", "[knobs]") {
  auto knobs = knob_table();
  knobs.set("lr", 0.5);
  CHECK(knobs.get<double>("lr") == 0.5);
  CHECK_THROWS_WITH(knobs.set("lr", -0.5), "[hpctrain.spec.knob] --lr = -0.5: must be positive");
  CHECK_THROWS_WITH(knobs.set("lr", std::int64_t{2}), "[hpctrain.spec.knob] --lr = 2: expected a number");
  CHECK_THROWS_WITH(knobs.get<bool>("lr"), "[hpctrain.spec.knob] --lr = 0.5: is a number; get<true or false> asks for another type");
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
  CHECK(wide.help().find("  --activation-checkpointing [true|false]\n" + std::string(30, ' ') + "recompute each block (default: false)\n") !=
        std::string::npos);
}
