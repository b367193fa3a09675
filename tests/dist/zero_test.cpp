// The ZeRO strategies across real processes over Gloo: equivalence with Replicated, sharded checkpoints
// resumed at the same and at another world size, and the errors for bad input. The ranks are
// tests/dist/programs/zero_worker.cpp; each checks its property itself and prints `key=value` lines.
#include <catch2/catch.hpp>

#include "multi_process_support.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <vector>

namespace {

using namespace hpctrain_test;
using namespace std::chrono_literals;

constexpr auto zero_worker = "hpctrain_zero_worker";

/// Starts `world` ranks of zero_worker and waits for all; their exit codes.
std::vector<int> run_ranks(Ranks& ranks, int world) {
  std::vector<int> codes;
  for (int rank = 0; rank < world; ++rank) {
    auto code = ranks.wait(rank, 300s);
    CAPTURE(rank, ranks.output(rank), ranks.errors(rank));
    REQUIRE(code.has_value());
    codes.push_back(*code);
  }
  return codes;
}

void require_all_succeed(Ranks& ranks, int world) {
  const auto codes = run_ranks(ranks, world);
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank, ranks.output(rank), ranks.errors(rank));
    REQUIRE(codes[rank] == 0);
  }
}

/// loss_<step>=<hex float> lines of rank 0, by step.
std::map<int, std::string> losses(const std::string& output) {
  std::map<int, std::string> found;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("loss_", 0) != 0) continue;
    const auto equals = line.find('=');
    found[std::stoi(line.substr(5, equals - 5))] = line.substr(equals + 1);
  }
  return found;
}

