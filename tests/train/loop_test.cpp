// The Trainer at world size 1 on real Fashion-MNIST subsets: exact resume after a preemption (at the
// preemption-check cadence), a truncated newest checkpoint skipped with a warning, knobs, bf16 on CPU.
#include <catch2/catch.hpp>

#include "train_test_support.hpp"

#include <csignal>
#include <cstdlib>
#include <malloc.h>
#include <set>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <hpctrain/train/data/idx.hpp>
#include <hpctrain/train/trainer.hpp>
#include <hpctrain/train/worker.hpp>

namespace fs = std::filesystem;

namespace {
struct SmallNetImpl : torch::nn::Module {
  torch::nn::Sequential layers{torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1)),
                               torch::nn::BatchNorm2d(8),
                               torch::nn::ReLU(),
                               torch::nn::MaxPool2d(4),
                               torch::nn::Flatten(),
                               torch::nn::Dropout(0.2),
                               torch::nn::Linear(8 * 7 * 7, 10)};
  SmallNetImpl() { register_module("layers", layers); }
  torch::Tensor forward(torch::Tensor x) { return layers->forward(x); }
};
TORCH_MODULE(SmallNet);

using train_test::fashion_subset;

/// Dropout, batch norm, AdamW, warmup + cosine, accumulation and clipping: every piece of state resume must restore.
hpctrain::Training small_training(const fs::path& run_dir) {
  return hpctrain::Training()
      .model([] { return SmallNet(); })
      .optimizer([](auto parameters) { return torch::optim::AdamW(parameters, torch::optim::AdamWOptions(3e-3)); })
      .train_data(fashion_subset("train", 512))
      .eval_data(fashion_subset("t10k", 256))
      .batch_size(hpctrain::per_rank(32))
      .gradient_accumulation(2)
      .clip_grad_norm(1.0)
      .schedule(hpctrain::LrSchedule::warmup_cosine(5, 0.1))
      .max_steps(24)
      .log_every(4)
      .checkpoint_every(5)
      .keep_checkpoints(2)
      .threads(1)
      .seed(3)
      .metric(hpctrain::metrics::accuracy)
      .report_digest(true)
      .run_dir(run_dir);
}

/// The newest checkpoint of `run_dir` loaded into a fresh model.
SmallNet final_model(const fs::path& run_dir) {
  SmallNet model;
  const hpctrain::CheckpointStore store(run_dir / "checkpoints");
  const auto saved = store.latest([](const std::string& warning) { FAIL(warning); });
  REQUIRE(saved);
  auto archive = saved->strategy_state().open(0);
  torch::serialize::InputArchive model_archive;
  archive.read("model", model_archive);
  model->load(model_archive);
  return model;
}
}  // namespace

TEST_CASE(
    "A run signalled at step 11 stops at step 12, where the ranks read the vote of step 11, and resumed ends "
    "bit-identical to an uninterrupted run",
    "[loop]") {
  TRAIN_TEST_REQUIRE_FASHION();
  const hpctrain::slurm::World world;  // rank 0 of 1
  const auto straight_dir = train_test::scratch("resume-straight");
  const auto straight = hpctrain::train(small_training(straight_dir), world);
  CHECK(straight.exit_code == hpctrain::exit_ok);
  CHECK(straight.steps_completed == 24);
  CHECK_FALSE(straight.resumed_from);

  const auto stopped_dir = train_test::scratch("resume-stopped");
  auto preempted_training = small_training(stopped_dir).on_step([](std::int64_t step) {
    if (step == 11) std::raise(SIGUSR2);  // what `scancel --signal=USR2` delivers
  });
  REQUIRE(preempted_training.preemption_check_every() == 1);  // the default: a vote every step, read one step later
  REQUIRE(preempted_training.steps_until_stop() == 2);
  const auto first = hpctrain::train(preempted_training, world);
  CHECK(first.exit_code == hpctrain::exit_requeue);
  CHECK(first.steps_completed == 12);
  CHECK(hpctrain::CheckpointStore(stopped_dir / "checkpoints").list().back().filename() == "step-0000000012");

  const auto second = hpctrain::train(small_training(stopped_dir), world);
  CHECK(second.exit_code == hpctrain::exit_ok);
  CHECK(second.resumed_from == std::optional<std::int64_t>(12));
  CHECK(second.steps_completed == 24);
  CHECK(second.eval_loss == straight.eval_loss);
  CHECK(second.eval_accuracy == straight.eval_accuracy);

  auto a = final_model(straight_dir), b = final_model(stopped_dir);
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto& item : pa) {
    CAPTURE(item.key());
    CHECK(torch::equal(item.value(), pb[item.key()]));
  }
  const auto ba = a->named_buffers(), bb = b->named_buffers();
  for (const auto& item : ba) {
    CAPTURE(item.key());
    CHECK(torch::equal(item.value(), bb[item.key()]));
  }
  CHECK(hpctrain::detail::parameters_digest(*a) == hpctrain::detail::parameters_digest(*b));
}

