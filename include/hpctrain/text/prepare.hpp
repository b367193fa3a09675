#pragma once
// Text files (or a dataset's text column: PrepareOptions::text_column) in, token files out: `prepare_tokens` streams
// the inputs, cuts them into documents, encodes
// chunks of documents on every core of the task (one Encoder per thread), and writes `train.tokens` and
// `val.tokens` (text/token_file.hpp) in input order, whatever the thread count. Each document goes to the
// validation file or the training file by a hash of (seed, its index): a fixed, streaming split that needs
// no count up front. Documents are followed by the end-of-text token. Outputs are written to temporaries
// beside them and renamed when complete: a crash leaves the old files or none, never half of one.
#include <sched.h>  // sched_getaffinity: the CPUs this task may use

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hpctrain/error.hpp>
#include <hpctrain/files.hpp>
#include <hpctrain/text/rows.hpp>
#include <hpctrain/text/token_file.hpp>
#include <hpctrain/text/tokenizer.hpp>

namespace hpctrain::text {

/// How an input file is cut into documents.
enum class DocumentFormat {
  /// fortune(6) files: entries separated by lines holding only `%`.
  fortunes,
  /// Paragraphs separated by blank lines.
  paragraphs,
  /// Every non-empty line is a document.
  lines,
  /// The whole file is one document (read whole: documents are the unit of encoding).
  file,
};

/// Options of prepare_tokens (plain data, chained setters).
struct PrepareOptions {
  /// Default: DocumentFormat::fortunes.
  PrepareOptions& documents(DocumentFormat value) {
    documents_ = value;
    return *this;
  }
  /// Share of documents that go to val.tokens. Default: 0.05.
  PrepareOptions& validation_fraction(double value) {
    hpctrain::detail::require(value >= 0.0 && value < 1.0, "prepare.validation_fraction", value, "must be in [0, 1)");
    validation_fraction_ = value;
    return *this;
  }
  /// Seed of the train/validation split. Default: 1337.
  PrepareOptions& seed(std::uint64_t value) {
    seed_ = value;
    return *this;
  }
  /// Encoding threads. Default: 0, every CPU this task may use (sched_getaffinity, so Slurm's binding counts).
  PrepareOptions& threads(int value) {
    hpctrain::detail::require(value >= 0, "prepare.threads", value, "must be 0 (all cores of the task) or more");
    threads_ = value;
    return *this;
  }
  /// The token that ends each document. Default: "" — the first of <|endoftext|>, <|end_of_text|>, </s>, <eos>.
  PrepareOptions& end_of_text(std::string value) {
    end_of_text_ = std::move(value);
    return *this;
  }
  /// Bytes of text per unit of work. Default: 4 MiB.
  PrepareOptions& chunk_bytes(std::size_t value) {
    hpctrain::detail::require(value > 0, "prepare.chunk_bytes", value, "must be positive");
    chunk_bytes_ = value;
    return *this;
  }
  /// Read each input as a dataset's rows (text/rows.hpp: a JSONL file, or a Parquet file, a directory of shards or
  /// a save_to_disk folder where the program links hpctrain::datasets), each row's `column` one document (a null
  /// or empty one none), instead of a text file cut by documents(). Default: "" (text files).
  PrepareOptions& text_column(std::string value) {
    text_column_ = std::move(value);
    return *this;
  }
  /// Store the ids as uint32 even when they fit uint16 (tests of the wide path). Default: false.
  PrepareOptions& force_uint32(bool value) {
    force_uint32_ = value;
    return *this;
  }

