#pragma once
// W&B's offline run file, `run-<id>.wandb`, written without wandb or protobuf: `wandb_internal.Record` messages
// (wandb/proto/wandb_internal.proto; the field numbers are in the encoders below, checked by reading our files
// back with wandb's own reader in tests/loggers) in wandb's transaction log, the LevelDB log format of
// wandb/sdk/internal/datastore.py and wandb-core's core/pkg/leveldb:
//
//   file   := header block*           header := ":W&B" | 0xBEE1 (uint16) | version 0 (uint8)
//   block  := chunk* zeros?           32 KiB; a tail shorter than a chunk header is zero-filled
//   chunk  := crc32 (uint32) | length (uint16) | type (uint8: FULL 1, FIRST 2, MIDDLE 3, LAST 4) | data
//
// all little-endian, the CRC-32 (IEEE, zlib's) taken over the type byte and the data; a record that does not fit
// the rest of its block is split into FIRST, MIDDLE..., LAST chunks. Every record is written whole and flushed:
// a run killed mid-way leaves a file that reads back up to its last record, and `wandb sync` uploads it (a file
// without an exit record marks the run failed). Torch-free.
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/checksums.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/train/loggers/protobuf_wire.hpp>

namespace hpctrain {

/// One key of a config, history or summary record: the key ("train/loss") and its value as JSON text.
struct WandbItem {
  std::string key;
  std::string value_json;
};

/// A number as W&B's JSON spells it: the shortest text that reads back to the same double, and NaN, Infinity,
/// -Infinity for the values plain JSON lacks (wandb-core and Python's json read them).
inline std::string wandb_number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return nlohmann::json(value).dump();
}

/// What an offline run starts with: the fields of wandb_internal.RunRecord that it carries.
struct WandbRunStart {
  std::string run_id;        ///< the run's id on W&B: letters, digits, '-' and '_'
  std::string project;       ///< empty: whoever syncs gets their default project
  std::string entity;        ///< team or user; empty: the default entity of whoever syncs
  std::string display_name;  ///< the run's name in the W&B UI
  std::string group, job_type, notes;
  std::vector<std::string> tags;
  std::string host;
  double start_time = 0;  ///< seconds since the epoch
  std::vector<WandbItem> config;
};

/// System facts: wandb_internal.EnvironmentRecord, the run's "System" metadata on W&B.
struct WandbEnvironment {
  std::string os, host, program, root;
  std::vector<std::string> args;
  double started_at = 0;  ///< seconds since the epoch
  std::uint32_t cpu_count = 0;
  /// The job's SLURM_* variables, named as wandb-core names them: SLURM_JOB_ID as ("job_id", value).
  std::vector<std::pair<std::string, std::string>> slurm;
};

namespace detail {
/// google.protobuf.Timestamp{seconds = 1, nanos = 2}.
inline std::string encode_timestamp(double seconds_since_epoch) {
  const double whole = std::floor(seconds_since_epoch);
  std::string out;
  put_varint_field(out, 1, static_cast<std::int64_t>(whole));
  const auto nanos = static_cast<std::int64_t>((seconds_since_epoch - whole) * 1e9);
  if (nanos > 0) put_varint_field(out, 2, nanos);
  return out;
}

/// ConfigItem, HistoryItem and SummaryItem share one shape: {key = 1, nested_key = 2, value_json = 16}.
inline std::string encode_items(int field, const std::vector<WandbItem>& items) {
  std::string out;
  for (const auto& item : items) {
    std::string encoded;
    put_bytes(encoded, 1, item.key);
    put_bytes(encoded, 16, item.value_json);
    put_bytes(out, field, encoded);
  }
  return out;
}
}  // namespace detail

/// The message of one record and its field number in wandb_internal.Record's `record_type`.
struct WandbRecordBody {
  int field = 0;
  std::string message;
};