TEST_CASE("A truncated newest checkpoint is skipped with a warning and training resumes from the previous one",
          "[loop]") {
  TRAIN_TEST_REQUIRE_FASHION();
  const auto dir = train_test::scratch("resume-truncated");
  const hpctrain::slurm::World world;
  const auto first = hpctrain::train(small_training(dir).max_steps(10).checkpoint_every(4).keep_checkpoints(3), world);
  REQUIRE(first.exit_code == hpctrain::exit_ok);
  const hpctrain::CheckpointStore store(dir / "checkpoints");
  REQUIRE(store.list().size() == 3);  // steps 4, 8 and the final 10
  const auto newest = store.list().back() / "rank-00000.hpct";
  fs::resize_file(newest, fs::file_size(newest) / 2);

  std::optional<hpctrain::TrainResult> second;
  const auto errors = train_test::capture_stderr(
      [&] { second = hpctrain::train(small_training(dir).max_steps(12), world); }, dir / "stderr.txt");
  CHECK(second->resumed_from == std::optional<std::int64_t>(8));
  CHECK(second->steps_completed == 12);
  CHECK_THAT(errors, Catch::Contains("warning: skipping checkpoint: rank 0: [hpctrain.runtime.checkpoint] " +
                                     newest.string() + ": truncated: "));
}

TEST_CASE("bf16 autocast on CPU engages inside the step, and trains and evaluates to finite numbers", "[loop]") {
  TRAIN_TEST_REQUIRE_FASHION();
  std::set<c10::ScalarType> step_outputs, eval_outputs;
  auto training = small_training(train_test::scratch("bf16"))
                      .max_steps(4)
                      .precision(hpctrain::bf16)
                      .step([&](hpctrain::StepContext& context, const hpctrain::data::Batch& batch) {
                        auto output = context.forward(batch.inputs);
                        step_outputs.insert(output.scalar_type());
                        return context.loss(output, batch.targets);
                      })
                      .eval_step([&](hpctrain::StepContext& context, const hpctrain::data::Batch& batch) {
                        auto out = hpctrain::default_eval_step(context, batch);
                        eval_outputs.insert(out.output.scalar_type());
                        return out;
                      });
  const auto result = hpctrain::train(training, hpctrain::slurm::World{});
  CHECK(result.exit_code == hpctrain::exit_ok);
  CHECK(step_outputs == std::set<c10::ScalarType>{torch::kBFloat16});  // the Linear layer ran in bf16
  CHECK(eval_outputs == std::set<c10::ScalarType>{torch::kBFloat16});
  REQUIRE(result.eval_loss);
  CHECK(std::isfinite(*result.eval_loss));
  REQUIRE(result.eval_accuracy);
  CHECK(*result.eval_accuracy > 0.1);
}

