// Unit tests of the train/ building blocks on real data: IDX reading (Fashion-MNIST), the sampler, token
// files, prefetch, checkpoints, the TensorBoard writer (read back by TensorBoard itself), schedules and
// the Training description's validation.
#include <catch2/catch.hpp>

#include "train_test_support.hpp"

#include <unistd.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <zlib.h>

#include <nlohmann/json.hpp>

#include <hpctrain/checksums.hpp>
#include <hpctrain/train/checkpoint/checkpoint.hpp>
#include <hpctrain/train/checkpoint/checkpoint_pieces.hpp>
#include <hpctrain/train/data/idx.hpp>
#include <hpctrain/train/data/prefetch.hpp>
#include <hpctrain/train/data/sampler.hpp>
#include <hpctrain/train/data/tokens.hpp>
#include <hpctrain/train/loggers/tensorboard.hpp>
#include <hpctrain/train/optim/schedule.hpp>
#include <hpctrain/train/progress.hpp>
#include <hpctrain/train/step_graph.hpp>
#include <hpctrain/models/blocks.hpp>
#include <hpctrain/train/precision.hpp>
#include <hpctrain/train/strategies/replicated.hpp>
#include <hpctrain/train/training.hpp>

namespace fs = std::filesystem;
using namespace std::string_literals;