  DocumentFormat documents_ = DocumentFormat::fortunes;
  double validation_fraction_ = 0.05;
  std::uint64_t seed_ = 1337;
  int threads_ = 0;
  std::string end_of_text_;
  std::size_t chunk_bytes_ = std::size_t{4} << 20;
  std::string text_column_;
  bool force_uint32_ = false;
};

/// What prepare_tokens wrote.
struct PrepareResult {
  std::filesystem::path train, validation;
  std::uint64_t train_tokens = 0, validation_tokens = 0;
  std::uint64_t train_documents = 0, validation_documents = 0;
  std::uint64_t input_bytes = 0;
  std::uint32_t token_bytes = 2;
  int threads = 1;
  double seconds = 0;
  /// Input megabytes (10^6 bytes) per second.
  double megabytes_per_second() const { return seconds > 0 ? input_bytes / 1e6 / seconds : 0; }
};

namespace detail {

/// The number of CPUs this process may run on (Slurm binds a task to its --cpus-per-task).
inline int task_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

/// splitmix64: a document's place in the split depends only on (seed, index).
inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
inline bool goes_to_validation(std::uint64_t seed, std::uint64_t document, double fraction) {
  return static_cast<double>(mix64(seed ^ mix64(document)) >> 11) * 0x1.0p-53 < fraction;
}

/// A unit of work: documents back to back in `text`, `ends[i]` the end of document i.
struct Chunk {
  std::uint64_t first_document = 0;
  std::string text;
  std::vector<std::size_t> ends;
};
/// Its ids, split.
struct EncodedChunk {
  std::vector<TokenId> train, validation;
  std::uint64_t train_documents = 0, validation_documents = 0;
};

/// Whether `input` is there to be read: a text file, or with a text column a dataset (a file or a directory).
inline bool input_present(const std::filesystem::path& input, const PrepareOptions& options) {
  return options.text_column_.empty() ? std::filesystem::is_regular_file(input) : std::filesystem::exists(input);
}

/// The document in `row`'s `column` (just read from `rows`); nullptr for a null value.
/// RuntimeError `[hpctrain.runtime.text.prepare]` naming the row when the column is missing or holds no text.
inline const std::string* row_document(const nlohmann::ordered_json& row, const RowSource& rows,
                                       const std::string& column) {
  const auto value = row.find(column);
  if (value == row.end())
    throw RuntimeError(errors::runtime_text_prepare, fmt::format("{}: no column '{}'", rows.where(), column));
  if (value->is_null()) return nullptr;
  if (!value->is_string())
    throw RuntimeError(errors::runtime_text_prepare,
                       fmt::format("{}: column '{}' is {}, not text", rows.where(), column, value->type_name()));
  return &value->get_ref<const std::string&>();
}

/// Reads input files line by line (or a dataset's text column row by row) and hands out chunks of whole documents.
class DocumentReader {
 public:
  DocumentReader(std::span<const std::filesystem::path> inputs, DocumentFormat format, std::size_t chunk_bytes,
                 std::string text_column = "")
      : inputs_(inputs.begin(), inputs.end()),
        format_(format),
        chunk_bytes_(chunk_bytes),
        text_column_(std::move(text_column)) {}

  /// The next chunk of whole documents (at least chunk_bytes of text unless the inputs end); false when
  /// the inputs are exhausted. A document never spans two files.
  bool next(Chunk& chunk) {
    chunk.first_document = documents_;
    chunk.text.clear();
    chunk.ends.clear();
    for (;;) {
      const bool open = chunk.text.size() > open_document_start(chunk);
      if (!open && chunk.text.size() >= chunk_bytes_) break;
      if (!text_column_.empty()) {
        if (!rows_ && !open_next_rows()) break;
        read_row(chunk);
        continue;
      }
      if (!stream_.is_open() && !open_next()) break;
      if (format_ == DocumentFormat::file) {
        const auto before = chunk.text.size();
        chunk.text.append(std::istreambuf_iterator<char>(stream_), {});
        bytes_ += chunk.text.size() - before;
        end_of_file(chunk);
        continue;
      }
      if (!std::getline(stream_, line_)) {
        end_of_file(chunk);
        continue;
      }
      bytes_ += line_.size() + (stream_.eof() ? 0 : 1);
      read_line(chunk);
    }
    return !chunk.ends.empty();
  }
  std::uint64_t bytes() const { return bytes_; }

 private:
  std::size_t open_document_start(const Chunk& chunk) const { return chunk.ends.empty() ? 0 : chunk.ends.back(); }