/// A scratch directory for checkpoint shards, removed file by file, deepest first (libtorch's remove_all crashes).
class ShardDirectory {
 public:
  ShardDirectory()
      : path_(fs::temp_directory_path() /
              ("hpctrain-zero-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++))) {}
  ~ShardDirectory() {
    std::error_code ec;
    std::vector<fs::path> inside;  // a run's checkpoint holds folders (bf16/): all of it, then the folder itself
    for (const auto& entry : fs::recursive_directory_iterator(path_, ec)) inside.push_back(entry.path());
    for (auto path = inside.rbegin(); path != inside.rend(); ++path)
      if (::unlink(path->c_str()) != 0) ::rmdir(path->c_str());
    ::rmdir(path_.c_str());
  }
  std::string string() const { return path_.string(); }
  fs::path shard(int rank) const {
    char name[32];
    std::snprintf(name, sizeof name, "rank-%05d.hpct", rank);
    return path_ / name;
  }

 private:
  static int& counter() {
    static int value = 0;
    return value;
  }
  fs::path path_;
};

/// Trains `world` ranks for steps [0, 12), saving after step 5 into `directory`; rank 0's losses.
std::map<int, std::string> train_and_save(const std::string& stage, int world, const ShardDirectory& directory) {
  Ranks ranks(world, {"train", stage, directory.string(), "5", "12"}, 120s, zero_worker);
  require_all_succeed(ranks, world);
  auto curve = losses(ranks.output(0));
  REQUIRE(curve.size() == 12);
  return curve;
}

/// Resumes at `world` from the checkpoint `saved_world` ranks wrote after step 5; rank 0's losses of 6..11, and
/// the archives each rank's load opened ("0,1,2,3").
std::pair<std::map<int, std::string>, std::vector<std::string>> resume(const std::string& stage, int world,
                                                                       int saved_world, const ShardDirectory& directory,
                                                                       const std::string& saved_stage = "") {
  Ranks ranks(world,
              {"train", stage, directory.string(), "-1", "12", std::to_string(saved_world), "5",
               saved_stage.empty() ? stage : saved_stage},
              120s, zero_worker);
  require_all_succeed(ranks, world);
  auto curve = losses(ranks.output(0));
  REQUIRE(curve.size() == 6);
  std::vector<std::string> opened;
  for (int rank = 0; rank < world; ++rank) {
    const std::string output = ranks.output(rank), key = fmt::format("rank {} opened_archives=", rank);
    const auto at = output.find(key);
    REQUIRE(at != std::string::npos);
    opened.push_back(output.substr(at + key.size(), output.find('\n', at) - at - key.size()));
  }
  return {curve, opened};
}

}  // namespace

TEST_CASE("ZeRO-1, ZeRO-2 and ZeRO-3 parameters equal Replicated's after 50 AdamW steps with accumulation and clipping",
          "[dist][zero]") {
  // World 3: buckets that do not divide by 3, padded shards, parameters straddling ranks.
  // SGD with momentum too: Adam is nearly blind to a uniform error in the clipping scale, SGD is not.
  const auto [stage, world, optimizer] = GENERATE(table<std::string, int, std::string>({{"zero1", 2, "adamw"},
                                                                                        {"zero1", 3, "adamw"},
                                                                                        {"zero2", 2, "adamw"},
                                                                                        {"zero2", 3, "adamw"},
                                                                                        {"zero2", 1, "adamw"},
                                                                                        {"zero1", 3, "sgd"},
                                                                                        {"zero2", 3, "sgd"},
                                                                                        {"zero3", 1, "adamw"},
                                                                                        {"zero3", 2, "adamw"},
                                                                                        {"zero3", 3, "adamw"},
                                                                                        {"zero3", 3, "sgd"},
                                                                                        {"hsdp:2", 4, "adamw"},
                                                                                        {"hsdp:2", 4, "sgd"},
                                                                                        {"hsdp:1", 2, "adamw"}}));
  CAPTURE(stage, world, optimizer);
  // hsdp:S shards within groups of S ranks: each rank holds 1/S, and the world holds W/S copies.
  const int sharded_over = stage.rfind("hsdp:", 0) == 0 ? std::stoi(stage.substr(5)) : world;
  Ranks ranks(world, {"equivalence", stage, "50", "2", optimizer}, 120s, zero_worker);
  require_all_succeed(ranks, world);
  // Each rank compared with its own Replicated run (max |ours - theirs| / max |theirs| within the worker's
  // relative_difference_bound per parameter, derived in zero_worker.cpp's equivalence_bound,
  // gradient norms within 1e-5) and with rank 0's parameters bit for bit. Optimizer state: the ranks' shards
  // together hold exactly Replicated's (padding has none), each within 5% of 1/N.
  std::size_t total = 0, replicated = 0;
  for (int rank = 0; rank < world; ++rank) {
    const auto& output = ranks.output(rank);
    CAPTURE(rank, output);
    const double difference = std::stod(value_of(output, "max_relative_difference").value());
    const double bound = std::stod(value_of(output, "relative_difference_bound").value());
    WARN(fmt::format("parameters differ from Replicated by {:.3e} relative (bound {:.0e})", difference, bound));
    REQUIRE(difference <= bound);
    if (stage == "zero3")
      CHECK(value_of(output, "master_bytes") == "0");  // the fp32 shard is the optimizer's parameter
    const auto bytes = std::stoul(value_of(output, "optimizer_state_bytes").value());
    replicated = std::stoul(value_of(output, "replicated_optimizer_state_bytes").value());
    REQUIRE(bytes > 0);
    REQUIRE(static_cast<double>(bytes) <= 1.05 * static_cast<double>(replicated) / sharded_over);
    total += bytes;
    if (stage.rfind("hsdp:", 0) != 0) continue;
    // A rank's shards are 1/S of the units (not 1/W); each step all-reduces every gradient shard (fp32: 4 bytes an
    // element) across the W/S replicas, once.
    CHECK(value_of(output, "shard_group_size") == std::to_string(sharded_over));
    CHECK(value_of(output, "replica_group_size") == std::to_string(world / sharded_over));
    const auto unit_shard = std::stol(value_of(output, "unit_shard_elements").value());
    CHECK(unit_shard > 0);
    CHECK(std::stol(value_of(output, "unit_padded_elements").value()) == sharded_over * unit_shard);
    CHECK(value_of(output, "replica_reduced_bytes_per_shard_element") == "4");
  }
  REQUIRE(total == replicated * static_cast<std::size_t>(world / sharded_over));
}

TEST_CASE("A sharded checkpoint resumed at the same world size continues bit for bit", "[dist][zero][checkpoint]") {
  const auto [stage, world] =
      GENERATE(table<std::string, int>({{"zero2", 2}, {"zero1", 3}, {"zero3", 2}, {"zero3", 3}, {"hsdp:2", 4}}));
  CAPTURE(stage, world);
  ShardDirectory directory;
  const auto uninterrupted = train_and_save(stage, world, directory);
  const auto [resumed, opened] = resume(stage, world, world, directory);
  for (const auto& [step, loss] : resumed) {
    CAPTURE(step);
    REQUIRE(loss == uninterrupted.at(step));
  }
  // Each rank reads its own archive alone (hsdp in groups of 2: a replica's archive holds no pieces, so the rank at
  // the same place in the first group's).
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    if (stage.rfind("hsdp", 0) == 0) CHECK(opened[rank] == std::to_string(rank % 2));
    else CHECK(opened[rank] == std::to_string(rank));
  }
}