namespace {
const fs::path fashion = "/usr/share/datasets/fashion-mnist";

void write_bytes(const fs::path& path, const std::vector<unsigned char>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

TEST_CASE("The Fashion-MNIST test files read as 10,000 images in [0, 1] with 1,000 labels per class", "[idx]") {
  const auto dataset =
      hpctrain::data::load_idx(fashion / "t10k-images-idx3-ubyte.gz", fashion / "t10k-labels-idx1-ubyte.gz");
  CHECK(dataset.inputs.sizes() == torch::IntArrayRef({10000, 1, 28, 28}));
  CHECK(dataset.targets.sizes() == torch::IntArrayRef({10000}));
  CHECK(dataset.inputs.min().item<float>() == 0.0f);
  CHECK(dataset.inputs.max().item<float>() == 1.0f);
  CHECK(torch::equal(torch::bincount(dataset.targets), torch::full({10}, 1000, torch::kInt64)));
}

TEST_CASE("A gzipped IDX file and its plain copy read the same", "[idx]") {
  const auto dir = train_test::scratch("idx-plain-gz");
  const std::vector<unsigned char> bytes{0, 0, 8, 1, 0, 0, 0, 4, 7, 1, 9, 3};
  write_bytes(dir / "plain", bytes);
  gzFile gz = gzopen((dir / "packed.gz").c_str(), "wb");
  gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(gz);
  const auto plain = hpctrain::data::read_idx(dir / "plain", 1);
  const auto packed = hpctrain::data::read_idx(dir / "packed.gz", 1);
  CHECK(torch::equal(plain.values, packed.values));
  CHECK(torch::equal(plain.values, torch::tensor({7, 1, 9, 3}, torch::kUInt8)));
}

TEST_CASE("A bad IDX file is rejected with the file's name and what is wrong", "[idx]") {
  const auto dir = train_test::scratch("idx-bad");
  auto [bytes, rank, reason] = GENERATE(table<std::vector<unsigned char>, int, std::string>({
      {{1, 0, 8, 3}, 3, "bad magic number 0x01000803 (an IDX file starts with two zero bytes)"},
      {{0, 0, 0x0D, 1, 0, 0, 0, 1, 0, 0, 0, 0}, 1, "element type 0x0d is not 0x08 (unsigned byte)"},
      {{0, 0, 8, 1, 0, 0, 0, 5, 1, 2, 3}, 3, "1 dimensions, expected 3"},
      {{0, 0, 8, 1, 0, 0, 0, 5, 1, 2, 3}, 1, "holds 3 data bytes, but its dimensions 5 need 5"},
      {{0, 0, 8, 2, 0, 0, 0, 2}, 2, "8 bytes is too short for a 2-dimension header"},
      {{0, 0}, 1, "2 bytes is too short for an IDX header"},
  }));
  CAPTURE(bytes, rank);
  write_bytes(dir / "bad-idx", bytes);
  CHECK(train_test::run_error([&] { hpctrain::data::read_idx(dir / "bad-idx", rank); }) ==
        "[hpctrain.runtime.data.idx] " + (dir / "bad-idx").string() + ": " + reason);
}

TEST_CASE("Images and labels of different counts are rejected naming both files", "[idx]") {
  const auto dir = train_test::scratch("idx-mismatch");
  write_bytes(dir / "images", {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 1, 5, 6});
  write_bytes(dir / "labels", {0, 0, 8, 1, 0, 0, 0, 3, 0, 1, 2});
  CHECK(train_test::run_error([&] { hpctrain::data::load_idx(dir / "images", dir / "labels"); }) ==
        fmt::format("[hpctrain.runtime.data.idx] {} holds 2 images but {} holds 3 labels", (dir / "images").string(),
                    (dir / "labels").string()));
}

TEST_CASE("The distributed sampler deals each epoch's permutation to the ranks without overlap", "[sampler]") {
  auto [size, world] = GENERATE(table<std::int64_t, int>({{100, 1}, {100, 2}, {101, 2}, {1000, 3}, {7, 4}}));
  CAPTURE(size, world);
  for (std::int64_t epoch : {0, 1}) {
    std::set<std::int64_t> seen;
    for (int rank = 0; rank < world; ++rank) {
      const hpctrain::data::DistributedSampler sampler(size, world, rank, 42);
      const auto indices = sampler.indices(epoch);
      CHECK(static_cast<std::int64_t>(indices.size()) == size / world);
      CHECK(indices == sampler.indices(epoch));  // a pure function: resuming replays it
      for (auto i : indices) {
        CHECK((i >= 0 && i < size));
        seen.insert(i);
      }
    }
    CHECK(static_cast<std::int64_t>(seen.size()) == size / world * world);
  }
  const hpctrain::data::DistributedSampler sampler(size, world, 0, 42);
  CHECK(sampler.indices(0) != sampler.indices(1));
}

TEST_CASE("A sampler rank outside the world is a spec error", "[sampler]") {
  CHECK(train_test::run_error([] { hpctrain::data::DistributedSampler(10, 2, 2, 0); }) ==
        "[hpctrain.spec.sampler.rank] sampler.rank = 2: must be in [0, 2)");
}

TEST_CASE("A token file serves windows with targets shifted by one token", "[tokens]") {
  const auto dir = train_test::scratch("tokens");
  std::vector<std::uint16_t> tokens(1000);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint16_t>(i * 7);
  std::ofstream(dir / "tokens.bin", std::ios::binary).write(reinterpret_cast<const char*>(tokens.data()), 2000);
  const auto dataset =
      hpctrain::data::tokens(dir / "tokens.bin", 10, hpctrain::data::TokenFileOptions().raw_uint16()).load();
  CHECK(dataset->size() == 99);
  const auto batch = dataset->batch({3, 0});
  CHECK(torch::equal(batch.inputs[0], torch::arange(30, 40, torch::kInt64) * 7));
  CHECK(torch::equal(batch.targets[0], torch::arange(31, 41, torch::kInt64) * 7));
  CHECK(torch::equal(batch.inputs[1], torch::arange(0, 10, torch::kInt64) * 7));
  write_bytes(dir / "odd.bin", {1, 2, 3});
  CHECK(train_test::run_error([&] {
          hpctrain::data::tokens(dir / "odd.bin", 4, hpctrain::data::TokenFileOptions().raw_uint16()).load();
        }) == fmt::format("[hpctrain.runtime.data.tokens] {}: 3 bytes is not a uint16 token file",
                          (dir / "odd.bin").string()));
  CHECK(train_test::run_error([&] { hpctrain::data::tokens(dir / "tokens.bin", 4).load(); }) ==
        fmt::format("[hpctrain.runtime.data.tokens] {}: no \"HPCTOKEN\" header (not made by prepare_tokens); for a raw "
                    "nanoGPT uint16 .bin pass TokenFileOptions().raw_uint16()",
                    (dir / "tokens.bin").string()));
}

TEST_CASE("The prefetcher hands out batches in order and passes on the producer's error", "[prefetch]") {
  hpctrain::data::Prefetcher prefetcher(
      [](std::int64_t k) {
        if (k == 5) throw std::runtime_error("batch 5 is broken");
        return hpctrain::data::Batch{torch::full({1}, k), torch::full({1}, -k)};
      },
      2, 8);
  for (std::int64_t k = 2; k < 5; ++k) CHECK(prefetcher.next().inputs.item<std::int64_t>() == k);
  CHECK(train_test::run_error([&] { prefetcher.next(); }) == "batch 5 is broken");
}

TEST_CASE("The prefetcher refuses to hand out more batches than it was asked for", "[prefetch]") {
  hpctrain::data::Prefetcher prefetcher(
      [](std::int64_t k) {
        return hpctrain::data::Batch{torch::full({1}, k), {}};
      },
      0, 1);
  CHECK(prefetcher.next().inputs.item<std::int64_t>() == 0);
  CHECK(train_test::run_error([&] { prefetcher.next(); }) == "Prefetcher::next: every batch was already taken");
}

TEST_CASE("CRC-32C matches the standard check value", "[checkpoint]") {
  CHECK(hpctrain::detail::crc32c("123456789"s) == 0xE3069283u);  // RFC 3720 B.4 / the Castagnoli check value
  // RFC 3720 B.4's other vectors: 32 bytes of zeros, of ones, ascending.
  std::string zeros(32, '\0'), ones(32, '\xFF'), ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[static_cast<std::size_t>(i)] = static_cast<char>(i);
  CHECK(hpctrain::detail::crc32c(zeros) == 0x8A9136AAu);
  CHECK(hpctrain::detail::crc32c(ones) == 0x62A8AB43u);
  CHECK(hpctrain::detail::crc32c(ascending) == 0x46DD794Eu);
}

TEST_CASE("CRC-32C by the CPU's instruction equals the byte table at every length, offset and continuation",
          "[checkpoint]") {
  CAPTURE(hpctrain::detail::crc32c_instruction_available());
  std::string bytes(4099, '\0');
  std::uint32_t state = 12345;
  for (auto& c : bytes) c = static_cast<char>((state = state * 1103515245u + 12345u) >> 16);
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  for (std::size_t offset : {0u, 1u, 3u, 7u})
    for (std::size_t size : {0u, 1u, 7u, 8u, 9u, 63u, 64u, 65u, 1000u, 4091u}) {
      CAPTURE(offset, size);
      CHECK(hpctrain::detail::crc32c_by_instruction(data + offset, size, 0xFFFFFFFFu) ==
            hpctrain::detail::crc32c_by_table(data + offset, size, 0xFFFFFFFFu));
    }
  // Continuing from a CRC equals the CRC of the whole.
  CHECK(hpctrain::detail::crc32c(data + 1000, 3099, hpctrain::detail::crc32c(data, 1000)) ==
        hpctrain::detail::crc32c(data, 4099));
}

TEST_CASE("CRC-32C combined from two parts' CRCs equals the CRC of the whole, at every split", "[checkpoint]") {
  std::string bytes(4099, '\0');
  std::uint32_t state = 777;
  for (auto& c : bytes) c = static_cast<char>((state = state * 1103515245u + 12345u) >> 16);
  for (std::size_t split : {0u, 1u, 7u, 8u, 1000u, 4098u, 4099u}) {
    CAPTURE(split);
    const auto a = hpctrain::detail::crc32c(bytes.data(), split);
    const auto b = hpctrain::detail::crc32c(bytes.data() + split, bytes.size() - split);
    CHECK(hpctrain::detail::crc32c_combine(a, b, bytes.size() - split) == hpctrain::detail::crc32c(bytes));
  }
  static_assert(hpctrain::detail::crc32c_combine(0, 0, 0) == 0);
}

namespace {
struct Checkpointed {
  torch::nn::Sequential model{torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3), torch::nn::Linear(3, 2)};
  torch::optim::Adam optimizer{model->parameters(), torch::optim::AdamOptions(1e-2)};
  void step() {
    optimizer.zero_grad();
    model->forward(torch::randn({8, 4})).pow(2).sum().backward();
    optimizer.step();
  }
};
bool same_parameters(torch::nn::Module& a, torch::nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  for (const auto& item : pa)
    if (!torch::equal(item.value(), pb[item.key()])) return false;
  auto ba = a.named_buffers(), bb = b.named_buffers();
  for (const auto& item : ba)
    if (!torch::equal(item.value(), bb[item.key()])) return false;
  return true;
}
}  // namespace

namespace {
/// What Replicated writes for rank 0, through the store's own steps: prepare, write_rank, commit.
fs::path save(const hpctrain::CheckpointStore& store, Checkpointed& checkpointed,
              const hpctrain::CheckpointState& state) {
  store.prepare(state.step);
  torch::serialize::OutputArchive archive, model_archive, optimizer_archive;
  checkpointed.model->save(model_archive);
  checkpointed.optimizer.save(optimizer_archive);
  archive.write("model", model_archive);
  archive.write("optimizer", optimizer_archive);
  const auto file = store.write_rank(state.step, 0, archive);
  return store.commit({state, 1, "replicated", {file}});
}
/// The newest valid checkpoint read back through SavedStrategyState::open, as a strategy's load does.
std::optional<hpctrain::CheckpointState> load_latest(const hpctrain::CheckpointStore& store, Checkpointed& checkpointed,
                                                     std::vector<std::string>& warnings) {
  const auto saved = store.latest([&](const std::string& w) { warnings.push_back(w); });
  if (!saved) return std::nullopt;
  auto archive = saved->strategy_state().open(0);
  torch::serialize::InputArchive model_archive, optimizer_archive;
  archive.read("model", model_archive);
  archive.read("optimizer", optimizer_archive);
  checkpointed.model->load(model_archive);
  checkpointed.optimizer.load(optimizer_archive);
  return saved->meta.state;
}
}  // namespace

TEST_CASE("A checkpoint directory restores model, optimizer state and position, and the newest K are kept",
          "[checkpoint]") {
  const auto dir = train_test::scratch("checkpoint-roundtrip");
  torch::manual_seed(1);
  Checkpointed original;
  const hpctrain::CheckpointStore store(dir, 2);
  for (std::int64_t step = 1; step <= 3; ++step) {
    original.step();
    save(store, original, {step, step / 2, step % 2, 7});
  }
  const auto directories = store.list();
  REQUIRE(directories.size() == 2);
  CHECK(directories[0].filename() == "step-0000000002");
  CHECK(directories[1].filename() == "step-0000000003");
  CHECK(fs::exists(directories[1] / "rank-00000.hpct"));
  CHECK_FALSE(fs::exists(dir / "step-0000000003.tmp"));
  const auto meta = nlohmann::json::parse(std::ifstream(directories[1] / "meta.json"));
  CHECK(meta.at("step") == 3);
  CHECK(meta.at("world_size") == 1);
  CHECK(meta.at("strategy") == "replicated");
  CHECK(meta.at("files").at(0).at("size") == fs::file_size(directories[1] / "rank-00000.hpct"));

  torch::manual_seed(2);
  Checkpointed restored;
  CHECK_FALSE(same_parameters(*original.model, *restored.model));
  std::vector<std::string> warnings;
  const auto state = load_latest(store, restored, warnings);
  REQUIRE(state);
  CHECK(warnings.empty());
  CHECK((state->step == 3 && state->epoch == 1 && state->batch_in_epoch == 1 && state->seed == 7));
  CHECK(same_parameters(*original.model, *restored.model));
  // The same next step from the same optimizer state lands on the same parameters.
  torch::manual_seed(3);
  original.step();
  torch::manual_seed(3);
  restored.step();
  CHECK(same_parameters(*original.model, *restored.model));
}

TEST_CASE("A torn or corrupt newest checkpoint is skipped with a warning and the previous one is used",
          "[checkpoint]") {
  auto [damage, file, reason] = GENERATE(table<std::string, std::string, std::string>({
      {"truncate", "rank-00000.hpct", "truncated: 132 of "},
      {"flip", "rank-00000.hpct", "corrupt: CRC-32C does not match meta.json"},
      {"no meta", "meta.json", "missing (the checkpoint was not committed)"},
      {"torn meta", "meta.json", "not a valid checkpoint description: "},
  }));
  CAPTURE(damage);
  const auto dir = train_test::scratch("checkpoint-damaged-" + damage);
  torch::manual_seed(1);
  Checkpointed original;
  const hpctrain::CheckpointStore store(dir, 3);
  original.step();
  save(store, original, {1, 0, 1, 0});
  std::vector<torch::Tensor> at_step_one;
  for (const auto& p : original.model->parameters()) at_step_one.push_back(p.detach().clone());
  original.step();
  const auto newest = save(store, original, {2, 0, 2, 0}) / file;
  const auto size = fs::file_size(newest);
  if (damage == "truncate") fs::resize_file(newest, 32 + 100);
  if (damage == "flip") {
    std::fstream stream(newest, std::ios::in | std::ios::out | std::ios::binary);
    stream.seekp(static_cast<std::streamoff>(size - 7));
    stream.put('\x5a');
  }
  if (damage == "no meta") fs::remove(newest);
  if (damage == "torn meta") fs::resize_file(newest, size / 2);
  Checkpointed restored;
  std::vector<std::string> warnings;
  const auto state = load_latest(store, restored, warnings);
  REQUIRE(state);
  CHECK(state->step == 1);
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::StartsWith("warning: skipping checkpoint: [hpctrain.runtime.checkpoint] " +
                                            newest.string() + ": " + reason));
  const auto parameters = restored.model->parameters();
  for (std::size_t i = 0; i < parameters.size(); ++i) CHECK(torch::equal(parameters[i], at_step_one[i]));
}

