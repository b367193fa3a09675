#pragma once
// The prepared SFT file: every record of a JSONL file rendered, tokenized, masked and cut to the dataset's
// length once per job (text/sft_prepare.hpp), which every rank maps instead of tokenizing the file itself.
// Torch-free so that it can be fuzzed; lm/sft.hpp builds the dataset from it.
//
//   offset         size        field
//        0            8        magic "HPCSFTOK"
//        8            4        version (1)
//       12            4        zero
//       16            8        records R (every example line of the JSONL file, in file order)
//       24            8        tokens T (the ids kept, over all records)
//       32            8        vocabulary size (every id is below it)
//       40            8        tokenizer fingerprint (Tokenizer::fingerprint)
//       48            8        source digest (the JSONL file, tokenizer files, template, tools, length rule)
//       56            8        zero
//       64       4 × T         ids, int32 little-endian, record after record
//   64 + 4T          T         loss mask: 1 where the id's loss counts, else 0
//   64 + 5T     16 × R         per record: first id (uint64), id count (uint32), flags (uint32: 1 truncated,
//                              2 dropped, 4 without a trained token; a dropped or untrained record keeps no id)
// Written to a temporary beside the final name, fsynced and renamed: a crash never leaves half a file that a
// later run would accept; a reader checks every field against the file's size before it trusts an id.
#include <fcntl.h>     // open
#include <sys/mman.h>  // mmap: every rank maps the one file the preparation wrote
#include <sys/stat.h>  // fstat
#include <unistd.h>    // close

#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string_view>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/text/token_file.hpp>

namespace hpctrain::text {

inline constexpr std::string_view sft_tokens_magic = "HPCSFTOK";
inline constexpr std::uint32_t sft_tokens_version = 1;
inline constexpr std::size_t sft_tokens_header_size = 64;
inline constexpr std::size_t sft_tokens_record_size = 16;

/// What a record of an SFT file became (flags of a prepared record).
enum SftRecordFlag : std::uint32_t {
  sft_truncated = 1,  ///< longer than max_length: its first max_length ids kept
  sft_dropped = 2,    ///< longer than max_length and Overlong::drop: left out
  sft_untrained = 4,  ///< no trained token after the first (its prompt filled the length): left out
};
inline constexpr std::uint32_t sft_known_flags = sft_truncated | sft_dropped | sft_untrained;

/// The header's fields.
struct SftTokensHeader {
  std::uint64_t records = 0;
  std::uint64_t tokens = 0;
  std::uint64_t vocab_size = 0;
  std::uint64_t fingerprint = 0;
  std::uint64_t source_digest = 0;
};

/// One record's place in the file.
struct SftTokensRecord {
  std::uint64_t first = 0;
  std::uint32_t count = 0;
  std::uint32_t flags = 0;
};

/// A checked prepared SFT file over bytes someone else owns (a mapping): ids, masks and records.
class SftTokensView {
 public:
  SftTokensView() = default;
  SftTokensView(SftTokensHeader header, const char* ids, const std::uint8_t* trained, const char* records)
      : header_(header), ids_(ids), trained_(trained), records_(records) {}
  const SftTokensHeader& header() const { return header_; }
  std::uint64_t records() const { return header_.records; }
  SftTokensRecord record(std::uint64_t r) const {
    const std::span<const char> bytes(records_ + r * sft_tokens_record_size, sft_tokens_record_size);
    return {detail::get_le<std::uint64_t>(bytes, 0), detail::get_le<std::uint32_t>(bytes, 8),
            detail::get_le<std::uint32_t>(bytes, 12)};
  }
  /// Id `i` of the file (i < tokens).
  std::int32_t id(std::uint64_t i) const {
    return detail::get_le<std::int32_t>(std::span<const char>(ids_ + 4 * i, 4), 0);
  }
  /// Whether id `i`'s loss counts.
  std::uint8_t trained(std::uint64_t i) const { return trained_[i]; }