TEST_CASE("A sharded checkpoint written by 4 ranks resumes at 2 and 3 on the same loss curve",
          "[dist][zero][checkpoint]") {
  // ZeRO-2 and ZeRO-3 write the same format: each resumes the other's, resharded.
  const auto [saved_stage, stage, world] = GENERATE(table<std::string, std::string, int>(
      {{"zero2", "zero2", 2},
       {"zero2", "zero2", 3},
       {"zero3", "zero3", 3},
       {"zero2", "zero3", 3},
       {"zero3", "zero2", 2},
       // Hybrid (2 shard groups of 2): the second group's archives hold no pieces; zero3, zero2 and hsdp read it.
       {"hsdp:2", "zero3", 2},
       {"hsdp:2", "zero3", 3},
       {"hsdp:2", "zero2", 3},
       {"zero3", "hsdp:2", 4},
       {"hsdp:2", "hsdp:1", 2}}));
  CAPTURE(saved_stage, stage, world);
  // Each stage's checkpoint at 4 is written once, for all the rows that resume it (a resume writes none).
  static std::map<std::string, std::pair<std::unique_ptr<ShardDirectory>, std::map<int, std::string>>> saved;
  auto& [directory, uninterrupted] = saved[saved_stage];
  if (!directory) {
    auto written = std::make_unique<ShardDirectory>();
    uninterrupted = train_and_save(saved_stage, 4, *written);
    directory = std::move(written);
  }
  const auto resumed = resume(stage, world, 4, *directory, saved_stage).first;
  double worst = 0;
  for (const auto& [step, loss] : resumed) {
    const double ours = std::strtod(loss.c_str(), nullptr),
                 theirs = std::strtod(uninterrupted.at(step).c_str(), nullptr);
    CAPTURE(step, ours, theirs);
    // fp32 with another summation order over the ranks: within 1e-5 relative.
    REQUIRE(std::abs(ours - theirs) <= 1e-5 * std::abs(theirs));
    worst = std::max(worst, std::abs(ours - theirs) / std::abs(theirs));
  }
  WARN(fmt::format("{} at 4 resumed as {} at {}: losses within {:.2e} relative (bound 1e-05)", saved_stage, stage,
                   world, worst));
}

TEST_CASE("A sharded checkpoint resumed at another world size reads on each rank only the pieces overlapping its own",
          "[dist][zero][checkpoint]") {
  const auto [saved_stage, saved_world, stage, world] =
      GENERATE(table<std::string, int, std::string, int>({{"zero2", 4, "zero2", 2},
                                                          {"zero2", 2, "zero2", 4},
                                                          {"zero3", 4, "zero3", 2},
                                                          {"zero3", 2, "zero3", 4},
                                                          {"zero3", 4, "hsdp:2", 4},
                                                          {"hsdp:2", 4, "zero3", 2}}));
  CAPTURE(saved_stage, saved_world, stage, world);
  ShardDirectory directory;
  Ranks saving(saved_world, {"train", saved_stage, directory.string(), "5", "6"}, 120s, zero_worker);
  require_all_succeed(saving, saved_world);
  const auto saved_digest = value_of(saving.output(0), "rank 0 saved_digest");
  REQUIRE(saved_digest.has_value());
  Ranks ranks(world, {"train", stage, directory.string(), "-1", "7", std::to_string(saved_world), "5", saved_stage},
              120s, zero_worker);
  require_all_succeed(ranks, world);
  for (int rank = 0; rank < world; ++rank) {
    const auto& output = ranks.output(rank);
    CAPTURE(rank, output);
    // The model restored bit for bit, whatever the world size that wrote it.
    REQUIRE(value_of(output, fmt::format("rank {} loaded_digest", rank)) == saved_digest);
    // Of the pieces, exactly this rank's elements: its masters (4 bytes each) and AdamW's two moments (8), 1.5 times
    // its optimizer state; every archive whole would be 1.5 times the whole model's state.
    const auto read = std::stol(value_of(output, fmt::format("rank {} piece_bytes_read", rank)).value());
    const auto state = std::stol(value_of(output, fmt::format("rank {} optimizer_state_bytes", rank)).value());
    WARN(fmt::format("rank {} read {} bytes of pieces, holding {} bytes of optimizer state", rank, read, state));
    REQUIRE(2 * read == 3 * state);
  }
}

