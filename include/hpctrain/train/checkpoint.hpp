#pragma once
// Checkpoints: model (parameters and buffers), optimizer state, and where the run stands (step, epoch,
// position in the epoch, seed). The schedule is a pure function of the step and the RNG is re-seeded
// from (seed, rank, step) every step, so step and seed restore both exactly.
//
// File `checkpoint-<step, 10 digits>.hpct`: a 32-byte header — magic "HPCTCKPT", format version (u32),
// CRC-32C of the payload (u32), payload size (u64), step (u64), little-endian — then the payload, a
// LibTorch archive. Written atomically: temporary file, fsync, rename, fsync of the directory; a crash
// leaves either the old set or the new one. The newest file that passes the size and CRC checks wins;
// a truncated or corrupt one is skipped with a warning.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <hpctrain/error.hpp>
#include <hpctrain/job/files.hpp>  // write_file_atomically
#include <hpctrain/train/crc32c.hpp>

namespace hpctrain {

/// Where a run stands, saved with the model and optimizer.
struct CheckpointState {
  std::int64_t step = 0;            ///< optimizer steps completed
  std::int64_t epoch = 0;           ///< epoch of the next step
  std::int64_t batch_in_epoch = 0;  ///< sampler position: batches of `epoch` already consumed
  std::int64_t seed = 0;            ///< the run's seed (RNG streams derive from seed, rank and step)
};

namespace detail {
inline constexpr char checkpoint_magic[8] = {'H', 'P', 'C', 'T', 'C', 'K', 'P', 'T'};
inline constexpr std::uint32_t checkpoint_format = 1;
inline constexpr std::size_t checkpoint_header_size = 32;

/// Step number of a checkpoint file name, or nullopt if it is not one.
inline std::optional<std::int64_t> checkpoint_step(const std::filesystem::path& path) {
  const std::string name = path.filename().string();
  if (name.size() != 26 || name.rfind("checkpoint-", 0) != 0 || path.extension() != ".hpct") return std::nullopt;
  const std::string digits = name.substr(11, 10);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  return std::stoll(digits);
}

template <class T>
T read_le(const char* p) {
  T value;
  std::memcpy(&value, p, sizeof value);
  return value;
}
}  // namespace detail

/// The checkpoints of one run: a directory of `checkpoint-<step>.hpct` files, the newest `keep` kept.
class CheckpointStore {
 public:
  /// `directory` is created on the first save; `keep` >= 1.
  explicit CheckpointStore(std::filesystem::path directory, int keep = 3) : directory_(std::move(directory)), keep_(keep) {
    detail::require(keep >= 1, "training.keep_checkpoints", keep, "must be at least 1");
  }

  /// Checkpoint files, oldest first.
  std::vector<std::filesystem::path> list() const {
    std::vector<std::pair<std::int64_t, std::filesystem::path>> found;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(directory_, ec))
      if (auto step = detail::checkpoint_step(entry.path())) found.emplace_back(*step, entry.path());
    std::sort(found.begin(), found.end());
    std::vector<std::filesystem::path> paths;
    for (auto& [step, path] : found) paths.push_back(path);
    return paths;
  }