  bool open_next() {
    if (next_input_ >= inputs_.size()) return false;
    current_ = inputs_[next_input_++];
    stream_.clear();
    stream_.open(current_, std::ios::binary);
    if (!stream_) throw RuntimeError(errors::runtime_text_prepare, fmt::format("{}: cannot open", current_.string()));
    return true;
  }

  bool open_next_rows() {
    if (next_input_ >= inputs_.size()) return false;
    rows_ = open_rows(inputs_[next_input_++], {text_column_});
    return true;
  }

  /// A row's text column as one document; the end of the dataset closes it. A null or empty value is no document.
  void read_row(Chunk& chunk) {
    if (!rows_->next(row_)) {
      rows_.reset();
      return;
    }
    const auto* text = row_document(row_, *rows_, text_column_);
    if (text == nullptr) return;
    chunk.text += *text;
    bytes_ += text->size();
    finish_document(chunk);
  }

  void end_of_file(Chunk& chunk) {
    if (stream_.bad())
      throw RuntimeError(errors::runtime_text_prepare, fmt::format("{}: read error", current_.string()));
    finish_document(chunk);
    stream_.close();
  }

  void read_line(Chunk& chunk) {
    if (format_ == DocumentFormat::lines) {
      chunk.text += line_;
      return finish_document(chunk);
    }
    if ((format_ == DocumentFormat::fortunes && line_ == "%") ||
        (format_ == DocumentFormat::paragraphs && line_.empty()))
      return finish_document(chunk);
    chunk.text += line_;
    if (!stream_.eof()) chunk.text += '\n';
  }

  /// Ends the open document, unless it is empty.
  void finish_document(Chunk& chunk) {
    if (chunk.text.size() > open_document_start(chunk)) {
      chunk.ends.push_back(chunk.text.size());
      ++documents_;
    }
  }

  std::vector<std::filesystem::path> inputs_;
  DocumentFormat format_;
  std::size_t chunk_bytes_;
  std::size_t next_input_ = 0;
  std::string text_column_;
  std::filesystem::path current_;
  std::ifstream stream_;
  std::string line_;
  std::unique_ptr<RowSource> rows_;
  nlohmann::ordered_json row_;
  std::uint64_t documents_ = 0;
  std::uint64_t bytes_ = 0;
};

/// One output file being written: a temporary with a placeholder header, renamed when complete.
class TokenFileWriter {
 public:
  TokenFileWriter(std::filesystem::path path, TokenFileHeader header)
      : file_(std::move(path), errors::runtime_text_prepare), header_(header) {
    write_header();
  }

  void append(std::span<const TokenId> ids) {
    if (header_.token_bytes == 4) {
      file_.write(ids.data(), ids.size() * 4);
    } else {
      narrow_.assign(ids.begin(), ids.end());
      file_.write(narrow_.data(), narrow_.size() * 2);
    }
    header_.tokens += ids.size();
  }

  /// Completes the header, makes the data durable, and renames the temporary over the final name.
  void commit() {
    const auto bytes = encode_token_file_header(header_);
    file_.write_at_start({bytes.data(), bytes.size()});
    file_.commit();
  }
  std::uint64_t tokens() const { return header_.tokens; }

 private:
  void write_header() {
    const auto bytes = encode_token_file_header(header_);
    file_.write(bytes.data(), bytes.size());
  }

  hpctrain::detail::StagedFile file_;
  TokenFileHeader header_;
  std::vector<std::uint16_t> narrow_;
};

/// Worker threads that encode chunks, each with its own Encoder; results come back in submission order.
class ChunkEncoders {
 public:
  ChunkEncoders(const Tokenizer& tokenizer, int threads, TokenId end_of_text, const PrepareOptions& options) {
    for (int t = 0; t < threads; ++t)
      workers_.emplace_back([this, encoder = tokenizer.encoder(), end_of_text, options]() mutable {
        work(encoder, end_of_text, options);
      });
  }
  ChunkEncoders(const ChunkEncoders&) = delete;
  ChunkEncoders& operator=(const ChunkEncoders&) = delete;
  ~ChunkEncoders() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    for (auto& worker : workers_) worker.join();
  }