namespace {

/// Copies the 2 rank files of `from` into `to` and rewrites them there as zero_index format 1 (zero_worker format1:
/// the pieces inside the archive, as the writer before the pieces region laid them out; rank 1's file with `defect`).
void copy_as_format1(const ShardDirectory& from, const ShardDirectory& to, const std::string& defect = "") {
  fs::create_directories(to.string());
  for (int rank = 0; rank < 2; ++rank) fs::copy_file(from.shard(rank), to.shard(rank));
  std::vector<std::string> arguments{"format1", to.string()};
  if (!defect.empty()) arguments.push_back(defect);
  Ranks converting(2, arguments, 60s, zero_worker);
  require_all_succeed(converting, 2);
  for (int rank = 0; rank < 2; ++rank) {  // the header's format (u32 after the magic): 1, no pieces region
    std::ifstream file(to.shard(rank), std::ios::binary);
    char header[12] = {};
    file.read(header, sizeof header);
    std::uint32_t format = 0;
    std::memcpy(&format, header + 8, 4);
    REQUIRE(format == 1);
  }
}

/// Resumes at `world` with `stage` from the checkpoint 2 ranks of `saved_stage` wrote after step 5 into `directory`.
std::vector<std::string> resume_outputs(const std::string& stage, int world, const std::string& saved_stage,
                                        const ShardDirectory& directory) {
  Ranks ranks(world, {"train", stage, directory.string(), "-1", "12", "2", "5", saved_stage}, 120s, zero_worker);
  require_all_succeed(ranks, world);
  std::vector<std::string> outputs;
  for (int rank = 0; rank < world; ++rank) outputs.push_back(ranks.output(rank));
  return outputs;
}

}  // namespace

TEST_CASE(
    "A sharded checkpoint of zero_index format 1 (its pieces inside the archive) resumes bit for bit with ZeRO-2 "
    "and ZeRO-3, at the same and at another world size",
    "[dist][zero][checkpoint]") {
  const auto [stage, world] =
      GENERATE(table<std::string, int>({{"zero2", 2}, {"zero2", 3}, {"zero3", 2}, {"zero3", 4}}));
  CAPTURE(stage, world);
  ShardDirectory format2, format1;
  Ranks saving(2, {"train", stage, format2.string(), "5", "6"}, 120s, zero_worker);
  require_all_succeed(saving, 2);
  copy_as_format1(format2, format1);
  // The same checkpoint read in both formats by `world` ranks: the current format's load is the reference.
  const auto old = resume_outputs(stage, world, stage, format1), current = resume_outputs(stage, world, stage, format2);
  const auto saved_digest = value_of(saving.output(0), "rank 0 saved_digest");
  REQUIRE(saved_digest.has_value());
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank, old[rank]);
    // The parameters as saved, bit for bit (a CRC-32C of the whole model's bytes, ZeRO-3's gathered).
    REQUIRE(value_of(old[rank], fmt::format("rank {} loaded_digest", rank)).value_or("missing") == *saved_digest);
    // The optimizer state (each of this rank's pieces' step and moments, by their bytes): at the same world size the
    // saving rank's own; at any, what the current format's load restores from the same checkpoint.
    // (Absent digests print as different words: they never compare equal.)
    const auto state = value_of(old[rank], fmt::format("rank {} loaded_state_digest", rank)).value_or("missing");
    REQUIRE(state == value_of(current[rank], fmt::format("rank {} loaded_state_digest", rank)).value_or("absent"));
    if (world == 2)
      REQUIRE(state ==
              value_of(saving.output(rank), fmt::format("rank {} saved_state_digest", rank)).value_or("absent"));
  }
  // And training goes on the same: rank 0's losses of steps 6..11 equal bit for bit.
  REQUIRE(losses(old[0]).size() == 6);
  REQUIRE(losses(old[0]) == losses(current[0]));
}

