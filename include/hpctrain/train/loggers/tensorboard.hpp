#pragma once
// A TensorBoard event-file writer of our own: TFRecord framing (length, masked CRC32C of the length,
// payload, masked CRC32C of the payload) around hand-encoded `tensorflow.Event` protobufs with scalar
// summaries (train/loggers/protobuf_wire.hpp). Enough for TensorBoard, `tensorboard dev`-style syncs and W&B's
// TensorBoard import, without a protobuf dependency.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <unistd.h>  // getpid, gethostname: the file name convention TensorBoard uses

#include <hpctrain/checksums.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/train/loggers/protobuf_wire.hpp>

namespace hpctrain {

namespace detail {
/// tensorflow.Event{wall_time = 1 (double), step = 2 (int64), file_version = 3 | summary = 5}.
inline std::string encode_event_header(double wall_time, std::int64_t step) {
  std::string event;
  put_tag(event, 1, 1);
  put_fixed(event, wall_time);
  put_tag(event, 2, 0);
  put_varint(event, static_cast<std::uint64_t>(step));
  return event;
}

/// Summary{value = 1: Summary.Value{tag = 1 (string), simple_value = 2 (float)}}.
inline std::string encode_scalar_event(double wall_time, std::int64_t step, std::string_view tag, float value) {
  std::string summary_value;
  put_bytes(summary_value, 1, tag);
  put_tag(summary_value, 2, 5);
  put_fixed(summary_value, value);
  std::string summary;
  put_bytes(summary, 1, summary_value);
  std::string event = encode_event_header(wall_time, step);
  put_bytes(event, 5, summary);
  return event;
}

inline std::string tfrecord(std::string_view payload) {
  std::string record;
  const auto length = static_cast<std::uint64_t>(payload.size());
  put_fixed(record, length);
  put_fixed(record, masked_crc32c(&length, sizeof length));
  record.append(payload);
  put_fixed(record, masked_crc32c(payload.data(), payload.size()));
  return record;
}

inline double wall_time_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}
}  // namespace detail

/// Appends scalar summaries to `<dir>/events.out.tfevents.<time>.<host>.<pid>`; flushes every record.
class TensorBoardWriter {
 public:
  /// Creates `directory` if needed and starts a new event file there.
  explicit TensorBoardWriter(const std::filesystem::path& directory) {
    std::filesystem::create_directories(directory);
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    const double now = detail::wall_time_now();
    path_ = directory / fmt::format("events.out.tfevents.{}.{}.{}", static_cast<long>(now), host, getpid());
    file_ = std::fopen(path_.c_str(), "wb");
    if (file_ == nullptr)
      throw RuntimeError(errors::runtime_tensorboard, fmt::format("cannot create {}", path_.string()));
    std::string first = detail::encode_event_header(now, 0);
    detail::put_bytes(first, 3, "brain.Event:2");  // TensorBoard reads files that start with this version
    write_record(first);
  }
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  ~TensorBoardWriter() {
    if (file_ != nullptr) std::fclose(file_);
  }

  /// Records `value` under `tag` (e.g. "train/loss") at `step`.
  void add_scalar(std::string_view tag, double value, std::int64_t step) {
    write_record(detail::encode_scalar_event(detail::wall_time_now(), step, tag, static_cast<float>(value)));
  }
  /// The event file this writer appends to.
  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(std::string_view payload) {
    const std::string record = detail::tfrecord(payload);
    if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0)
      throw RuntimeError(errors::runtime_tensorboard, fmt::format("cannot write {}", path_.string()));
  }

  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

}  // namespace hpctrain