  void submit(Chunk chunk) {
    std::lock_guard lock(mutex_);
    queue_.emplace_back(submitted_++, std::move(chunk));
    changed_.notify_all();
  }
  std::size_t in_flight() const { return submitted_ - collected_; }

  /// Waits for the oldest chunk not yet collected; rethrows a worker's error.
  EncodedChunk collect() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return error_ || done_.count(collected_) > 0; });
    if (error_) std::rethrow_exception(error_);
    auto node = done_.extract(collected_++);
    return std::move(node.mapped());
  }

 private:
  void work(Encoder& encoder, TokenId end_of_text, const PrepareOptions& options) {
    for (;;) {
      std::pair<std::size_t, Chunk> job;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      EncodedChunk result;
      try {
        const Chunk& chunk = job.second;
        std::size_t begin = 0;
        for (std::size_t d = 0; d < chunk.ends.size(); ++d) {
          const std::string_view document(chunk.text.data() + begin, chunk.ends[d] - begin);
          begin = chunk.ends[d];
          const bool validation =
              goes_to_validation(options.seed_, chunk.first_document + d, options.validation_fraction_);
          auto& out = validation ? result.validation : result.train;
          encoder.encode_ordinary(document, out);
          out.push_back(end_of_text);
          ++(validation ? result.validation_documents : result.train_documents);
        }
      } catch (...) {
        std::lock_guard lock(mutex_);
        error_ = std::current_exception();
        changed_.notify_all();
        return;
      }
      std::lock_guard lock(mutex_);
      done_.emplace(job.first, std::move(result));
      changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::pair<std::size_t, Chunk>> queue_;
  std::map<std::size_t, EncodedChunk> done_;
  std::size_t submitted_ = 0, collected_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> workers_;
};

/// The id that ends documents: the one named, or the first of the usual names the tokenizer has.
inline TokenId end_of_text_id(const Tokenizer& tokenizer, const std::string& named) {
  if (!named.empty()) {
    if (const auto id = tokenizer.token_id(named)) return *id;
    throw RuntimeError(errors::runtime_text_prepare,
                       fmt::format("{}: has no token {:?} to end documents with", tokenizer.source(), named));
  }
  for (const char* candidate : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"})
    if (const auto id = tokenizer.token_id(candidate)) return *id;
  throw RuntimeError(errors::runtime_text_prepare,
                     fmt::format("{}: has no end-of-text token (none of <|endoftext|>, <|end_of_text|>, "
                                 "</s>, <eos>); name one with PrepareOptions::end_of_text",
                                 tokenizer.source()));
}

/// A digest of what the outputs are made from (input names, sizes, times; the options), so a step that
/// runs again (a requeued job) can tell that the files on disk are already the ones it would write.
inline std::uint64_t source_digest(std::span<const std::filesystem::path> inputs, const PrepareOptions& options,
                                   TokenId end_of_text) {
  Fingerprint digest;
  for (const auto& input : inputs) {
    std::error_code error;
    digest.add(std::filesystem::absolute(input).string());
    for (const auto& file : files_on_disk(input)) {  // a text file, or a dataset's files
      if (file != input) digest.add(std::filesystem::relative(file, input).string());
      digest.add_u64(std::filesystem::file_size(file, error));
      digest.add_u64(
          static_cast<std::uint64_t>(std::filesystem::last_write_time(file, error).time_since_epoch().count()));
    }
  }
  digest.add_u64(static_cast<std::uint64_t>(options.documents_));
  if (!options.text_column_.empty()) digest.add("text column " + options.text_column_);
  digest.add_u64(static_cast<std::uint64_t>(options.validation_fraction_ * 1e12));
  digest.add_u64(options.seed_);
  digest.add_u64(end_of_text);
  digest.add_u64(options.force_uint32_ ? 1 : 0);
  return digest.value();
}

}  // namespace detail

/// Reads the header of a token file on disk (see text/token_file.hpp).
inline TokenFileHeader read_token_file_header(const std::filesystem::path& file,
                                              const TokenFileExpectation& expect = {}) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw RuntimeError(errors::runtime_text_token_file, fmt::format("{}: cannot open", file.string()));
  std::array<char, token_file_header_size> bytes{};
  in.read(bytes.data(), bytes.size());
  std::error_code error;
  const auto size = std::filesystem::file_size(file, error);
  return parse_token_file_header(std::span<const char>(bytes.data(), static_cast<std::size_t>(in.gcount())), size, file,
                                 expect);
}