TEST_CASE(
    "A format-1 sharded checkpoint missing a piece, or holding one of the wrong length, is refused naming the "
    "file and the piece",
    "[dist][zero][errors]") {
  const auto defect = GENERATE(std::string("missing-piece"), std::string("short-piece"));
  CAPTURE(defect);
  ShardDirectory format2, format1;
  train_and_save("zero2", 2, format2);
  copy_as_format1(format2, format1, defect);
  Ranks ranks(2, {"train", "zero2", format1.string(), "-1", "12", "2", "5"}, 60s, zero_worker);
  const auto codes = run_ranks(ranks, 2);
  CAPTURE(ranks.errors(0), ranks.errors(1));
  REQUIRE(codes == std::vector<int>{1, 1});
  // The file's path, as the other checkpoint refusals name it, and the piece.
  REQUIRE_THAT(ranks.errors(1), Catch::Matchers::StartsWith("[hpctrain.runtime.checkpoint] " +
                                                            format1.shard(1).string() + ": piece 1 of parameter '") &&
                                    Catch::Matchers::Contains("': zero_piece_1 is missing or not "));
  REQUIRE_THAT(ranks.errors(0),
               Catch::Matchers::StartsWith("[hpctrain.runtime.checkpoint] 1 of 2 ranks found the checkpoint's "
                                           "pieces they read invalid (their messages name the files)"));
}

TEST_CASE("Hybrid sharding trains a GPT-2 like Replicated at world 4 in shard groups of 2", "[dist][zero][hsdp]") {
  // Untied: the blocks and both edges sharded within each pair, gradients averaged across the pairs.
  ShardDirectory directory;
  Ranks ranks(4, {"gpt2-equivalence", "hsdp:2", "20", "2", directory.string(), "keep", "untied"}, 240s, zero_worker);
  require_all_succeed(ranks, 4);
  CHECK(value_of(ranks.output(0), "sharded_units") == "5");
  for (int rank = 0; rank < 4; ++rank) {
    CAPTURE(rank, ranks.output(rank));
    const double difference = std::stod(value_of(ranks.output(rank), "max_relative_difference").value());
    const double bound = std::stod(value_of(ranks.output(rank), "relative_difference_bound").value());
    WARN(fmt::format("hsdp parameters differ from Replicated by {:.3e} relative (bound {:.0e})", difference, bound));
    REQUIRE(difference <= bound);
  }
  CHECK(value_of(ranks.output(0), "reduce_scattered_bytes_per_block_element") == "2");
}

TEST_CASE("Hybrid sharding refuses a group size that does not divide the world at setup, naming it",
          "[dist][zero][hsdp][errors]") {
  Ranks ranks(4, {"equivalence", "hsdp:3", "1", "1"}, 60s, zero_worker);
  REQUIRE(run_ranks(ranks, 4) == std::vector<int>{2, 2, 2, 2});
  for (int rank = 0; rank < 4; ++rank)
    REQUIRE_THAT(ranks.errors(rank),
                 Catch::Matchers::StartsWith("[hpctrain.spec.sharding] sharding = hsdp: hsdp_group_size = 3 "
                                             "does not divide the world of 4 ranks: the shard groups tile "
                                             "the world (--hsdp-group-size one of 1, 2, 4)"));
}