/// Encoders of the records an offline run holds (wandb_internal.proto's field numbers).
namespace wandb_record {
/// Record.header = 21: HeaderRecord{version_info = 1: VersionInfo{producer = 1}}.
inline WandbRecordBody header(std::string_view producer) {
  std::string version;
  detail::put_bytes(version, 1, producer);
  std::string header;
  detail::put_bytes(header, 1, version);
  return {21, header};
}
/// Record.run = 17: RunRecord{run_id = 1, entity = 2, project = 3, config = 4, run_group = 6, job_type = 7,
/// display_name = 8, notes = 9, tags = 10, host = 13, start_time = 17}.
inline WandbRecordBody run(const WandbRunStart& start) {
  std::string run;
  const auto text = [&run](int field, const std::string& value) {
    if (!value.empty()) detail::put_bytes(run, field, value);
  };
  text(1, start.run_id);
  text(2, start.entity);
  text(3, start.project);
  if (!start.config.empty()) detail::put_bytes(run, 4, detail::encode_items(1, start.config));
  text(6, start.group);
  text(7, start.job_type);
  text(8, start.display_name);
  text(9, start.notes);
  for (const auto& tag : start.tags) detail::put_bytes(run, 10, tag);
  text(13, start.host);
  detail::put_bytes(run, 17, detail::encode_timestamp(start.start_time));
  return {17, run};
}
/// Record.environment = 26: EnvironmentRecord{os = 1, started_at = 3, args = 5, program = 6, root = 11,
/// host = 12, executable = 14, cpu_count = 16, cpu_count_logical = 17, slurm = 27 (map<string, string>)}.
inline WandbRecordBody environment(const WandbEnvironment& facts) {
  std::string environment;
  const auto text = [&environment](int field, const std::string& value) {
    if (!value.empty()) detail::put_bytes(environment, field, value);
  };
  text(1, facts.os);
  detail::put_bytes(environment, 3, detail::encode_timestamp(facts.started_at));
  for (const auto& arg : facts.args) detail::put_bytes(environment, 5, arg);
  text(6, facts.program);
  text(11, facts.root);
  text(12, facts.host);
  text(14, facts.program);
  if (facts.cpu_count > 0) {
    detail::put_varint_field(environment, 16, facts.cpu_count);
    detail::put_varint_field(environment, 17, facts.cpu_count);
  }
  for (const auto& [key, value] : facts.slurm) {  // a map field is a repeated entry message {key = 1, value = 2}
    std::string entry;
    detail::put_bytes(entry, 1, key);
    detail::put_bytes(entry, 2, value);
    detail::put_bytes(environment, 27, entry);
  }
  return {26, environment};
}
/// Record.config = 5: ConfigRecord{update = 1}.
inline WandbRecordBody config(const std::vector<WandbItem>& items) { return {5, detail::encode_items(1, items)}; }
/// Record.history = 2: HistoryRecord{item = 1, step = 2: HistoryStep{num = 1}}. wandb-core uploads the items
/// as the row, so they carry `_step` too.
inline WandbRecordBody history(std::int64_t step, const std::vector<WandbItem>& items) {
  std::string history = detail::encode_items(1, items);
  std::string step_message;
  if (step != 0) detail::put_varint_field(step_message, 1, step);
  detail::put_bytes(history, 2, step_message);
  return {2, history};
}
/// Record.summary = 3: SummaryRecord{update = 1}.
inline WandbRecordBody summary(const std::vector<WandbItem>& items) { return {3, detail::encode_items(1, items)}; }
/// Record.output_raw = 13: OutputRawRecord{output_type = 1 (STDOUT = 1), timestamp = 2, line = 3}: a line of
/// the run's console log.
inline WandbRecordBody output_line(double time, std::string_view line) {
  std::string output;
  detail::put_varint_field(output, 1, 1);
  detail::put_bytes(output, 2, detail::encode_timestamp(time));
  detail::put_bytes(output, 3, line);
  return {13, output};
}
/// Record.preempting = 23: RunPreemptingRecord{} (W&B shows the run as preempted, not crashed).
inline WandbRecordBody preempting() { return {23, ""}; }
/// Record.exit = 18: RunExitRecord{exit_code = 1, runtime = 2 (seconds), not_complete = 3}. `not_complete`
/// keeps the run running on W&B: a later offline run of the same id continues it.
inline WandbRecordBody exit(int exit_code, std::int64_t runtime_seconds, bool not_complete = false) {
  std::string exit;
  if (exit_code != 0) detail::put_varint_field(exit, 1, exit_code);
  if (runtime_seconds != 0) detail::put_varint_field(exit, 2, runtime_seconds);
  if (not_complete) detail::put_varint_field(exit, 3, 1);
  return {18, exit};
}
}  // namespace wandb_record

