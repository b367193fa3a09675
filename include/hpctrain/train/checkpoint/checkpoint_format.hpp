#pragma once
// What a checkpoint directory holds besides LibTorch's archives, read without LibTorch so that tests/fuzz
// can fuzz it (train/checkpoint/checkpoint.hpp has the layout):
//  - meta.json: where the run stands and who wrote it; every field is checked (type, range, file names
//    that stay inside the checkpoint directory) before anything acts on it.
//  - the 32-byte header of each archive: magic "HPCTCKPT", format version (u32), CRC-32C of the payload
//    (u32), payload size (u64), step (u64), little-endian; the payload (a LibTorch archive) follows. Format 1:
//    nothing else; format 2: the pieces region follows the payload (train/checkpoint/checkpoint_pieces.hpp: flat
//    tensors read by byte ranges, their index and CRCs inside the payload). Nothing reaches LibTorch's reader unless
//    the size and the CRC match.
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/checksums.hpp>
#include <hpctrain/error.hpp>

namespace hpctrain {

/// A source of a training set mixed by weight (train/data/mix.hpp) and how far the run has read it.
struct SourcePosition {
  std::string name;
  std::int64_t rows = 0;  ///< the rows it holds
  double weight = 0;      ///< its weight in the mix
  /// Its draws so far: whole epochs' slots, then the slots of this epoch read (train/data/mix.hpp); past `rows`
  /// once it repeats.
  std::int64_t position = 0;
  bool operator==(const SourcePosition&) const = default;
};

/// Where a run stands, saved in meta.json.
struct CheckpointState {
  std::int64_t step = 0;                     ///< optimizer steps completed
  std::int64_t epoch = 0;                    ///< epoch of the next step
  std::int64_t batch_in_epoch = 0;           ///< sampler position: batches of `epoch` already consumed
  std::int64_t seed = 0;                     ///< the run's seed (RNG streams derive from seed, rank and step)
  std::vector<SourcePosition> data_sources;  ///< a mixed training set's sources (none for one source)
};

/// One archive of a checkpoint, as meta.json lists it.
struct CheckpointFile {
  std::string name;        ///< "rank-00000.hpct"
  std::uint64_t size = 0;  ///< bytes of the whole file
  std::uint32_t crc = 0;   ///< CRC-32C of the whole file
};

/// meta.json of a checkpoint.
struct CheckpointMeta {
  CheckpointState state;
  int world_size = 1;                 ///< ranks of the run that wrote it
  std::string strategy;               ///< DataParallelStrategy::name() of the writer
  std::vector<CheckpointFile> files;  ///< rank 0's only, unless the strategy saves per rank