/// Tokenizes `inputs` into `<out>/train.tokens` and `<out>/val.tokens` (see the top of this file).
/// Throws `[hpctrain.runtime.text.prepare]` naming the file that cannot be read or written; on any error
/// neither output is replaced.
inline PrepareResult prepare_tokens(std::span<const std::filesystem::path> inputs, const Tokenizer& tokenizer,
                                    const std::filesystem::path& out, const PrepareOptions& options = {}) {
  const auto start = std::chrono::steady_clock::now();
  for (const auto& input : inputs)
    if (!detail::input_present(input, options))
      throw RuntimeError(errors::runtime_text_prepare, fmt::format("{}: not a readable file", input.string()));
  std::error_code error;
  std::filesystem::create_directories(out, error);
  if (error)
    throw RuntimeError(errors::runtime_text_prepare,
                       fmt::format("{}: cannot create: {}", out.string(), error.message()));

  const TokenId end_of_text = detail::end_of_text_id(tokenizer, options.end_of_text_);
  TokenFileHeader header;
  header.token_bytes = (tokenizer.vocab_size() <= 65536 && !options.force_uint32_) ? 2 : 4;
  header.vocab_size = tokenizer.vocab_size();
  header.fingerprint = tokenizer.fingerprint();
  header.source_digest = detail::source_digest(inputs, options, end_of_text);
  header.end_of_text = end_of_text;

  PrepareResult result;
  result.train = out / "train.tokens";
  result.validation = out / "val.tokens";
  result.token_bytes = header.token_bytes;
  result.threads = options.threads_ > 0 ? options.threads_ : detail::task_cpus();

  detail::TokenFileWriter train(result.train, header), validation(result.validation, header);
  detail::DocumentReader reader(inputs, options.documents_, options.chunk_bytes_, options.text_column_);
  {
    detail::ChunkEncoders encoders(tokenizer, result.threads, end_of_text, options);
    auto write = [&](detail::EncodedChunk encoded) {
      train.append(encoded.train);
      validation.append(encoded.validation);
      result.train_documents += encoded.train_documents;
      result.validation_documents += encoded.validation_documents;
    };
    // At most two chunks per thread in memory: the reader waits for the writer, so any corpus size streams.
    for (detail::Chunk chunk; reader.next(chunk);) {
      if (encoders.in_flight() >= static_cast<std::size_t>(2 * result.threads)) write(encoders.collect());
      encoders.submit(std::move(chunk));
      chunk = {};
    }
    while (encoders.in_flight() > 0) write(encoders.collect());
  }
  result.train_tokens = train.tokens();
  result.validation_tokens = validation.tokens();
  result.input_bytes = reader.bytes();
  validation.commit();
  train.commit();  // each commit fsyncs the directory too
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

/// Whether `<out>/train.tokens` and `val.tokens` exist, are whole, and were made from exactly these inputs
/// with this tokenizer and these options: then a preparation step that runs again can skip the work.
inline bool tokens_prepared(std::span<const std::filesystem::path> inputs, const Tokenizer& tokenizer,
                            const std::filesystem::path& out, const PrepareOptions& options = {}) {
  try {
    const auto digest = detail::source_digest(inputs, options, detail::end_of_text_id(tokenizer, options.end_of_text_));
    for (const char* name : {"train.tokens", "val.tokens"}) {
      if (!std::filesystem::exists(out / name)) return false;
      const auto header = read_token_file_header(out / name, {tokenizer.fingerprint(), std::nullopt});
      if (header.source_digest != digest) return false;
    }
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace hpctrain::text