TEST_CASE("A directory without checkpoints means a fresh start", "[checkpoint]") {
  const hpctrain::CheckpointStore store(train_test::scratch("checkpoint-none") / "not-created-yet");
  CHECK_FALSE(store.latest([](const std::string&) { FAIL("no warning expected"); }));
}

TEST_CASE("A staging directory left by an interrupted save is not a checkpoint and goes at the next commit",
          "[checkpoint]") {
  const auto dir = train_test::scratch("checkpoint-staging");
  const hpctrain::CheckpointStore store(dir, 2);
  Checkpointed checkpointed;
  fs::create_directories(store.staging(5));
  std::ofstream(store.staging(5) / "rank-00000.hpct") << "half";
  CHECK(store.list().empty());
  save(store, checkpointed, {6, 0, 6, 0});
  CHECK_FALSE(fs::exists(store.staging(5)));
  CHECK(store.list().size() == 1);
}

TEST_CASE(
    "A checkpoint piece is read back by element ranges: only the chunks a range overlaps, each checked by its CRC-32C",
    "[checkpoint]") {
  constexpr auto chunk = hpctrain::PieceWriter::chunk_bytes;
  hpctrain::PieceWriter writer;
  const auto step = torch::tensor({7}, torch::kInt64);
  const auto values = torch::arange(3 * chunk / 4 + 5, torch::kFloat32);  // three whole chunks and 20 bytes
  CHECK(writer.add(step) == 0);
  CHECK(writer.add(values) == 1);
  // The region as the file holds it: the pieces' bytes one after the other, their CRC combined from the chunks'.
  const auto region_bytes = [&] {
    std::string bytes;
    for (std::size_t k = 0; k < writer.region().pieces.size(); ++k) bytes += writer.region().bytes(k);
    return bytes;
  };
  std::string region = region_bytes();
  CHECK(writer.region().size == region.size());
  CHECK(writer.region().crc == hpctrain::detail::crc32c(region));
  // A writer for an asynchronous save holds copies (the steps go on changing the tensors); a synchronous save's holds
  // the tensors themselves, written before anything changes them.
  auto changing = torch::arange(10, torch::kFloat32);
  hpctrain::PieceWriter copies, references(hpctrain::PieceWriter::Hold::reference);
  copies.add(changing);
  references.add(changing);
  changing.add_(1);
  CHECK(torch::equal(copies.region().pieces[0], torch::arange(10, torch::kFloat32)));
  CHECK(references.region().pieces[0].data_ptr() == changing.data_ptr());
  const auto index =
      hpctrain::detail::PieceIndex::parse(writer.index().dump(), static_cast<std::int64_t>(region.size()), "f.hpct");
  REQUIRE(index.pieces.size() == 2);
  CHECK(index.pieces[1].crcs.size() == 4);
  std::int64_t bytes_read = 0;
  const hpctrain::detail::RegionReader read = [&](std::int64_t offset, std::int64_t size, void* into) {
    std::memcpy(into, region.data() + offset, static_cast<std::size_t>(size));
    bytes_read += size;
  };
  // Elements [100000, 400000) span bytes [400000, 1600000): chunks 0 and 1, 2 MiB read for 1.2 MB asked.
  const auto part = hpctrain::detail::read_piece_range(index, read, 1, 100000, 300000, "f.hpct");
  CHECK(torch::equal(part, values.narrow(0, 100000, 300000)));
  // At most one chunk beyond the range on each side (the chunks it overlaps, counted from the piece's start).
  WARN(fmt::format("read {} bytes for {} asked (bound: asked + 2 chunks = {})", bytes_read, 300000 * 4,
                   300000 * 4 + 2 * chunk));
  CHECK(bytes_read <= 300000 * 4 + 2 * chunk);
  CHECK(bytes_read == 2 * chunk);
  CHECK(torch::equal(hpctrain::detail::read_piece_range(index, read, 0, 0, 1, "f.hpct"), step));
  CHECK(torch::equal(hpctrain::detail::read_piece_range(index, read, 1, 0, values.numel(), "f.hpct"), values));
  // A byte flipped in the piece's second chunk: a range inside the first still reads; one that overlaps it is refused.
  region[static_cast<std::size_t>(index.pieces[1].offset + chunk + 3)] ^= 0x10;
  CHECK(torch::equal(hpctrain::detail::read_piece_range(index, read, 1, 0, 1000, "f.hpct"), values.narrow(0, 0, 1000)));
  CHECK(
      train_test::run_error([&] { hpctrain::detail::read_piece_range(index, read, 1, chunk / 4 - 1, 2, "f.hpct"); }) ==
      fmt::format(
          "[hpctrain.runtime.checkpoint] f.hpct: corrupt: piece 1, bytes [{}, {}) of its {}: CRC-32C does not match",
          chunk, 2 * chunk, values.nbytes()));
  CHECK(train_test::run_error([&] {
          hpctrain::detail::read_piece_range(index, read, 1, values.numel() - 1, 2, "f.hpct");
        }) == fmt::format("[hpctrain.runtime.checkpoint] f.hpct: piece 1 holds {} elements, not [{}, {})",
                          values.numel(), values.numel() - 1, values.numel() + 1));
  // No elements, even at the piece's end (past its first chunk's start): an empty tensor, no bytes read.
  bytes_read = 0;
  CHECK(hpctrain::detail::read_piece_range(index, read, 1, values.numel(), 0, "f.hpct").numel() == 0);
  CHECK(bytes_read == 0);
  // Every number of the index is an integer in range before it is used: 8.5 is not read as 8.
  auto edited = writer.index();
  edited["chunk_bytes"] = 8.5;
  CHECK(train_test::run_error([&] {
          hpctrain::detail::PieceIndex::parse(edited.dump(), static_cast<std::int64_t>(region.size()), "f.hpct");
        }) ==
        "[hpctrain.runtime.checkpoint] f.hpct: the index of its pieces is malformed: chunk_bytes is 8.5, not an "
        "integer in [8, 67108864]");
  // chunk_bytes is capped at 64 MiB (max_chunk_bytes: a read holds at most one chunk beyond its range on each side).
  // At the cap, with CRCs of chunks that long, the index is read, and a read of one element reads its whole piece
  // (3 MiB + 20 bytes, one chunk); a multiple of 8 past the cap is refused like any field out of range.
  constexpr auto cap = hpctrain::detail::max_chunk_bytes;
  region = region_bytes();  // without the flipped byte
  edited = writer.index();
  edited["chunk_bytes"] = cap;
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& piece = index.pieces[i];
    edited["pieces"][i]["crc32c"] = {
        hpctrain::detail::crc32c(region.data() + piece.offset, static_cast<std::size_t>(piece.bytes()))};
  }
  const auto capped =
      hpctrain::detail::PieceIndex::parse(edited.dump(), static_cast<std::int64_t>(region.size()), "f.hpct");
  bytes_read = 0;
  CHECK(torch::equal(hpctrain::detail::read_piece_range(capped, read, 1, 7, 1, "f.hpct"), values.narrow(0, 7, 1)));
  WARN(fmt::format("one element at chunk_bytes {}: read {} bytes (the piece's {})", cap, bytes_read, values.nbytes()));
  CHECK(bytes_read == static_cast<std::int64_t>(values.nbytes()));
  edited["chunk_bytes"] = cap + 8;
  CHECK(train_test::run_error([&] {
          hpctrain::detail::PieceIndex::parse(edited.dump(), static_cast<std::int64_t>(region.size()), "f.hpct");
        }) ==
        "[hpctrain.runtime.checkpoint] f.hpct: the index of its pieces is malformed: chunk_bytes is 67108872, not an "
        "integer in [8, 67108864]");
  // An index that describes more bytes than the file holds after its archive: the file was cut short.
  CHECK(train_test::run_error([&] {
          hpctrain::detail::PieceIndex::parse(writer.index().dump(), static_cast<std::int64_t>(region.size()) - 8,
                                              "f.hpct");
        }) == fmt::format("[hpctrain.runtime.checkpoint] f.hpct: truncated: its pieces region has {} of {} bytes",
                          region.size() - 8, region.size()));
}