TEST_CASE("Sharding refuses a non-elementwise optimizer at setup, naming it", "[dist][zero][errors]") {
  const auto stage = GENERATE(std::string("zero1"), std::string("zero2"));
  Ranks ranks(1, {"lbfgs", stage}, 60s, zero_worker);
  REQUIRE(run_ranks(ranks, 1) == std::vector<int>{2});
  REQUIRE_THAT(ranks.errors(0), Catch::Matchers::StartsWith("[hpctrain.spec.optimizer] optimizer = LBFGS: " + stage +
                                                            " steps each rank's shard of the parameters on its own"));
}

TEST_CASE("A sharded checkpoint with a missing, corrupt or misplaced shard is refused, naming the file",
          "[dist][zero][errors]") {
  ShardDirectory directory;
  train_and_save("zero2", 2, directory);
  const auto shard0 = directory.shard(0), shard1 = directory.shard(1);
  std::string expected;
  SECTION("missing") {
    fs::remove(shard1);
    expected = "[hpctrain.runtime.checkpoint] " + shard1.string() + ": cannot open";
  }
  SECTION("corrupt") {
    std::fstream file(shard1, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(100);
    file.put('\x5a');
    file.close();
    expected = "[hpctrain.runtime.checkpoint] " + shard1.string() + ": corrupt: CRC-32C of the payload does not match";
  }
  SECTION("another rank's shard in its place") {
    fs::copy_file(shard0, shard1, fs::copy_options::overwrite_existing);
    expected = "[hpctrain.runtime.checkpoint] " + shard1.string() + ": zero_index field 'rank' is 0, expected 1";
  }
  SECTION("a flipped byte in a piece") {  // the file's last byte: the last piece's, after the archive
    const auto size = fs::file_size(shard1);
    std::fstream file(shard1, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(static_cast<std::streamoff>(size - 1));
    const char byte = static_cast<char>(file.get());
    file.seekp(static_cast<std::streamoff>(size - 1));
    file.put(static_cast<char>(byte ^ 0x10));
    file.close();
    expected = "[hpctrain.runtime.checkpoint] " + shard1.string() + ": corrupt: piece ";
  }
  SECTION("a truncated pieces region") {
    fs::resize_file(shard1, fs::file_size(shard1) - 10);
    expected = "[hpctrain.runtime.checkpoint] " + shard1.string() + ": truncated: its pieces region has ";
  }
  // At the same world size each rank reads its own file alone: rank 1 names the defect of its file; the ranks agree
  // before anything is restored, so rank 0, whose own file is sound, refuses too, naming the count. (The Trainer
  // then falls back to the previous checkpoint together: tests/faults/checkpoint_faults_test.sh.)
  Ranks ranks(2, {"train", "zero2", directory.string(), "-1", "12", "2", "5"}, 60s, zero_worker);
  const auto codes = run_ranks(ranks, 2);
  CAPTURE(ranks.errors(0), ranks.errors(1));
  REQUIRE(codes == std::vector<int>{1, 1});
  REQUIRE_THAT(ranks.errors(1), Catch::Matchers::StartsWith(expected));
  REQUIRE_THAT(ranks.errors(0),
               Catch::Matchers::StartsWith("[hpctrain.runtime.checkpoint] 1 of 2 ranks found the checkpoint's "
                                           "pieces they read invalid (their messages name the files)"));
}

TEST_CASE("Resuming a sharded checkpoint of another model is refused, naming the parameter", "[dist][zero][errors]") {
  ShardDirectory directory;
  train_and_save("zero2", 2, directory);
  Ranks ranks(2, {"other-model", "zero2", directory.string(), "2"}, 60s, zero_worker);
  const auto codes = run_ranks(ranks, 2);
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank, ranks.errors(rank));
    REQUIRE(codes[rank] == 2);
    // Each rank reads its own archive (the same world size), and names it.
    REQUIRE_THAT(ranks.errors(rank), Catch::Matchers::StartsWith(fmt::format(
                                         "[hpctrain.spec.checkpoint.parameters] checkpoint.parameters = {}: the "
                                         "checkpoint is of another model: its parameter 0 is '0.weight' [33, 16], "
                                         "this model's is '0.weight' [34, 16]",
                                         directory.shard(rank).string())));
  }
}