  /// Writes a checkpoint atomically, then deletes all but the newest `keep`; returns its path.
  std::filesystem::path save(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                             const CheckpointState& state) const {
    torch::serialize::OutputArchive archive, model_archive, optimizer_archive;
    model.save(model_archive);
    optimizer.save(optimizer_archive);
    archive.write("model", model_archive);
    archive.write("optimizer", optimizer_archive);
    archive.write("step", c10::IValue(state.step));
    archive.write("epoch", c10::IValue(state.epoch));
    archive.write("batch_in_epoch", c10::IValue(state.batch_in_epoch));
    archive.write("seed", c10::IValue(state.seed));
    std::string payload;
    archive.save_to([&](const void* data, std::size_t size) {
      payload.append(static_cast<const char*>(data), size);
      return size;
    });

    std::string header(detail::checkpoint_header_size, '\0');
    const std::uint32_t crc = detail::crc32c(payload);
    const std::uint64_t size = payload.size();
    const std::uint64_t step = static_cast<std::uint64_t>(state.step);
    std::memcpy(header.data(), detail::checkpoint_magic, 8);
    std::memcpy(header.data() + 8, &detail::checkpoint_format, 4);
    std::memcpy(header.data() + 12, &crc, 4);
    std::memcpy(header.data() + 16, &size, 8);
    std::memcpy(header.data() + 24, &step, 8);

    std::filesystem::create_directories(directory_);
    const auto final_path = directory_ / fmt::format("checkpoint-{:010d}.hpct", state.step);
    detail::write_file_atomically(final_path, {header, payload}, "checkpoint");

    auto all = list();
    for (std::size_t i = 0; i + static_cast<std::size_t>(keep_) < all.size(); ++i) std::filesystem::remove(all[i]);
    return final_path;
  }

  /// Reads and verifies one checkpoint into `model` and `optimizer`; throws RuntimeError("checkpoint") naming
  /// the file and the defect, before touching either if the file is truncated or corrupt.
  CheckpointState load(const std::filesystem::path& path, torch::nn::Module& model, torch::optim::Optimizer& optimizer) const {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw RuntimeError("checkpoint", fmt::format("{}: cannot open", path.string()));
    const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    auto fail = [&](const std::string& why) { return RuntimeError("checkpoint", fmt::format("{}: {}", path.string(), why)); };
    if (bytes.size() < detail::checkpoint_header_size)
      throw fail(fmt::format("truncated: {} bytes, shorter than the {}-byte header", bytes.size(), detail::checkpoint_header_size));
    if (std::memcmp(bytes.data(), detail::checkpoint_magic, 8) != 0) throw fail("not an hpctrain checkpoint (bad magic)");
    const auto format = detail::read_le<std::uint32_t>(bytes.data() + 8);
    if (format != detail::checkpoint_format) throw fail(fmt::format("format version {} is not {}", format, detail::checkpoint_format));
    const auto crc = detail::read_le<std::uint32_t>(bytes.data() + 12);
    const auto size = detail::read_le<std::uint64_t>(bytes.data() + 16);
    if (bytes.size() - detail::checkpoint_header_size != size)
      throw fail(fmt::format("truncated: payload has {} of {} bytes", bytes.size() - detail::checkpoint_header_size, size));
    const char* payload = bytes.data() + detail::checkpoint_header_size;
    if (detail::crc32c(payload, size) != crc) throw fail("corrupt: CRC-32C of the payload does not match");

    torch::serialize::InputArchive archive, model_archive, optimizer_archive;
    archive.load_from(payload, size);
    archive.read("model", model_archive);
    archive.read("optimizer", optimizer_archive);
    model.load(model_archive);
    optimizer.load(optimizer_archive);
    CheckpointState state;
    auto read_int = [&](const char* key) {
      c10::IValue value;
      archive.read(key, value);
      return value.toInt();
    };
    state.step = read_int("step");
    state.epoch = read_int("epoch");
    state.batch_in_epoch = read_int("batch_in_epoch");
    state.seed = read_int("seed");
    return state;
  }

  /// Loads the newest valid checkpoint; each invalid newer one is skipped with a message to `warn`.
  /// Returns nullopt when there is none (a fresh run).
  std::optional<CheckpointState> load_latest(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                                             const std::function<void(const std::string&)>& warn) const {
    auto all = list();
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      try {
        return load(*it, model, optimizer);
      } catch (const RuntimeError& error) {
        warn(fmt::format("warning: skipping checkpoint: {}", error.what()));
      }
    }
    return std::nullopt;
  }

  /// The directory holding the checkpoints.
  const std::filesystem::path& directory() const { return directory_; }

 private:
  std::filesystem::path directory_;
  int keep_;
};

}  // namespace hpctrain