TEST_CASE("Replicated refuses a checkpoint written by a strategy it does not read, naming the field", "[checkpoint]") {
  hpctrain::Replicated replicated;  // (a sharded stage's checkpoint it reads: tests/dist/one_rank_training_test.sh)
  hpctrain::SavedStrategyState saved{2, "pipeline", [](int) -> torch::serialize::InputArchive {
                                       FAIL("must not open");
                                       return {};
                                     }};
  CHECK(train_test::run_error([&] { replicated.load(saved); }) ==
        "[hpctrain.spec.checkpoint.strategy] checkpoint.strategy = pipeline: the checkpoint was written by strategy "
        "'pipeline'; this run uses 'replicated', which resumes replicated checkpoints and the sharded stages' (zero1, "
        "zero2, zero3, hsdp)");
}

namespace {
/// Two Linear blocks and a head, the first block frozen (LoRA's base), as a model that lists its blocks.
struct FrozenBlockModel : torch::nn::Module, hpctrain::ListsBlocks {
  FrozenBlockModel() {
    for (int b = 0; b < 2; ++b)
      blocks_.push_back(register_module("block" + std::to_string(b), torch::nn::Linear(4, 4)));
    head = register_module("head", torch::nn::Linear(4, 2));
    for (auto& parameter : blocks_[0]->parameters()) parameter.set_requires_grad(false);
    for (auto& parameter : head->parameters()) parameter.set_requires_grad(false);
  }
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() override { return blocks_; }
  std::vector<std::shared_ptr<torch::nn::Module>> blocks_;
  torch::nn::Linear head{nullptr};
};

torch::serialize::InputArchive saved_archive(torch::nn::Module& model) {
  torch::serialize::OutputArchive out;
  model.save(out);
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  return in;
}
}  // namespace

