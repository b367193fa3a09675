#pragma once
// An SFT JSONL file rendered, tokenized, masked and cut to its length once per job: `prepare_sft_tokens` reads
// the records in file order, tokenizes them on every core of the task (one tokenizer and one chat template per
// thread: an Encoder's cache is not shared), and writes a prepared SFT file (text/sft_tokens.hpp) named by the
// digest of what it was made from (`sft_source_digest`), so that a changed file, tokenizer, template, tools
// file or length rule never finds a stale one. The rules are the ones a rank applies when it tokenizes the file
// itself (lm/sft.hpp): `tokenize_sft` (TRL's) then `cut_sft_example`, so both give the same examples. Torch-free.
#include <sched.h>  // sched_getaffinity: the CPUs this task may use

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/files.hpp>
#include <hpctrain/text/bpe.hpp>
#include <hpctrain/text/chat.hpp>
#include <hpctrain/text/chat_template.hpp>
#include <hpctrain/text/pretrained_tokenizer.hpp>
#include <hpctrain/text/sft_checks.hpp>
#include <hpctrain/text/sft_jsonl.hpp>
#include <hpctrain/text/sft_tokens.hpp>

namespace hpctrain::text {

/// Everything that decides an SFT file's examples: the file, the tokenizer's directory, a chat template file
/// used instead of the tokenizer's own, the tools file, and the length rule.
struct SftRecipe {
  std::filesystem::path jsonl;
  std::filesystem::path tokenizer_dir;
  std::optional<std::filesystem::path> chat_template;  ///< none: the tokenizer's
  std::optional<std::filesystem::path> tools;          ///< none: only the lines' own
  std::int64_t max_length = 1024;
  bool drop_overlong = false;  ///< else truncate
};

/// The length rule: an example longer than `max_length` is dropped or keeps its first max_length ids; one with
/// no trained token after its first teaches nothing (its prompt filled the length) and is left out too.
inline SftCutExample cut_sft_example(SftExample example, std::int64_t max_length, bool drop_overlong) {
  SftCutExample out;
  const auto length = static_cast<std::size_t>(max_length);
  if (example.ids.size() > length) {
    if (drop_overlong) {
      out.flags = sft_dropped;
      return out;
    }
    example.ids.resize(length);
    example.trained.resize(length);
    out.flags = sft_truncated;
  }
  if (example.ids.size() < 2 ||
      std::none_of(example.trained.begin() + 1, example.trained.end(), [](auto t) { return t != 0; })) {
    out.flags |= sft_untrained;
    return out;
  }
  out.ids = std::move(example.ids);
  out.trained = std::move(example.trained);
  return out;
}

namespace detail {
/// The bytes of `file`; SpecError `[hpctrain.spec.data.jsonl]` naming it (a template or tools file the program names).
inline std::string read_named_file(const std::filesystem::path& file) {
  auto content = hpctrain::detail::read_file_if_present(file, errors::runtime_io);
  if (!content) throw SpecError(errors::spec_data_jsonl, file.string(), "cannot open");
  return std::move(*content);
}
}  // namespace detail

/// The tokenizer's chat template (or the file `template_file`), bound to its special tokens; none when there
/// is neither (a conversational file then fails in tokenize_sft, naming the line).
inline std::optional<ConversationRenderer> sft_renderer(const PretrainedTokenizer& tokenizer,
                                                        const std::optional<std::filesystem::path>& template_file) {
  std::optional<std::string> source;
  std::string origin;
  if (template_file) {
    source = detail::read_named_file(*template_file);
    origin = template_file->string();
  } else if (tokenizer.chat_template_source()) {
    source = *tokenizer.chat_template_source();
    origin = "chat_template";
  }
  if (!source) return std::nullopt;
  auto parsed = std::make_shared<const ChatTemplate>(ChatTemplate::parse(*source, origin));
  ChatRenderOptions options;
  options.bos_token = tokenizer.bos_token();
  options.eos_token = tokenizer.eos_token();
  return ConversationRenderer(
      [parsed, options](const std::vector<ChatMessage>& messages, const nlohmann::ordered_json& tools) {
        return parsed->render_with_assistant_spans(messages, options, tools);
      });
}

/// A digest of everything `recipe` names: the data's absolute path, its files' sizes and times (read whole, it would
/// cost every rank a pass over the file), the bytes of the tokenizer's files, of the template and tools files,
/// and the length rule. The prepared file is named by it and carries it.
inline std::uint64_t sft_source_digest(const SftRecipe& recipe, const PretrainedTokenizer& tokenizer) {
  detail::Fingerprint digest;
  digest.add("hpctrain prepared SFT v1");
  std::error_code error;
  digest.add(std::filesystem::absolute(recipe.jsonl).string());
  for (const auto& file : files_on_disk(recipe.jsonl)) {  // a JSONL file, or a dataset's files
    if (file != recipe.jsonl) digest.add(std::filesystem::relative(file, recipe.jsonl).string());
    digest.add_u64(std::filesystem::file_size(file, error));
    digest.add_u64(
        static_cast<std::uint64_t>(std::filesystem::last_write_time(file, error).time_since_epoch().count()));
  }
  digest.add_u64(tokenizer.tokenizer().fingerprint());
  for (const auto& file : tokenizer.files()) {
    digest.add(file.filename().string());
    digest.add(detail::read_named_file(file));
  }
  for (const auto& file : {recipe.chat_template, recipe.tools}) {
    digest.add_u64(file ? 1 : 0);
    if (file) digest.add(detail::read_named_file(*file));
  }
  digest.add_u64(static_cast<std::uint64_t>(recipe.max_length));
  digest.add_u64(recipe.drop_overlong ? 1 : 0);
  return digest.value();
}

/// Where the preparation below `prepared_dir` (the job's, `<run dir>/prepare`) keeps the file of `digest`.
inline std::filesystem::path sft_tokens_path(const std::filesystem::path& prepared_dir, std::uint64_t digest) {
  return prepared_dir / "sft" / fmt::format("{:016x}.sfttokens", digest);
}

namespace detail {

/// The prepared file being written: ids streamed to a temporary, masks and records kept until commit.
class SftTokensWriter {
 public:
  SftTokensWriter(std::filesystem::path path, SftTokensHeader header)
      : file_(std::move(path), errors::runtime_text_prepare), header_(header) {
    header_.records = header_.tokens = 0;
    const auto bytes = encode_sft_tokens_header(header_);
    file_.write(bytes.data(), bytes.size());
  }