TEST_CASE(
    "ZeRO-3 trains a GPT-2 like Replicated, exports it unit by unit in shards (fp32 exact, bf16 rounded), and every "
    "rank reads its own slices of it back",
    "[dist][zero][zero3]") {
  // Tied embeddings (the unit outside the blocks), dropout replayed in the recomputation, accumulation, clipping.
  // SGD with momentum: the attention's key bias has an exactly zero gradient in theory, and Adam turns the
  // rounding noise there (another summation order over the ranks) into full-size steps; SGD does not.
  // Activations kept (the default, as FSDP) at world 2 and 3; recomputed in backward (activation checkpointing),
  // whole or selectively (the matrix products kept from the forward, the dropout replayed).
  // Untied, the token embedding and the head are sharded too, each gathered around its call (the model's edges).
  const auto [world, activations, tying] = GENERATE(table<int, std::string, std::string>({{2, "keep", "tied"},
                                                                                          {3, "keep", "tied"},
                                                                                          {2, "recompute", "tied"},
                                                                                          {3, "keep", "untied"},
                                                                                          {2, "recompute", "untied"},
                                                                                          {2, "selective", "tied"},
                                                                                          {2, "selective", "untied"}}));
  CAPTURE(world, activations, tying);
  ShardDirectory directory;
  Ranks ranks(world, {"gpt2-equivalence", "zero3", "50", "2", directory.string(), activations, tying}, 240s,
              zero_worker);
  require_all_succeed(ranks, world);
  CHECK(value_of(ranks.output(0), "sharded_units") ==
        (tying == "tied" ? std::string("3") : std::string("5")));  // + wte, lm_head
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank, ranks.output(rank));
    const double difference = std::stod(value_of(ranks.output(rank), "max_relative_difference").value());
    const double bound = std::stod(value_of(ranks.output(rank), "relative_difference_bound").value());
    WARN(fmt::format("parameters differ from Replicated by {:.3e} relative (bound {:.0e})", difference, bound));
    REQUIRE(difference <= bound);
  }
  // fp32 blocks, counted at the collectives per block element and micro-batch: 4 + 4 bytes gathered (forward,
  // recomputation) and 4 reduce-scattered once per step of 2 micro-batches.
  CAPTURE(ranks.output(0));
  if (tying == "tied") {
    CHECK(value_of(ranks.output(0), "gathered_bytes_per_block_element") == "8");
  } else {  // the embedding (looked up by the strategy) is gathered once a micro-batch and never in backward
    const double gathered = std::stod(value_of(ranks.output(0), "gathered_bytes_per_block_element").value());
    CHECK(gathered < 8);
    CHECK(gathered >= 4);  // 4 bytes a micro-batch, for the embedding alone
  }
  CHECK(value_of(ranks.output(0), "reduce_scattered_bytes_per_block_element") == "2");
  REQUIRE(value_of(ranks.output(0), "exported").has_value());
  // The export streams: every rank gathers one unit at a time, so the most bytes gathered at once during it are the
  // largest unit's (a whole-model gather would hold every unit's: all_units_bytes), and none stay gathered after it.
  for (int rank = 0; rank < world; ++rank) {
    const auto& output = ranks.output(rank);
    CAPTURE(rank, output);
    const auto peak = std::stoull(value_of(output, "export_peak_gathered_bytes").value());
    const auto largest = std::stoull(value_of(output, "largest_unit_bytes").value());
    WARN(fmt::format("rank {}: the export gathered at most {} bytes at once (largest unit {}, all units {})", rank,
                     peak, largest, value_of(output, "all_units_bytes").value()));
    CHECK(peak <= largest);
    CHECK(peak < std::stoull(value_of(output, "all_units_bytes").value()));
    CHECK(value_of(output, "gathered_after_export") == "0");
  }
  // Several shards of 8000 bytes (the tiny model's fp32 weights are ~75 kB) with an index.
  CHECK(std::stoi(value_of(ranks.output(0), "export_shards").value()) > 2);
  REQUIRE(fs::exists(directory.string() + "/model.safetensors.index.json"));
  // The export loaded with empty blocks, each rank reading only its slices, gathers to the same model.
  for (int rank = 0; rank < world; ++rank) CHECK(value_of(ranks.output(rank), "deferred_load_equal") == "1");
}