TEST_CASE("Under bf16 the frozen blocks are held in bf16, and a checkpoint in either dtype loads into them",
          "[checkpoint]") {
  auto model = std::make_shared<FrozenBlockModel>();
  const auto frozen = model->blocks_[0]->named_parameters()["weight"];
  const auto values = frozen.detach().clone();
  auto fp32_checkpoint = saved_archive(*model);  // as a run in fp32, or one written before, saved them
  hpctrain::detail::hold_frozen_in_compute_dtype(*model, hpctrain::Precision::fp32);
  CHECK(frozen.scalar_type() == torch::kFloat32);  // fp32 computes in fp32: nothing to change
  hpctrain::detail::hold_frozen_in_compute_dtype(*model, hpctrain::Precision::bf16);
  for (const auto& parameter : model->blocks_[0]->parameters()) CHECK(parameter.scalar_type() == torch::kBFloat16);
  for (const auto& parameter : model->blocks_[1]->parameters()) CHECK(parameter.scalar_type() == torch::kFloat32);
  for (const auto& parameter : model->head->parameters())
    CHECK(parameter.scalar_type() == torch::kFloat32);  // no block
  hpctrain::detail::load_module(*model, fp32_checkpoint);
  const auto held = model->blocks_[0]->named_parameters()["weight"];
  CHECK(held.scalar_type() == torch::kBFloat16);
  CHECK(torch::equal(held, values.to(torch::kBFloat16)));
  auto bf16_checkpoint = saved_archive(*model);
  FrozenBlockModel fp32_run;
  hpctrain::detail::load_module(fp32_run, bf16_checkpoint);
  const auto widened = fp32_run.blocks_[0]->named_parameters()["weight"];
  CHECK(widened.scalar_type() == torch::kFloat32);
  CHECK(torch::equal(widened, values.to(torch::kBFloat16).to(torch::kFloat32)));
}