  void append(const SftCutExample& example) {
    records_.push_back({header_.tokens, static_cast<std::uint32_t>(example.ids.size()), example.flags});
    bytes_.clear();
    for (const auto id : example.ids)
      for (int k = 0; k < 4; ++k)
        bytes_.push_back(static_cast<char>((static_cast<std::uint32_t>(id) >> (8 * k)) & 0xFF));
    file_.write(bytes_.data(), bytes_.size());
    trained_.insert(trained_.end(), example.trained.begin(), example.trained.end());
    header_.tokens += example.ids.size();
    ++header_.records;
  }

  /// Masks and records after the ids, the final header, fsync, rename over the final name, fsync of the directory.
  void commit() {
    file_.write(trained_.data(), trained_.size());
    for (const auto& record : records_) {
      std::array<char, sft_tokens_header_size> entry{};  // the first 16 bytes used
      put_le(entry, 0, record.first);
      put_le(entry, 8, record.count);
      put_le(entry, 12, record.flags);
      file_.write(entry.data(), sft_tokens_record_size);
    }
    const auto bytes = encode_sft_tokens_header(header_);
    file_.write_at_start({bytes.data(), bytes.size()});
    file_.commit();
  }
  const SftTokensHeader& header() const { return header_; }

 private:
  hpctrain::detail::StagedFile file_;
  SftTokensHeader header_;
  std::vector<char> bytes_;
  std::vector<std::uint8_t> trained_;
  std::vector<SftTokensRecord> records_;
};

/// The CPUs this process may run on (Slurm binds a task to its --cpus-per-task).
inline int sft_task_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

/// One thread's tools: its own tokenizer (and so its own Encoder) and its own parsed template.
struct SftThreadTools {
  PretrainedTokenizer tokenizer;
  std::optional<ConversationRenderer> render;
};

/// `cut[i]` for every record of `records`, thread t taking records t, t + threads, ...; the first error rethrown.
inline void cut_in_parallel(const std::vector<SftRecord>& records, std::vector<SftThreadTools>& tools,
                            const SftRecipe& recipe, std::vector<SftCutExample>& cut) {
  cut.assign(records.size(), {});
  std::mutex mutex;
  std::exception_ptr error;
  std::size_t error_at = records.size();
  std::vector<std::thread> threads;
  const auto count = tools.size();
  for (std::size_t t = 0; t < count; ++t)
    threads.emplace_back([&, t] {
      for (std::size_t i = t; i < records.size(); i += count) {
        try {
          auto& mine = tools[t];
          cut[i] = cut_sft_example(tokenize_sft(records[i], mine.tokenizer, mine.render ? &*mine.render : nullptr),
                                   recipe.max_length, recipe.drop_overlong);
        } catch (...) {
          std::lock_guard lock(mutex);
          if (i < error_at) error_at = i, error = std::current_exception();  // the first in file order
          return;
        }
      }
    });
  for (auto& thread : threads) thread.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace detail

/// What prepare_sft_tokens did.
struct SftPrepareResult {
  std::filesystem::path file;
  std::uint64_t records = 0, tokens = 0, input_bytes = 0;
  int threads = 1;
  double seconds = 0;
  SftDataReport checks;  ///< the data checks over every example (text/sft_checks.hpp)
  /// Input megabytes (10^6 bytes) per second.
  double megabytes_per_second() const { return seconds > 0 ? static_cast<double>(input_bytes) / 1e6 / seconds : 0; }
  double examples_per_second() const { return seconds > 0 ? static_cast<double>(records) / seconds : 0; }
};

/// Whether `file` exists, is whole and well-formed, and was made from `digest` with this tokenizer: then a
/// preparation that runs again skips the work.
inline bool sft_tokens_prepared(const std::filesystem::path& file, std::uint64_t digest,
                                const PretrainedTokenizer& tokenizer) {
  if (!std::filesystem::is_regular_file(file)) return false;
  try {
    const SftTokensFile prepared(file);
    return prepared.view().header().source_digest == digest &&
           prepared.view().header().fingerprint == tokenizer.tokenizer().fingerprint();
  } catch (const Error&) {
    return false;  // malformed or half-written by another tool: made again
  }
}

/// Tokenizes every record of `recipe.jsonl` into the prepared file `out` on `threads` threads (0: every CPU of
/// this task), `batch_per_thread` records a thread at a time. SpecError naming the file and line for a bad
/// record (as the login check says) and for the data mistakes text/sft_checks.hpp refuses (the result's `checks`
/// hold the counts), RuntimeError `[hpctrain.runtime.text.prepare]` when it cannot be written; `out` is never left
/// half-written.
inline SftPrepareResult prepare_sft_tokens(const SftRecipe& recipe, const std::filesystem::path& out, int threads = 0,
                                           std::size_t batch_per_thread = 64) {
  const auto start = std::chrono::steady_clock::now();
  const auto tokenizer = load_pretrained_tokenizer(recipe.tokenizer_dir);
  SftPrepareResult result;
  result.file = out;
  result.threads = threads > 0 ? threads : detail::sft_task_cpus();
  std::error_code error;
  std::filesystem::create_directories(out.parent_path(), error);
  if (error)
    throw RuntimeError(errors::runtime_text_prepare,
                       fmt::format("{}: cannot create: {}", out.parent_path().string(), error.message()));

  std::vector<detail::SftThreadTools> tools;
  for (int t = 0; t < result.threads; ++t) tools.push_back({tokenizer, sft_renderer(tokenizer, recipe.chat_template)});
  const auto check_tokens = SftCheckTokens::of(tokenizer);
  SftTokensHeader header;
  header.vocab_size = tokenizer.tokenizer().vocab_size();
  header.fingerprint = tokenizer.tokenizer().fingerprint();
  header.source_digest = sft_source_digest(recipe, tokenizer);
  detail::SftTokensWriter writer(out, header);
  SftReader reader(recipe.jsonl, SftJsonlOptions{recipe.tools});
  std::vector<SftRecord> records;
  std::vector<SftCutExample> cut;
  const auto per_batch = static_cast<std::size_t>(result.threads) * std::max<std::size_t>(batch_per_thread, 1);
  for (bool more = true; more;) {
    records.clear();
    SftRecord record;
    while (records.size() < per_batch && (more = reader.next(record))) records.push_back(std::move(record));
    detail::cut_in_parallel(records, tools, recipe, cut);
    for (std::size_t i = 0; i < cut.size(); ++i) result.checks.add(cut[i], records[i].line, check_tokens);
    for (const auto& example : cut) writer.append(example);
  }
  // Before the commit: a file whose examples the checks refuse is never left prepared.
  refuse_sft_mistakes(result.checks, recipe.jsonl, tokenizer, /*whole=*/true);
  result.records = writer.header().records;
  result.tokens = writer.header().tokens;
  writer.commit();
  for (const auto& file : files_on_disk(recipe.jsonl)) result.input_bytes += std::filesystem::file_size(file, error);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace hpctrain::text