/// Appends records to a `.wandb` file in wandb's transaction log format (see the top of this file), each
/// flushed as soon as it is written.
class WandbTransactionLog {
 public:
  static constexpr std::size_t block_size = 32768;  ///< LEVELDBLOG_BLOCK_LEN
  static constexpr std::size_t chunk_header = 7;    ///< crc32, length, type
  enum ChunkType : std::uint8_t { full = 1, first = 2, middle = 3, last = 4 };

  /// Creates `path` (which must not exist) and writes the file header. Throws RuntimeError
  /// `[hpctrain.runtime.wandb]` naming the file.
  explicit WandbTransactionLog(std::filesystem::path path) : path_(std::move(path)) {
    file_ = std::fopen(path_.c_str(), "wbx");
    if (file_ == nullptr) fail("cannot create");
    std::string header = ":W&B";
    detail::put_fixed<std::uint16_t>(header, 0xBEE1);  // zlib.crc32(b"Weights & Biases") & 0xffff
    header.push_back('\0');                            // version 0
    write(header);
  }
  WandbTransactionLog(const WandbTransactionLog&) = delete;
  WandbTransactionLog& operator=(const WandbTransactionLog&) = delete;
  ~WandbTransactionLog() {
    if (file_ != nullptr) std::fclose(file_);
  }

  /// Appends one record (a serialized wandb_internal.Record), split across blocks as needed, and flushes it.
  void append(std::string_view record) {
    std::string out;
    std::uint64_t offset = offset_;
    const auto chunk = [&](std::string_view data, ChunkType type) {
      const char type_byte = static_cast<char>(type);
      detail::put_fixed<std::uint32_t>(out, detail::crc32_ieee(data, detail::crc32_ieee({&type_byte, 1})));
      detail::put_fixed<std::uint16_t>(out, static_cast<std::uint16_t>(data.size()));
      out.push_back(type_byte);
      out.append(data);
      offset += chunk_header + data.size();
    };
    std::size_t space = block_size - offset % block_size;
    if (space < chunk_header) {  // too little left for a chunk header: zero-fill to the next block
      out.append(space, '\0');
      offset += space;
      space = block_size;
    }
    if (record.size() + chunk_header <= space) {
      chunk(record, full);
    } else {
      // FIRST fills this block (with no data when exactly a header's room is left, as LevelDB writes it).
      std::size_t used = space - chunk_header;
      chunk(record.substr(0, used), first);
      for (; record.size() - used > block_size - chunk_header; used += block_size - chunk_header)
        chunk(record.substr(used, block_size - chunk_header), middle);
      chunk(record.substr(used), last);
    }
    write(out);
  }
  /// The file written to.
  const std::filesystem::path& path() const { return path_; }
  /// Bytes written so far (the header included).
  std::uint64_t size() const { return offset_; }

 private:
  void write(std::string_view bytes) {
    if (std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size() || std::fflush(file_) != 0)
      fail("cannot write");
    offset_ += bytes.size();
  }
  [[noreturn]] void fail(std::string_view what) const {
    throw RuntimeError(errors::runtime_wandb, fmt::format("{} {}: {}", what, path_.string(), std::strerror(errno)));
  }

  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  std::uint64_t offset_ = 0;
};