TEST_CASE("max_eval_examples evaluates the first N examples: the loss of a 100-example eval set, from 256", "[loop]") {
  TRAIN_TEST_REQUIRE_FASHION();
  std::int64_t evaluated = 0;
  auto counting = [&](hpctrain::StepContext& context, const hpctrain::data::Batch& batch) {
    evaluated += batch.size();
    return hpctrain::default_eval_step(context, batch);
  };
  auto limited =
      small_training(train_test::scratch("eval-limited")).max_steps(4).max_eval_examples(100).eval_step(counting);
  const auto first = hpctrain::train(limited, hpctrain::slurm::World{});
  CHECK(evaluated == 100);
  // The same run whose eval set is those 100 examples: the same loss, bit for bit.
  auto subset = small_training(train_test::scratch("eval-subset")).max_steps(4).eval_data(fashion_subset("t10k", 100));
  const auto second = hpctrain::train(subset, hpctrain::slurm::World{});
  REQUIRE(first.eval_loss);
  REQUIRE(second.eval_loss);
  CHECK(*first.eval_loss == *second.eval_loss);
  // A limit above the set's size evaluates all of it; a negative one is a spec error naming the field.
  evaluated = 0;
  hpctrain::train(
      small_training(train_test::scratch("eval-over")).max_steps(1).max_eval_examples(5000).eval_step(counting),
      hpctrain::slurm::World{});
  CHECK(evaluated == 256);
  CHECK_THROWS_WITH(
      hpctrain::train(small_training(train_test::scratch("eval-negative")).max_eval_examples(-1),
                      hpctrain::slurm::World{}),
      Catch::Contains("[hpctrain.spec.training.max_eval_examples]") && Catch::Contains("must not be negative"));
}

TEST_CASE("A batch larger than a rank's share of the data is a spec error naming the batch size", "[loop]") {
  TRAIN_TEST_REQUIRE_FASHION();
  auto training =
      small_training(train_test::scratch("too-big")).batch_size(hpctrain::per_rank(1024)).gradient_accumulation(1);
  try {
    hpctrain::train(training, hpctrain::slurm::World{});
    FAIL("expected a SpecError");
  } catch (const hpctrain::SpecError& error) {
    CHECK(std::string(error.what()) ==
          "[hpctrain.spec.training.batch_size] training.batch_size = 1024 (per rank): 1024 examples per rank "
          "per step, but each rank gets only 512 examples per epoch of tensors (1 ranks); at most 512 here");
  }
  // A global batch is named as such, in the units the user typed.
  CHECK_THROWS_WITH(
      hpctrain::train(small_training(train_test::scratch("too-big-global"))
                          .batch_size(hpctrain::global(2048))
                          .gradient_accumulation(1),
                      hpctrain::slurm::World{}),
      Catch::StartsWith(
          "[hpctrain.spec.training.batch_size] training.batch_size = 2048 (global): 2048 examples per rank per "
          "step (1 ranks share it), but each rank gets only 512"));
}

TEST_CASE("CUDA graphs (--cuda-graphs) on the CPU are refused before the run starts, naming the device", "[loop]") {
  TRAIN_TEST_REQUIRE_FASHION();
  const auto run_dir = train_test::scratch("cuda-graphs-on-cpu");
  CHECK_THROWS_WITH(hpctrain::train(small_training(run_dir).cuda_graphs(true), hpctrain::slurm::World{}),
                    "[hpctrain.spec.training.cuda_graphs] training.cuda_graphs = on, with the device cpu: a CUDA graph "
                    "captures a GPU's step; this run trains on the CPU");
  CHECK_FALSE(fs::exists(run_dir / "checkpoints"));  // refused before anything was written
  CHECK_FALSE(fs::exists(run_dir / "metrics.jsonl"));
}