  nlohmann::json to_json() const {
    nlohmann::json files_json = nlohmann::json::array();
    for (const auto& file : files)
      files_json.push_back({{"name", file.name}, {"size", file.size}, {"crc32c", file.crc}});
    nlohmann::json out = {{"format", 1},          {"step", state.step},
                          {"epoch", state.epoch}, {"batch_in_epoch", state.batch_in_epoch},
                          {"seed", state.seed},   {"world_size", world_size},
                          {"strategy", strategy}, {"files", files_json}};
    for (const auto& source : state.data_sources)
      out["data_sources"].push_back(
          {{"name", source.name}, {"rows", source.rows}, {"weight", source.weight}, {"position", source.position}});
    return out;
  }
};

namespace detail {
/// The largest world a checkpoint may claim (as the hostlist and tasks-per-node parsers: beyond any cluster).
inline constexpr std::int64_t checkpoint_max_world_size = 1 << 20;

/// meta.json's `text`, checked field by field; throws RuntimeError(errors::runtime_checkpoint) naming `path`, the field
/// and what is wrong (not JSON, a missing or mistyped field, a value out of range, a file name that is not a
/// plain name inside the checkpoint directory, more files than ranks, a file listed twice).
inline CheckpointMeta parse_checkpoint_meta(std::string_view text, const std::filesystem::path& path) {
  const auto fail = [&](const std::string& why) {
    return RuntimeError(errors::runtime_checkpoint,
                        fmt::format("{}: not a valid checkpoint description: {}", path.string(), why));
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& error) {  // parse_error, and out_of_range for a number beyond a double
    throw fail(error.what());
  }
  if (!j.is_object()) throw fail(fmt::format("a JSON object expected, not {}", j.type_name()));
  const auto field = [&](const nlohmann::json& object, const char* name) -> const nlohmann::json& {
    const auto found = object.find(name);
    if (found == object.end()) throw fail(fmt::format("field '{}' is missing", name));
    return *found;
  };
  const auto integer = [&](const nlohmann::json& object, const char* name, std::int64_t low, std::int64_t high) {
    const auto& value = field(object, name);
    // is_number_integer: a float (1.5) or a boolean would otherwise convert silently.
    if (!value.is_number_integer()) throw fail(fmt::format("field '{}' is {}, not an integer", name, value.dump()));
    if (value.is_number_unsigned() ? value.get<std::uint64_t>() > static_cast<std::uint64_t>(high)
                                   : value.get<std::int64_t>() < low || value.get<std::int64_t>() > high)
      throw fail(fmt::format("field '{}' is {}, outside [{}, {}]", name, value.dump(), low, high));
    return value.is_number_unsigned() ? static_cast<std::int64_t>(value.get<std::uint64_t>())
                                      : value.get<std::int64_t>();
  };
  const auto unsigned_integer = [&](const nlohmann::json& object, const char* name, std::uint64_t high) {
    const auto& value = field(object, name);
    if (!value.is_number_integer() || (!value.is_number_unsigned() && value.get<std::int64_t>() < 0) ||
        value.get<std::uint64_t>() > high)
      throw fail(fmt::format("field '{}' is {}, not an integer in [0, {}]", name, value.dump(), high));
    return value.get<std::uint64_t>();
  };
  constexpr auto int64_max = std::numeric_limits<std::int64_t>::max();
  if (j.contains("format") && !(j["format"].is_number_integer() && j["format"] == 1))
    throw fail(fmt::format("format {} is not 1", j["format"].dump()));
  CheckpointMeta meta;
  meta.state.step = integer(j, "step", 0, int64_max);
  meta.state.epoch = integer(j, "epoch", 0, int64_max);
  meta.state.batch_in_epoch = integer(j, "batch_in_epoch", 0, int64_max);
  meta.state.seed = integer(j, "seed", std::numeric_limits<std::int64_t>::min(), int64_max);
  meta.world_size = static_cast<int>(integer(j, "world_size", 1, checkpoint_max_world_size));
  if (const auto sources = j.find("data_sources"); sources != j.end()) {  // only a mixed training set's
    if (!sources->is_array()) throw fail(fmt::format("field 'data_sources' is {}, not an array", sources->type_name()));
    for (const auto& source : *sources) {
      if (!source.is_object())
        throw fail(fmt::format("an entry of 'data_sources' is {}, not an object", source.type_name()));
      const auto& name = field(source, "name");
      const auto& weight = field(source, "weight");
      if (!name.is_string()) throw fail(fmt::format("a data source's name is {}, not a string", name.dump()));
      if (!weight.is_number()) throw fail(fmt::format("a data source's weight is {}, not a number", weight.dump()));
      meta.state.data_sources.push_back({name.get<std::string>(), integer(source, "rows", 0, int64_max),
                                         weight.get<double>(), integer(source, "position", 0, int64_max)});
    }
  }
  const auto& strategy = field(j, "strategy");
  if (!strategy.is_string() || strategy.get_ref<const std::string&>().empty())
    throw fail(fmt::format("field 'strategy' is {}, not a strategy's name", strategy.dump()));
  meta.strategy = strategy.get<std::string>();
  const auto& files = field(j, "files");
  if (!files.is_array()) throw fail(fmt::format("field 'files' is {}, not an array", files.type_name()));
  if (files.size() > static_cast<std::size_t>(meta.world_size))
    throw fail(fmt::format("field 'files' lists {} archives for a world of {}", files.size(), meta.world_size));
  std::set<std::string> names;
  for (const auto& file : files) {
    if (!file.is_object()) throw fail(fmt::format("an entry of 'files' is {}, not an object", file.type_name()));
    const auto& name = field(file, "name");
    // A plain name: meta.json must not make the reader open a file outside the checkpoint directory.
    const bool plain =
        name.is_string() && !name.get_ref<const std::string&>().empty() &&
        name.get_ref<const std::string&>().size() <= 255 &&
        name.get_ref<const std::string&>().find_first_of(std::string_view("/\0", 2)) == std::string::npos &&
        name != "." && name != "..";
    if (!plain) throw fail(fmt::format("file name {} is not a plain file name", name.dump()));
    if (!names.insert(name.get<std::string>()).second) throw fail(fmt::format("file {} is listed twice", name.dump()));
    meta.files.push_back({name.get<std::string>(),
                          unsigned_integer(file, "size", std::numeric_limits<std::uint64_t>::max()),
                          static_cast<std::uint32_t>(unsigned_integer(file, "crc32c", 0xffffffffu))});
  }
  return meta;
}

inline constexpr char checkpoint_magic[8] = {'H', 'P', 'C', 'T', 'C', 'K', 'P', 'T'};
inline constexpr std::uint32_t checkpoint_format = 1;
/// The header's version when a pieces region follows the archive.
inline constexpr std::uint32_t checkpoint_format_with_pieces = 2;
inline constexpr std::size_t checkpoint_header_size = 32;

template <class T>
T read_le(const char* p) {
  T value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

/// A checked archive: the payload (a view into the bytes given) and the step its header records.
struct CheckpointPayload {
  std::string_view payload;
  std::uint64_t step = 0;
  std::uint32_t format = checkpoint_format;
};

/// What a checkpoint file's 32-byte header says; throws RuntimeError(errors::runtime_checkpoint) naming `path` and the
/// defect (truncated, bad magic, unknown format version).
struct CheckpointHeader {
  std::uint32_t format = checkpoint_format;
  std::uint32_t crc = 0;           ///< of the payload
  std::uint64_t payload_size = 0;  ///< the archive's bytes; a format-2 file's pieces region follows them
  std::uint64_t step = 0;

  static CheckpointHeader parse(std::string_view bytes, const std::filesystem::path& path) {
    auto fail = [&](const std::string& why) {
      return RuntimeError(errors::runtime_checkpoint, fmt::format("{}: {}", path.string(), why));
    };
    if (bytes.size() < checkpoint_header_size)
      throw fail(
          fmt::format("truncated: {} bytes, shorter than the {}-byte header", bytes.size(), checkpoint_header_size));
    if (std::memcmp(bytes.data(), checkpoint_magic, 8) != 0) throw fail("not an hpctrain checkpoint (bad magic)");
    CheckpointHeader header;
    header.format = read_le<std::uint32_t>(bytes.data() + 8);
    if (header.format != checkpoint_format && header.format != checkpoint_format_with_pieces)
      throw fail(fmt::format("format version {} is not {} or {}", header.format, checkpoint_format,
                             checkpoint_format_with_pieces));
    header.crc = read_le<std::uint32_t>(bytes.data() + 12);
    header.payload_size = read_le<std::uint64_t>(bytes.data() + 16);
    header.step = read_le<std::uint64_t>(bytes.data() + 24);
    return header;
  }
};

/// Checks the header and payload of a checkpoint file's first bytes `bytes` (the whole file for format 1; at least
/// the header and the payload for format 2, whose pieces region follows); throws
/// RuntimeError(errors::runtime_checkpoint) naming `path` and the defect (truncated, bad magic, other format version,
/// size or CRC mismatch).
inline CheckpointPayload verify_checkpoint(std::string_view bytes, const std::filesystem::path& path) {
  auto fail = [&](const std::string& why) {
    return RuntimeError(errors::runtime_checkpoint, fmt::format("{}: {}", path.string(), why));
  };
  const auto header = CheckpointHeader::parse(bytes, path);
  const auto held = bytes.size() - checkpoint_header_size;
  if (header.format == checkpoint_format ? held != header.payload_size : held < header.payload_size)
    throw fail(fmt::format("truncated: payload has {} of {} bytes", std::min<std::uint64_t>(held, header.payload_size),
                           header.payload_size));
  const std::string_view payload = bytes.substr(checkpoint_header_size, header.payload_size);
  if (crc32c(payload.data(), payload.size()) != header.crc)
    throw fail("corrupt: CRC-32C of the payload does not match");
  return {payload, header.step, header.format};
}
}  // namespace detail
}  // namespace hpctrain