TEST_CASE("Replicated's checkpoint holds what trains: a frozen parameter is left out and keeps its value on load",
          "[checkpoint]") {
  auto model = std::make_shared<FrozenBlockModel>();
  torch::serialize::OutputArchive out;
  hpctrain::detail::save_trained(*model, out);
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  const auto holds = [&in](const std::string& child, const std::string& key) {
    torch::serialize::InputArchive child_archive;
    torch::Tensor tensor;
    return in.try_read(child, child_archive) && child_archive.try_read(key, tensor);
  };
  CHECK(holds("block1", "weight"));
  CHECK(holds("block1", "bias"));
  CHECK_FALSE(holds("block0", "weight"));  // frozen: read again from the model's source when a run resumes
  CHECK_FALSE(holds("head", "weight"));

  FrozenBlockModel resumed;  // built anew: its frozen values are its own, what trains comes from the archive
  const auto built = resumed.blocks_[0]->named_parameters()["weight"].detach().clone();
  hpctrain::detail::load_module(resumed, in);
  CHECK(torch::equal(resumed.blocks_[0]->named_parameters()["weight"], built));
  CHECK(
      torch::equal(resumed.blocks_[1]->named_parameters()["weight"], model->blocks_[1]->named_parameters()["weight"]));

  // What trains must be there: an archive without it is refused, not silently left at the built values.
  auto trainable_frozen = std::make_shared<FrozenBlockModel>();
  torch::serialize::OutputArchive frozen_only;
  for (auto& parameter : trainable_frozen->blocks_[1]->parameters()) parameter.set_requires_grad(false);
  hpctrain::detail::save_trained(*trainable_frozen, frozen_only);
  std::stringstream frozen_bytes;
  frozen_only.save_to(frozen_bytes);
  torch::serialize::InputArchive without_trained;
  without_trained.load_from(frozen_bytes);
  FrozenBlockModel needs_block1;
  CHECK_THROWS(hpctrain::detail::load_module(needs_block1, without_trained));
}