TEST_CASE(
    "float8 (--float8) is refused before the run starts: on the CPU naming the device, in fp32 naming the "
    "precision, with LoRA, and under the emulation seam it trains on the CPU",
    "[loop]") {
  TRAIN_TEST_REQUIRE_FASHION();
  const auto run_dir = train_test::scratch("float8-on-cpu");
  CHECK_THROWS_WITH(
      hpctrain::train(small_training(run_dir).precision(hpctrain::bf16).float8(true), hpctrain::slurm::World{}),
      "[hpctrain.spec.training.float8] training.float8 = on, with the device cpu: float8 products (at::_scaled_mm "
      "with rowwise scales) need a CUDA GPU of compute capability 8.9 or above (sm_89 Ada, sm_90 Hopper)");
  CHECK_THROWS_WITH(
      hpctrain::train(small_training(run_dir).precision(hpctrain::fp32).float8(true), hpctrain::slurm::World{}),
      "[hpctrain.spec.training.float8] training.float8 = on, with --precision fp32: float8 projections replace bf16 "
      "autocast's products; they run under --precision bf16");
  CHECK_THROWS_WITH(
      hpctrain::train(
          small_training(run_dir).precision(hpctrain::bf16).float8(true).lora(hpctrain::models::LoraConfig{}),
          hpctrain::slurm::World{}),
      "[hpctrain.spec.training.float8] training.float8 = on, with LoRA: LoRA's base is frozen and keeps "
      "its bf16 products; float8 is for a full fine-tuning's projections");
  CHECK(fs::is_empty(run_dir));  // refused before anything was written there (no checkpoint, no metrics)
  // The seam (env::test_seam::float8_emulated) lets the CPU run it, the products emulated; off again after.
  hpctrain::RunPlacement placement;
  placement.environment.set(hpctrain::env::test_seam::float8_emulated, "1");
  const auto emulated_dir = train_test::scratch("float8-emulated");
  const auto result = hpctrain::train(small_training(emulated_dir).precision(hpctrain::bf16).float8(true).max_steps(2),
                                      hpctrain::slurm::World{}, {}, placement);
  CHECK(result.exit_code == hpctrain::exit_ok);
  CHECK(hpctrain::models::float8_projections() == hpctrain::models::Float8Projections::off);
}

TEST_CASE("Training knobs forwarded on the command line replace the description's values", "[worker]") {
  const auto described = small_training("unused").batch_size(hpctrain::global(64));
  const auto knobs = hpctrain::parse_training_knobs(
      described, {"--epochs", "3", "--max-steps=40", "--batch-size", "16", "--lr", "0.01"});
  const auto training = hpctrain::with_knobs(described, knobs);
  CHECK(training.epochs() == std::optional<std::int64_t>(3));
  CHECK(training.max_steps() == std::optional<std::int64_t>(40));
  CHECK(training.batch_size().value == 16);
  CHECK(training.batch_size().scope == hpctrain::BatchScope::global);
  CHECK(training.lr() == std::optional<double>(0.01));
  CHECK(training.knobs().get<double>("lr") == 0.01);
}

TEST_CASE("A program's own knobs join the built-ins in one table, with their defaults and checks", "[worker]") {
  const auto described =
      small_training("unused").knob<std::int64_t>("warmup_steps", 100, "warm-up", hpctrain::non_negative());
  const auto table = hpctrain::training_knobs(described);
  CHECK(table.find("epochs") != nullptr);
  CHECK(table.find("warmup_steps") != nullptr);
  const auto training = hpctrain::with_knobs(described, table.with_arguments({"--warmup-steps", "7"}));
  CHECK(training.knobs().get<int>("warmup_steps") == 7);
  CHECK(hpctrain::training_knobs(training).specs().size() == table.specs().size());  // extending again adds nothing
  CHECK_THROWS_WITH(hpctrain::training_knobs(small_training("unused").knob<double>("lr", 0.1, "mine")),
                    "[hpctrain.spec.knob] lr: is declared twice (a built-in knob has this name)");
}