TEST_CASE(
    "ZeRO-3 under bf16 gathers and computes its blocks in bf16, reduce-scatters fp32 gradients every micro-batch, "
    "and trains a GPT-2 like Replicated under autocast within bf16's bounds",
    "[dist][zero][zero3][bf16]") {
  // Untied, the head is gathered in bf16 too, and so is the embedding (looked up by the strategy, never gathered in
  // backward, its gradient formed in fp32).
  const auto [world, activations, tying] = GENERATE(table<int, std::string, std::string>({{2, "keep", "tied"},
                                                                                          {3, "keep", "tied"},
                                                                                          {2, "recompute", "tied"},
                                                                                          {2, "keep", "untied"},
                                                                                          {2, "recompute", "untied"},
                                                                                          {2, "selective", "tied"}}));
  CAPTURE(world, activations, tying);
  Ranks ranks(world, {"gpt2-bf16", "10", "2", activations, tying}, 240s, zero_worker);
  require_all_succeed(ranks, world);
  for (int rank = 0; rank < world; ++rank) {
    const auto& output = ranks.output(rank);
    CAPTURE(rank, output);
    const double difference = std::stod(value_of(output, "max_relative_difference").value());
    const double norm_difference = std::stod(value_of(output, "max_grad_norm_difference").value());
    WARN(fmt::format("bf16 ZeRO-3 against Replicated: parameters {:.3e} (bound {}), gradient norms {:.3e} (bound {})",
                     difference, value_of(output, "relative_difference_bound").value(), norm_difference,
                     value_of(output, "grad_norm_difference_bound").value()));
    REQUIRE(difference <= std::stod(value_of(output, "relative_difference_bound").value()));
    REQUIRE(norm_difference <= std::stod(value_of(output, "grad_norm_difference_bound").value()));
    CHECK(value_of(output, "master_bytes") == "0");
    // Gradients held by reduce-scatters in flight: two units' at most (all of them, 4 bytes a parameter of the
    // whole model, when every reduction waited for the end of backward).
    const auto reduce_scatter_peak = std::stoull(value_of(output, "peak_reduce_scatter_bytes").value());
    CHECK(reduce_scatter_peak > 0);
    CHECK(reduce_scatter_peak <= std::stoull(value_of(output, "reduce_scatter_bytes_bound").value()));
    // After a forward, the kept activations refer to every block's gathered buffer (and the edges'), which holds
    // no memory until the block's backward; recomputation (whole or selective: the kept products are outputs, not
    // views of the weights) keeps no block's buffer. The head is never recomputed; the embedding keeps nothing (its
    // gradient needs only the ids).
    const int held = (activations == "keep" ? 3 : 0) + (tying == "untied" ? 1 : 0);  // 3 blocks, the head
    CHECK(value_of(output, "held_buffers") == std::to_string(held));
    CHECK(value_of(output, "held_bytes") == "0");
    if (tying == "untied")
      continue;  // the counts below are the blocks' alone: the embedding gathers once a micro-batch
    CHECK(value_of(output, "peak_gathered_bytes") == value_of(output, "bf16_peak_gathered_bytes"));  // half of fp32's
    // Counted at the collectives, per block element and micro-batch: 2 + 2 bytes gathered (forward, backward),
    // 4 reduce-scattered (fp32), against fp32's 4 + 4 and 4.
    CHECK(value_of(output, "gathered_bytes_per_block_element") == "4");
    CHECK(value_of(output, "reduce_scattered_bytes_per_block_element") == "4");
  }
}

TEST_CASE("ZeRO-3 refuses a model that lists no blocks, naming it", "[dist][zero][zero3][errors]") {
  Ranks ranks(1, {"no-blocks"}, 60s, zero_worker);
  REQUIRE(run_ranks(ranks, 1) == std::vector<int>{2});
  REQUIRE_THAT(ranks.errors(0),
               Catch::Matchers::StartsWith("[hpctrain.spec.sharding] sharding = zero3: the model "
                                           "(torch::nn::SequentialImpl) lists no blocks() to shard by"));
}