TEST_CASE("TensorBoard's own reader reads back our event file", "[tensorboard]") {
  const auto dir = train_test::scratch("tensorboard");
  fs::path file;
  {
    hpctrain::TensorBoardWriter writer(dir);
    file = writer.path();
    for (int step = 1; step <= 5; ++step) {
      writer.add_scalar("train/loss", 1.0 / step, step);
      writer.add_scalar("eval/accuracy", 0.5 + 0.1 * step, step * 10);
    }
  }
  const auto script = dir / "read.py";
  std::ofstream(script) << R"(import sys
from tensorboard.backend.event_processing import event_accumulator
acc = event_accumulator.EventAccumulator(sys.argv[1]); acc.Reload()
for tag in sorted(acc.Tags()["scalars"]):
    for e in acc.Scalars(tag): print(f"{tag} {e.step} {e.value:.6f}")
)";
  const auto output = dir / "read.txt";
  const char* configured = std::getenv("HPCTRAIN_PYTHON");
  const std::string python =
      configured && *configured ? configured : std::string(std::getenv("HOME")) + "/.cache/hpctrain/venv/bin/python";
  if (::access(python.c_str(), X_OK) != 0) {  // a skip with its reason, not a failure: the oracle is missing
    WARN("skipped: no Python with tensorboard at " << python << " (run scripts/setup, or set HPCTRAIN_PYTHON)");
    return;
  }
  const pid_t child = fork();
  if (child == 0) {
    std::freopen(output.c_str(), "w", stdout);
    execl(python.c_str(), python.c_str(), script.c_str(), file.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(child, &status, 0);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  std::ifstream in(output);
  std::string expected;
  for (int step = 1; step <= 5; ++step)
    expected += fmt::format("eval/accuracy {} {:.6f}\n", step * 10, static_cast<float>(0.5 + 0.1 * step));
  for (int step = 1; step <= 5; ++step)
    expected += fmt::format("train/loss {} {:.6f}\n", step, static_cast<float>(1.0 / step));
  CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == expected);
}

TEST_CASE("Warmup then cosine decay reaches the base rate after warmup and the final fraction at the end",
          "[schedule]") {
  const auto schedule = hpctrain::LrSchedule::warmup_cosine(10, 0.1);
  auto [step, factor] = GENERATE(
      table<std::int64_t, double>({{0, 0.1}, {4, 0.5}, {9, 1.0}, {10, 1.0}, {60, 0.55}, {110, 0.1}, {200, 0.1}}));
  CAPTURE(step);
  CHECK(schedule.factor(step, 110) == Approx(factor));
  CHECK(hpctrain::LrSchedule::constant().factor(step, 110) == 1.0);
}

TEST_CASE("Warmup then linear decay falls in a straight line from the base rate to the final fraction", "[schedule]") {
  const auto schedule = hpctrain::LrSchedule::warmup_linear(10, 0.1);
  auto [step, factor] = GENERATE(table<std::int64_t, double>(
      {{0, 0.1}, {4, 0.5}, {9, 1.0}, {10, 1.0}, {35, 0.775}, {60, 0.55}, {110, 0.1}, {200, 0.1}}));
  CAPTURE(step);
  CHECK(schedule.factor(step, 110) == Approx(factor));
  CHECK(schedule.describe() == "warmup_linear(10, 0.1)");
}

TEST_CASE("A schedule with a final fraction above one is a spec error", "[schedule]") {
  CHECK(train_test::run_error([] { hpctrain::LrSchedule::warmup_cosine(5, 1.5); }) ==
        "[hpctrain.spec.schedule.final_fraction] schedule.final_fraction = 1.5: must be in [0, 1]");
}

TEST_CASE("A progress line names step, loss, lr, throughput and ETA", "[progress]") {
  CHECK(hpctrain::format_progress({120, 2000, 1, 0.43125, 1e-3, 1234.4, 192}) ==
        "step 120/2000 epoch 1 loss 0.4313 lr 1.000e-03 1234 samples/s eta 3m12s");
}

namespace {
hpctrain::Training valid_training() {
  return hpctrain::Training()
      .model([] { return torch::nn::Linear(4, 2); })
      .optimizer([](auto parameters) { return torch::optim::SGD(parameters, 0.1); })
      .train_data(hpctrain::data::tensors(torch::randn({8, 4}), torch::zeros({8}, torch::kInt64)))
      .batch_size(hpctrain::per_rank(4))
      .epochs(1);
}
}  // namespace