/// A new W&B run id: 8 characters of [a-z0-9], as wandb makes them.
inline std::string new_wandb_run_id() {
  static constexpr std::string_view alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device entropy;
  std::uniform_int_distribution<std::size_t> pick(0, alphabet.size() - 1);
  std::string id;
  for (int i = 0; i < 8; ++i) id.push_back(alphabet[pick(entropy)]);
  return id;
}

/// One offline run, as `wandb.init(mode="offline")` leaves it for `wandb sync`:
/// `<wandb_dir>/offline-run-<YYYYMMDD_HHMMSS>-<id>/run-<id>.wandb` and an empty `files/` (where wandb sync writes
/// the metadata files it uploads). A requeued run writes a second such directory with the same id, as a resumed
/// offline wandb run does; wandb sync uploads them in order of their start times, into one run.
class WandbOfflineRun {
 public:
  /// Creates the run's directory under `wandb_dir` (a `-1`, `-2`... suffix when one of that second exists) and
  /// writes the header and run records. Throws RuntimeError `[hpctrain.runtime.wandb]`.
  WandbOfflineRun(const std::filesystem::path& wandb_dir, const WandbRunStart& start, std::string_view producer)
      : directory_(make_directory(wandb_dir, start)),
        log_(directory_ / fmt::format("run-{}.wandb", start.run_id)),
        stream_id_(start.run_id) {
    write(wandb_record::header(producer));
    write(wandb_record::run(start));
  }

  void environment(const WandbEnvironment& facts) { write(wandb_record::environment(facts)); }
  void config(const std::vector<WandbItem>& items) { write(wandb_record::config(items)); }
  /// One history row at `step` (its items carry `_step` as well).
  void history(std::int64_t step, const std::vector<WandbItem>& items) { write(wandb_record::history(step, items)); }
  void summary(const std::vector<WandbItem>& items) { write(wandb_record::summary(items)); }
  void output_line(double time, std::string_view line) { write(wandb_record::output_line(time, line)); }
  void preempting() { write(wandb_record::preempting()); }
  void exit(int exit_code, std::int64_t runtime_seconds, bool not_complete = false) {
    write(wandb_record::exit(exit_code, runtime_seconds, not_complete));
  }

  /// `<wandb_dir>/offline-run-<time>-<id>`: what `wandb sync` is given.
  const std::filesystem::path& directory() const { return directory_; }
  /// The `.wandb` file.
  const std::filesystem::path& file() const { return log_.path(); }

 private:
  static std::filesystem::path make_directory(const std::filesystem::path& wandb_dir, const WandbRunStart& start) {
    namespace fs = std::filesystem;
    const auto seconds = static_cast<std::time_t>(start.start_time);
    std::tm utc{};
    gmtime_r(&seconds, &utc);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d_%H%M%S", &utc);
    std::error_code error;
    fs::create_directories(wandb_dir, error);
    for (int attempt = 0; attempt < 1000; ++attempt) {
      auto directory = wandb_dir / fmt::format("offline-run-{}-{}{}", stamp, start.run_id,
                                               attempt == 0 ? "" : fmt::format("-{}", attempt));
      if (fs::create_directory(directory, error)) {
        fs::create_directory(directory / "files", error);
        if (!error) return directory;
      }
      if (error)
        throw RuntimeError(errors::runtime_wandb,
                           fmt::format("cannot create {}: {}", directory.string(), error.message()));
    }
    throw RuntimeError(errors::runtime_wandb,
                       fmt::format("cannot create an offline run directory under {}", wandb_dir.string()));
  }

  void write(const WandbRecordBody& body) {
    // Record{num = 1, <record_type> = body.field, _info = 200: _RecordInfo{stream_id = 1}}.
    std::string record;
    detail::put_varint_field(record, 1, next_number_++);
    detail::put_bytes(record, body.field, body.message);
    std::string info;
    detail::put_bytes(info, 1, stream_id_);
    detail::put_bytes(record, 200, info);
    log_.append(record);
  }

  std::filesystem::path directory_;
  WandbTransactionLog log_;
  std::string stream_id_;
  std::int64_t next_number_ = 1;
};

}  // namespace hpctrain