TEST_CASE("Every built-in knob given on the command line reaches the worker's Training", "[worker]") {
  // One row per built-in (train/builtin_knobs.hpp): a row checked at login but not applied on the workers would
  // train with the description's value silently. Each row's example is given alone, as a worker receives it.
  // (report_digest off: small_training turns it on, the row's example.)
  const auto described = small_training("unused").report_digest(false);
  const auto table = hpctrain::training_knobs(described);
  for (const auto& row : hpctrain::builtin_knobs()) {
    CAPTURE(row.name);
    REQUIRE(table.find(row.name) != nullptr);
    CHECK((row.apply != nullptr) != (row.reader != nullptr));  // applied here, or read by a named reader
    const auto flag = table.find(row.name)->flag();
    const auto configured = hpctrain::with_knobs(described, table.with_arguments({flag + "=" + row.example}));
    CHECK(row.read_back(configured, row.name) == row.example);
    CHECK(row.read_back(hpctrain::with_knobs(described, table.with_arguments({})), row.name) != row.example);
  }
  CHECK(table.specs().size() == hpctrain::builtin_knobs().size());  // small_training declares no knob of its own
}

TEST_CASE("An invalid or unknown worker argument names the knob", "[worker]") {
  auto [args, message] = GENERATE(table<std::vector<std::string>, std::string>({
      {{"--lr", "-1"}, "[hpctrain.spec.knob] --lr = -1: must be positive"},
      {{"--epoch", "3"},
       "[hpctrain.usage] unknown option --epoch (did you mean --epochs?); the knobs are: --epochs --max-steps "
       "--batch-size --gradient-accumulation --lr --seed --sharding --hsdp-group-size --shard-at-one-rank --precision "
       "--reduce-dtype "
       "--log-every "
       "--eval-every "
       "--max-eval-examples "
       "--eval-batch-size --checkpoint-every --checkpoint-async --report-digest --cuda-graphs --float8 --export-dtype "
       "--export-shard-size "
       "--wandb"},
      {{"--max-steps", "many"}, "[hpctrain.spec.knob] --max-steps = many: expected an integer"},
  }));
  CAPTURE(args);
  try {
    (void)hpctrain::parse_training_knobs(small_training("unused"), args);
    FAIL("expected an hpctrain::Error");
  } catch (const hpctrain::Error& error) {
    CHECK(std::string(error.what()) == message);
  }
}

TEST_CASE("On a CPU the Trainer keeps freed host memory: a 64 MB block comes from the heap, not from mmap", "[loop]") {
  // ctest runs each case in a process of its own: here glibc's default policy holds until train() runs.
  // How many bytes glibc mmapped for one 64 MB block (written through volatile: an unused malloc/free pair
  // may be elided by the compiler).
  const auto mapped_for_a_block = [] {
    constexpr std::size_t block = 64u << 20;
    const auto before = mallinfo2().hblkhd;
    auto* memory = static_cast<volatile char*>(std::malloc(block));
    REQUIRE(memory != nullptr);
    memory[0] = 1;
    memory[block - 1] = 1;
    const auto growth = mallinfo2().hblkhd - before;
    std::free(const_cast<char*>(memory));
    return growth;
  };
  CHECK(mapped_for_a_block() >= (64u << 20));  // the default: a block this big is mmapped (and munmapped on free)
  TRAIN_TEST_REQUIRE_FASHION();
  std::vector<std::size_t> mapped_growth;
  auto training = small_training(train_test::scratch("kept-memory"))
                      .max_steps(2)
                      .step([&](hpctrain::StepContext& context, const hpctrain::data::Batch& batch) {
                        mapped_growth.push_back(mapped_for_a_block());
                        return hpctrain::default_step(context, batch);
                      });
  REQUIRE(hpctrain::train(training, hpctrain::slurm::World{}).exit_code == hpctrain::exit_ok);
  CHECK(mapped_growth == std::vector<std::size_t>(4, 0));  // 2 steps x 2 micro-batches, none mmapped
}