TEST_CASE("An invalid training description names the field and the value", "[training]") {
  using hpctrain::Training;
  auto [broken, message] = GENERATE(table<std::function<void(Training&)>, std::string>({
      {[](Training& t) { t = Training(); },
       "[hpctrain.spec.training.model] training.model = none: a model factory is required: .model([] { return Net(); "
       "})"},
      {[](Training& t) { t.batch_size(hpctrain::per_rank(0)); },
       "[hpctrain.spec.training.batch_size] training.batch_size = 0: must be positive: "
       ".batch_size(hpctrain::per_rank(64))"},
      {[](Training& t) { t.epochs(-1); }, "[hpctrain.spec.training.epochs] training.epochs = -1: must be positive"},
      {[](Training& t) { t.max_steps(0); },
       "[hpctrain.spec.training.max_steps] training.max_steps = 0: must be positive"},
      {[](Training& t) { t.lr(-0.5); }, "[hpctrain.spec.training.lr] training.lr = -0.5: must be positive"},
      {[](Training& t) { t.clip_grad_norm(0); },
       "[hpctrain.spec.training.clip_grad_norm] training.clip_grad_norm = 0: must be positive"},
      {[](Training& t) { t.gradient_accumulation(0); },
       "[hpctrain.spec.training.gradient_accumulation] training.gradient_accumulation = 0: must be at least 1"},
      {[](Training& t) { t.log_every(0); },
       "[hpctrain.spec.training.log_every] training.log_every = 0: must be at least 1"},
      {[](Training& t) { t.batch_size(hpctrain::global(10)).gradient_accumulation(4); },
       "[hpctrain.spec.training.batch_size] training.batch_size = 10: a global batch must divide by "
       "gradient_accumulation (4)"},
  }));
  auto training = valid_training();
  REQUIRE_NOTHROW(training.validate());
  broken(training);
  CHECK(train_test::run_error([&] { training.validate(); }) == message);
}

TEST_CASE("A global batch is split across ranks and accumulation steps, and must divide evenly", "[training]") {
  auto training = valid_training().batch_size(hpctrain::global(256)).gradient_accumulation(2);
  CHECK(training.micro_batch_per_rank(1) == 128);
  CHECK(training.micro_batch_per_rank(4) == 32);
  CHECK(train_test::run_error([&] { training.micro_batch_per_rank(3); }) ==
        "[hpctrain.spec.training.batch_size] training.batch_size = 256: a global batch must divide by world size × "
        "gradient_accumulation (6)");
  CHECK(valid_training().batch_size(hpctrain::per_rank(64)).micro_batch_per_rank(8) == 64);
}

TEST_CASE("A loss from torch::nn::functional with an options parameter is called with default options", "[training]") {
  const auto training = valid_training().loss(torch::nn::functional::mse_loss);
  const auto loss = training.loss()(torch::tensor({1.0, 3.0}), torch::tensor({0.0, 0.0}));
  CHECK(loss.item<double>() == 5.0);
}

namespace {
/// A user's torch::data dataset: example i is (i, i²).
struct Squares : torch::data::datasets::Dataset<Squares> {
  torch::data::Example<> get(std::size_t index) override {
    const auto i = static_cast<double>(index);
    return {torch::full({1}, i), torch::full({1}, i * i)};
  }
  torch::optional<std::size_t> size() const override { return 6; }
};
}  // namespace

TEST_CASE("A user's torch::data dataset serves stacked batches through data::from_torch", "[data]") {
  const auto dataset = hpctrain::data::from_torch([] { return Squares(); }, "squares").load();
  CHECK(dataset->size() == 6);
  const auto batch = dataset->batch({5, 2});
  CHECK(torch::equal(batch.inputs, torch::tensor({{5.0}, {2.0}})));
  CHECK(torch::equal(batch.targets, torch::tensor({{25.0}, {4.0}})));
}

TEST_CASE(
    "The step graph replays only a batch of the captured layout, and copies every tensor of it into the "
    "graph's",
    "[graph]") {
  using hpctrain::data::Batch;
  const auto ids = [](std::int64_t rows, std::int64_t columns) {
    return torch::arange(rows * columns, torch::kLong).reshape({rows, columns});
  };
  Batch captured(ids(4, 8), ids(4, 8) + 1, {{"loss_mask", torch::ones({4, 8}, torch::kBool)}});
  CHECK(hpctrain::detail::same_layout(
      captured, Batch(ids(4, 8) * 3, ids(4, 8), {{"loss_mask", torch::zeros({4, 8}, torch::kBool)}})));
  CHECK_FALSE(hpctrain::detail::same_layout(
      captured, Batch(ids(3, 8), ids(3, 8), {{"loss_mask", torch::ones({3, 8}, torch::kBool)}})));
  CHECK_FALSE(hpctrain::detail::same_layout(captured, Batch(ids(4, 8), ids(4, 8))));  // a field missing
  CHECK_FALSE(hpctrain::detail::same_layout(
      captured, Batch(ids(4, 8), ids(4, 8), {{"other", torch::ones({4, 8}, torch::kBool)}})));
  CHECK_FALSE(hpctrain::detail::same_layout(
      captured, Batch(ids(4, 8).to(torch::kInt), ids(4, 8), {{"loss_mask", torch::ones({4, 8}, torch::kBool)}})));

  const Batch next(ids(4, 8) * 5, ids(4, 8) * 7, {{"loss_mask", torch::zeros({4, 8}, torch::kBool)}});
  const auto* where = captured.inputs.data_ptr();
  hpctrain::detail::copy_batch(captured, next, /*non_blocking=*/false);
  CHECK(captured.inputs.data_ptr() == where);  // into the graph's own tensors: a replay reads them there
  CHECK(torch::equal(captured.inputs, next.inputs));
  CHECK(torch::equal(captured.targets, next.targets));
  CHECK(torch::equal(captured.fields.at("loss_mask"), next.fields.at("loss_mask")));
}