 private:
  SftTokensHeader header_;
  const char* ids_ = nullptr;
  const std::uint8_t* trained_ = nullptr;
  const char* records_ = nullptr;
};

namespace detail {
[[noreturn]] inline void bad_sft_tokens(const std::filesystem::path& file, std::string_view place,
                                        std::string_view reason) {
  throw RuntimeError(errors::runtime_text_sft_tokens, fmt::format("{}: {}: {}", file.string(), place, reason));
}
}  // namespace detail

/// The 64 header bytes for `header`.
inline std::array<char, sft_tokens_header_size> encode_sft_tokens_header(const SftTokensHeader& header) {
  std::array<char, sft_tokens_header_size> out{};
  std::memcpy(out.data(), sft_tokens_magic.data(), sft_tokens_magic.size());
  detail::put_le(out, 8, sft_tokens_version);
  detail::put_le(out, 16, header.records);
  detail::put_le(out, 24, header.tokens);
  detail::put_le(out, 32, header.vocab_size);
  detail::put_le(out, 40, header.fingerprint);
  detail::put_le(out, 48, header.source_digest);
  return out;
}

/// Checks a whole prepared SFT file held in `bytes` and returns a view of it. RuntimeError
/// `[hpctrain.runtime.text.sft_tokens]` "FILE: PLACE: reason" for anything it would not trust: magic, version,
/// a size other than the counts say, a record out of order or with unknown flags, an id outside the
/// vocabulary, a mask other than 0 or 1.
inline SftTokensView parse_sft_tokens(std::span<const char> bytes, const std::filesystem::path& file) {
  if (bytes.size() < sft_tokens_header_size)
    detail::bad_sft_tokens(
        file, "header",
        fmt::format("{} bytes is shorter than the {}-byte header", bytes.size(), sft_tokens_header_size));
  if (std::string_view(bytes.data(), sft_tokens_magic.size()) != sft_tokens_magic)
    detail::bad_sft_tokens(file, "header", "no \"HPCSFTOK\" magic: not a prepared SFT file");
  if (const auto version = detail::get_le<std::uint32_t>(bytes, 8); version != sft_tokens_version)
    detail::bad_sft_tokens(file, "header",
                           fmt::format("version {} (this hpctrain reads version {})", version, sft_tokens_version));
  SftTokensHeader header;
  header.records = detail::get_le<std::uint64_t>(bytes, 16);
  header.tokens = detail::get_le<std::uint64_t>(bytes, 24);
  header.vocab_size = detail::get_le<std::uint64_t>(bytes, 32);
  header.fingerprint = detail::get_le<std::uint64_t>(bytes, 40);
  header.source_digest = detail::get_le<std::uint64_t>(bytes, 48);
  // 64 + 5T + 16R == size, computed without overflow: each count bounded by the size first.
  const std::uint64_t payload = bytes.size() - sft_tokens_header_size;
  if (header.tokens > payload / 5 || header.records > payload / sft_tokens_record_size ||
      5 * header.tokens + sft_tokens_record_size * header.records != payload)
    detail::bad_sft_tokens(file, "header",
                           fmt::format("{} records and {} tokens need 5 × {} + 16 × {} bytes after the header, "
                                       "the file holds {}",
                                       header.records, header.tokens, header.tokens, header.records, payload));
  if (header.vocab_size == 0 || header.vocab_size > (std::uint64_t{1} << 31))
    detail::bad_sft_tokens(file, "header", fmt::format("a vocabulary of {} ids (1 to 2^31)", header.vocab_size));
  const char* ids = bytes.data() + sft_tokens_header_size;
  const auto* trained = reinterpret_cast<const std::uint8_t*>(ids + 4 * header.tokens);
  const char* records = ids + 5 * header.tokens;
  const SftTokensView view(header, ids, trained, records);

  std::uint64_t next = 0;
  for (std::uint64_t r = 0; r < header.records; ++r) {
    const auto record = view.record(r);
    const auto place = [&] { return fmt::format("record {}", r); };
    if ((record.flags & ~sft_known_flags) != 0)
      detail::bad_sft_tokens(file, place(), fmt::format("unknown flags {:#x}", record.flags));
    if (record.first != next)
      detail::bad_sft_tokens(file, place(),
                             fmt::format("starts at id {}, but the records before it end at {}", record.first, next));
    const bool left_out = (record.flags & (sft_dropped | sft_untrained)) != 0;
    if (left_out ? record.count != 0 : record.count < 2)
      detail::bad_sft_tokens(file, place(),
                             fmt::format("{} ids with flags {:#x} ({})", record.count, record.flags,
                                         left_out ? "a record left out keeps none" : "a kept record has at least 2"));
    if (record.count > header.tokens - next)
      detail::bad_sft_tokens(
          file, place(),
          fmt::format("{} ids from id {} run past the {} the file holds", record.count, next, header.tokens));
    next += record.count;
  }
  if (next != header.tokens)
    detail::bad_sft_tokens(file, "records", fmt::format("cover {} ids, the header counts {}", next, header.tokens));
  for (std::uint64_t i = 0; i < header.tokens; ++i) {
    const auto id = view.id(i);
    if (id < 0 || static_cast<std::uint64_t>(id) >= header.vocab_size)
      detail::bad_sft_tokens(file, fmt::format("id {}", i),
                             fmt::format("{} is outside the vocabulary of {}", id, header.vocab_size));
    if (trained[i] > 1) detail::bad_sft_tokens(file, fmt::format("mask {}", i), fmt::format("{} (0 or 1)", trained[i]));
  }
  return view;
}

/// A prepared SFT file mapped read-only and checked whole (parse_sft_tokens) before anything reads it.
class SftTokensFile {
 public:
  explicit SftTokensFile(const std::filesystem::path& file) {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) detail::bad_sft_tokens(file, "open", "cannot open");
    struct stat info {};
    const bool sized = ::fstat(fd, &info) == 0;
    bytes_ = sized ? static_cast<std::size_t>(info.st_size) : 0;
    if (bytes_ > 0) mapping_ = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);  // the mapping keeps the file open
    if (!sized || mapping_ == MAP_FAILED) {
      mapping_ = nullptr;
      detail::bad_sft_tokens(file, "open", "cannot map");
    }
    try {
      view_ = parse_sft_tokens(std::span<const char>(static_cast<const char*>(mapping_), bytes_), file);
    } catch (...) {
      unmap();
      throw;
    }
  }
  SftTokensFile(const SftTokensFile&) = delete;
  SftTokensFile& operator=(const SftTokensFile&) = delete;
  ~SftTokensFile() { unmap(); }
  const SftTokensView& view() const { return view_; }

 private:
  void unmap() {
    if (mapping_ != nullptr) ::munmap(mapping_, bytes_);
    mapping_ = nullptr;
  }
  void* mapping_ = nullptr;
  std::size_t bytes_ = 0;
  SftTokensView view_;
};

}  // namespace hpctrain::text
