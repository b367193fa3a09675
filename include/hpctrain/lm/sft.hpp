#pragma once
// Supervised fine-tuning data from a JSONL file in TRL's three shapes (text/sft_jsonl.hpp): plain text (the
// loss on every token), prompt/completion (on the completion) and conversational messages rendered with
// the model's chat template (on the assistant turns, their tool calls included; tool results never). The login
// node validates the file; the job's preparation step (Job::prepare, run once before the ranks: `ht::run` adds
// it for a Training whose data has one) renders, tokenizes and masks it on every core of its task into a
// prepared file keyed by the digest of its inputs (text/sft_prepare.hpp), which every rank maps. A run without
// that step, or whose step prepared other inputs, tokenizes the file in each rank as before: the same rules,
// the same examples.
//
// A batch holds inputs/targets as the causal-LM convention says (targets shifted, lm::ignore_index where no
// loss counts). Without packing a batch is its examples right-padded to the longest; with packing the
// examples were placed into rows of max_length tokens by best-fit-decreasing, and a row carries the fields
// "position_ids" (restarting at 0 per example) and "document_ids", so attention never crosses examples
// and a packed row computes exactly what its examples would alone.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <hpctrain/compiled_runtime.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/lm/setting.hpp>
#include <hpctrain/text/data_mix.hpp>
#include <hpctrain/train/data/source.hpp>
#include <hpctrain/train/run_context.hpp>
#if HPCTRAIN_RUNTIME_DEFINITIONS
// Reading, rendering and tokenizing the file: the runtime's (compiled_runtime.hpp), not a program's description.
#include <torch/torch.h>

#include <hpctrain/lm/loss.hpp>
#include <hpctrain/lm/run_tokenizer.hpp>
#include <hpctrain/lm/sft_dataset.hpp>
#include <hpctrain/text/chat_template.hpp>
#include <hpctrain/text/packing.hpp>
#include <hpctrain/text/pretrained_tokenizer.hpp>
#include <hpctrain/text/sft_checks.hpp>
#include <hpctrain/text/sft_jsonl.hpp>
#include <hpctrain/text/sft_prepare.hpp>
#include <hpctrain/text/sft_tokens.hpp>
#include <hpctrain/train/data/mix.hpp>
#endif

namespace hpctrain::text {
struct SftRecipe;           // text/sft_prepare.hpp
struct SftJsonlOptions;     // text/sft_jsonl.hpp
class PretrainedTokenizer;  // text/pretrained_tokenizer.hpp
struct SftExample;          // text/sft_example.hpp
}  // namespace hpctrain::text

namespace hpctrain::lm {
class SftDataset;  // lm/sft_dataset.hpp
}  // namespace hpctrain::lm

namespace hpctrain::lm {

/// What happens to an example longer than max_length tokens.
enum class Overlong {
  truncate,  ///< keep its first max_length tokens (TRL's default)
  drop,      ///< leave it out
};

/// Which examples of the file a source keeps: all, or a deterministic hold-out.
enum class Split {
  all,         ///< every example
  train,       ///< all but every `holdout_every`-th (the ones `validation` keeps)
  validation,  ///< every `holdout_every`-th example
};

/// The data factory of `sft_jsonl`: options as chained setters (each a value or `lm::knob(...)`). The file may be
/// several sources mixed by weight, `a.parquet:0.7,b.jsonl:0.3` (text/data_mix.hpp): each is read, checked,
/// prepared and cut alike; the training split samples them by weight with the run's seed (train/data/mix.hpp), the
/// validation split holds each source's held-out examples once.
class SftJsonl {
 public:
  explicit SftJsonl(Setting<std::filesystem::path> file) : file_(std::move(file)) {}
  /// Several sources mixed by weight, given in the program: `{{"a.parquet", 0.7}, {"b.jsonl", 0.3}}`.
  explicit SftJsonl(std::vector<text::WeightedData> sources)
      : file_(std::filesystem::path(text::data_mix_string(sources))), listed_(std::move(sources)) {}
  /// Tokens per example (and per packed row). Default: 1024.
  SftJsonl& max_length(Setting<std::int64_t> tokens) {
    max_length_ = std::move(tokens);
    return *this;
  }
  /// What to do with longer examples. Default: truncate.
  SftJsonl& overlong(Overlong what) {
    overlong_ = what;
    return *this;
  }
  /// Pad each batch to a multiple of `n` tokens, at most max_length (8 or 64 suit a GPU's kernels; transformers'
  /// collators' pad_to_multiple_of). Default: 1, the batch's longest row.
  SftJsonl& pad_to_multiple_of(Setting<std::int64_t> n) {
    pad_to_multiple_of_ = std::move(n);
    return *this;
  }
  /// Pack examples into rows of max_length tokens (best-fit-decreasing). Default: off.
  SftJsonl& packing(Setting<bool> on = true) {
    packing_ = std::move(on);
    return *this;
  }
  /// Keep a deterministic part of the file: Split::train leaves out every `every`-th example, which
  /// Split::validation keeps. Default: all. SpecError `[hpctrain.spec.sft.split]` unless `every` is at least 2
  /// (1 would hold out every example, 0 none of them, by dividing by zero).
  SftJsonl& split(Split part, std::int64_t every = 16) {
    hpctrain::detail::require(every >= 2, "sft.split", every, "holds out every n-th example: n must be at least 2");
    split_ = part;
    holdout_every_ = every;
    return *this;
  }
  /// The tokenizer directory. Default: the pretrained model's (lm::from_pretrained).
  SftJsonl& tokenizer(Setting<std::filesystem::path> directory) {
    tokenizer_ = std::move(directory);
    return *this;
  }
  /// A chat template file to use instead of the tokenizer's own (conversational files only).
  SftJsonl& chat_template(Setting<std::filesystem::path> file) {
    chat_template_ = std::move(file);
    return *this;
  }
  /// A JSON file holding a list of function schemas, given to the chat template as `tools` with every
  /// conversation that has no "tools" of its own (conversational files only). From a knob (`lm::knob("tools")`),
  /// an empty value means none. Default: none.
  SftJsonl& tools(Setting<std::filesystem::path> file) {
    tools_ = std::move(file);
    return *this;
  }

  /// On the login node: the file exists and every line has the file's shape (SpecError naming file and line);
  /// with the tokenizer's directory (this Training's pretrained model's, or .tokenizer), its chat template parses
  /// and renders the first record, which tokenizes as the worker will (SpecError naming the template, the file
  /// and the line): a template hpctrain cannot render fails here, not on every rank after the queue.
  /// Returns the records of this split, an upper bound of its rows (the batch is checked against it there).
  HPCTRAIN_RUNTIME_INLINE std::optional<DataSizeAtLogin> check_at_login(
      const Knobs& knobs, const std::optional<std::filesystem::path>& pretrained = {}) const;

  /// In the job's preparation step (once, before the ranks): renders, tokenizes, masks and cuts every record of
  /// the file on every CPU of the task into `<prepared_dir>/sft/<digest>.sfttokens`, unless a file of the same
  /// digest is already there; rank 0 of the run maps it. Nothing to do without a tokenizer directory.
  HPCTRAIN_RUNTIME_INLINE void prepare_in_job(const Knobs& knobs,
                                              const std::optional<std::filesystem::path>& pretrained,
                                              const std::filesystem::path& prepared_dir) const;

  /// In the worker: the job's prepared file when it has the one for these inputs, else reads and tokenizes the
  /// file here; truncates or drops, and packs; rank 0 says what it kept and from where.
  HPCTRAIN_RUNTIME_INLINE data::Source operator()(const RunContext& run) const;

 private:
  /// The examples this source keeps, and what happened to the others.
  struct Kept;  // the examples this split keeps, and what was cut

  /// The data's sources: the ones listed in the program, else those the file setting names (text/data_mix.hpp).
  HPCTRAIN_RUNTIME_INLINE std::vector<text::WeightedData> sources(const Knobs& knobs) const;
  HPCTRAIN_RUNTIME_INLINE std::shared_ptr<const data::Dataset> load(const RunContext& run) const;
  /// One source's examples in rows (packed or one each), said by rank 0.
  HPCTRAIN_RUNTIME_INLINE std::shared_ptr<SftDataset> load_source(const RunContext& run,
                                                                  const std::filesystem::path& file) const;
  /// One source's login checks; the examples it keeps.
  HPCTRAIN_RUNTIME_INLINE DataSizeAtLogin check_source_at_login(const Knobs& knobs, const std::filesystem::path& file,
                                                                const std::optional<std::filesystem::path>& pretrained,
                                                                bool first) const;
  /// The source `file`, tokenizer, template, tools and length rule for these knobs; SpecError when no tokenizer is
  /// known.
  HPCTRAIN_RUNTIME_INLINE text::SftRecipe recipe(const Knobs& knobs, const std::filesystem::path& file,
                                                 const std::optional<std::filesystem::path>& pretrained) const;
  /// The kept records of the job's prepared file `file` (mapped, checked whole, made from `digest` by `tokenizer`).
  HPCTRAIN_RUNTIME_INLINE Kept read_prepared(const std::filesystem::path& file, std::uint64_t digest,
                                             const text::PretrainedTokenizer& tokenizer) const;
  /// The kept records of the file, tokenized here (no preparation step, or one for other inputs).
  HPCTRAIN_RUNTIME_INLINE Kept tokenize_here(const text::SftRecipe& recipe,
                                             const text::PretrainedTokenizer& tokenizer) const;
  bool keeps(std::int64_t index) const {
    const bool held_out = index % holdout_every_ == holdout_every_ / 2;
    return split_ == Split::all || (split_ == Split::validation) == held_out;
  }

  /// How the file is read: the tools file, if any.
  HPCTRAIN_RUNTIME_INLINE text::SftJsonlOptions read_options(const Knobs& knobs) const;
  /// Rows of at most `capacity` input tokens, filled best-fit-decreasing.
  HPCTRAIN_RUNTIME_INLINE static std::shared_ptr<SftDataset> pack(std::vector<text::SftExample> examples,
                                                                  std::int64_t capacity, std::int64_t pad);

  Setting<std::filesystem::path> file_;
  std::optional<std::vector<text::WeightedData>> listed_;
  Setting<std::int64_t> max_length_ = std::int64_t{1024};
  Overlong overlong_ = Overlong::truncate;
  Setting<bool> packing_ = false;
  Setting<std::int64_t> pad_to_multiple_of_ = std::int64_t{1};
  Split split_ = Split::all;
  std::int64_t holdout_every_ = 16;
  std::optional<Setting<std::filesystem::path>> tokenizer_, chat_template_, tools_;
  /// `--show-example N`: every program that reads SFT JSONL can show an example as the model sees it.
  Knob<std::int64_t> show_example_ =
      knob("show_example", std::int64_t{0},
           "with --dry-run: print record N of the data file (1: the first) as the model sees it, the trained text "
           "marked, its ids and its loss mask (0: none)",
           non_negative());
};

/// SFT examples from the JSONL file `file` (a path, or `lm::knob("data")`), a Hugging Face dataset on disk
/// (docs/datasets.md), or several of them mixed by weight (`a.parquet:0.7,b.jsonl:0.3`).
inline SftJsonl sft_jsonl(Setting<std::filesystem::path> file) { return SftJsonl(std::move(file)); }
/// SFT examples from several sources mixed by weight: `lm::sft_jsonl({{"a.parquet", 0.7}, {"b.jsonl", 0.3}})`.
inline SftJsonl sft_jsonl(std::vector<text::WeightedData> sources) { return SftJsonl(std::move(sources)); }

#if HPCTRAIN_RUNTIME_DEFINITIONS
struct SftJsonl::Kept {
  std::vector<text::SftExample> examples;
  std::int64_t seen = 0, truncated = 0, dropped = 0, empty = 0;
  void add(text::SftCutExample cut) {
    ++seen;
    truncated += (cut.flags & text::sft_truncated) != 0;
    dropped += (cut.flags & text::sft_dropped) != 0;
    empty += (cut.flags & text::sft_untrained) != 0;
    if ((cut.flags & (text::sft_dropped | text::sft_untrained)) != 0) return;
    examples.push_back({std::move(cut.ids), std::move(cut.trained)});
  }
};

HPCTRAIN_RUNTIME_INLINE SftJsonl::Kept SftJsonl::read_prepared(const std::filesystem::path& file, std::uint64_t digest,
                                                               const text::PretrainedTokenizer& tokenizer) const {
  const text::SftTokensFile prepared(file);
  const auto& view = prepared.view();
  if (view.header().source_digest != digest || view.header().fingerprint != tokenizer.tokenizer().fingerprint())
    throw RuntimeError(
        errors::runtime_text_sft_tokens,
        fmt::format("{}: header: made from other inputs (digest {:016x}, tokenizer {:016x}; expected {:016x}, {:016x})",
                    file.string(), view.header().source_digest, view.header().fingerprint, digest,
                    tokenizer.tokenizer().fingerprint()));
  Kept kept;
  for (std::uint64_t r = 0; r < view.records(); ++r) {
    if (!keeps(static_cast<std::int64_t>(r))) continue;
    const auto record = view.record(r);
    text::SftCutExample cut;
    cut.flags = record.flags;
    for (std::uint64_t i = record.first; i < record.first + record.count; ++i) {
      cut.ids.push_back(view.id(i));
      cut.trained.push_back(view.trained(i));
    }
    kept.add(std::move(cut));
  }
  return kept;
}

HPCTRAIN_RUNTIME_INLINE SftJsonl::Kept SftJsonl::tokenize_here(const text::SftRecipe& recipe,
                                                               const text::PretrainedTokenizer& tokenizer) const {
  const auto renderer = text::sft_renderer(tokenizer, recipe.chat_template);
  Kept kept;
  text::SftReader reader(recipe.jsonl, text::SftJsonlOptions{recipe.tools});
  text::SftRecord record;
  for (std::int64_t index = 0; reader.next(record); ++index)
    if (keeps(index))
      kept.add(text::cut_sft_example(text::tokenize_sft(record, tokenizer, renderer ? &*renderer : nullptr),
                                     recipe.max_length, recipe.drop_overlong));
  return kept;
}

HPCTRAIN_RUNTIME_INLINE text::SftJsonlOptions SftJsonl::read_options(const Knobs& knobs) const {
  text::SftJsonlOptions options;
  if (tools_) options.tools = tools_->get_optional(knobs);
  return options;
}

HPCTRAIN_RUNTIME_INLINE std::shared_ptr<SftDataset> SftJsonl::pack(std::vector<text::SftExample> examples,
                                                                   std::int64_t capacity, std::int64_t pad) {
  std::vector<std::size_t> lengths;
  for (const auto& example : examples) lengths.push_back(example.ids.size() - 1);
  auto rows = text::pack_best_fit_decreasing(lengths, static_cast<std::size_t>(capacity));
  return std::make_shared<SftDataset>(std::move(examples), std::move(rows), pad);
}

namespace detail {
/// The data's tokenizer read on the login node: a directory without one (or with a broken one) is the job's
/// description at fault, refused before the queue (exit 2), not on every rank after it.
inline text::PretrainedTokenizer login_tokenizer(const std::filesystem::path& directory) {
  try {
    return text::load_pretrained_tokenizer(directory);
  } catch (const SpecError&) {
    throw;
  } catch (const Error& error) {  // its message names the file and the place; without its runtime id
    throw SpecError(errors::spec_tokenizer, std::string_view(error.what()).substr(error.id().size() + 3),
                    "the SFT data is tokenized with this tokenizer (the model directory's, or .tokenizer(dir)'s)");
  }
}

/// The login node's data checks (text/sft_checks.hpp) on the rest of a sample whose `first` example is read.
inline void check_sft_sample(const std::filesystem::path& file, text::SftReader& reader, std::size_t first_line,
                             const text::SftExample& first, const text::PretrainedTokenizer& tokenizer,
                             const text::ConversationRenderer* renderer, std::int64_t max_length, bool drop_overlong) {
  constexpr std::int64_t login_sample_records = 1000;  // ~1 s of rendering and tokenizing
  // The first login_sample_records examples, and on until one has a trained token: a file without any must not
  // queue a job, and one with them is found at once. The preparation step checks every example.
  const auto tokens = text::SftCheckTokens::of(tokenizer);
  text::SftDataReport report;
  const auto add = [&](const text::SftExample& example, std::size_t line) {
    report.add(text::cut_sft_example(example, max_length, drop_overlong), line, tokens);
  };
  add(first, first_line);
  text::SftRecord record;
  while ((report.examples < login_sample_records || report.trained == 0) && reader.next(record)) {
    try {
      add(text::tokenize_sft(record, tokenizer, renderer), record.line);
    } catch (const Error& error) {
      throw SpecError(errors::spec_chat_template, fmt::format("{}:{}", file.string(), record.line),
                      fmt::format("the record does not render: {}", error.what()));
    }
  }
  text::refuse_sft_mistakes(report, file, tokenizer, /*whole=*/report.trained == 0);
  // Once a line: the training and the evaluation split of one file are checked alike.
  static std::set<std::string> warned;
  for (const auto& line : text::sft_warnings(report, file, tokenizer, tokens))
    if (warned.insert(line).second) fmt::print(stderr, "{}\n", line);
}

/// `--show-example N`: record N of `file` as the model sees it — its text with the trained spans between ⟦ and ⟧,
/// its ids and its loss mask (1: trained), after the length rule — printed once however many splits read the file.
inline void show_sft_example(const std::filesystem::path& file, const text::SftJsonlOptions& options, std::int64_t n,
                             const text::PretrainedTokenizer& tokenizer, const text::ConversationRenderer* renderer,
                             std::int64_t max_length) {
  static std::set<std::string> shown;
  if (!shown.insert(fmt::format("{}:{}", file.string(), n)).second) return;
  text::SftReader reader(file, options);
  text::SftRecord record;
  for (std::int64_t index = 0; index < n; ++index)
    if (!reader.next(record))
      throw SpecError(errors::spec_knob, fmt::format("--show-example = {}", n),
                      fmt::format("{} holds {} records", file.string(), index));
  const auto example = text::tokenize_sft(record, tokenizer, renderer);
  const auto kept = std::min<std::size_t>(example.ids.size(), static_cast<std::size_t>(max_length));
  std::string text;
  std::int64_t trained = 0;
  for (std::size_t i = 0; i < kept;) {
    std::size_t end = i;
    while (end < kept && example.trained[end] == example.trained[i]) ++end;
    const auto piece = tokenizer.decode(std::span<const text::TokenId>(example.ids.data() + i, end - i));
    if (example.trained[i]) trained += static_cast<std::int64_t>(end - i);
    text += example.trained[i] ? fmt::format("⟦{}⟧", piece) : piece;
    i = end;
  }
  fmt::print("example {} ({}:{}): {} tokens{}, {} trained (⟦...⟧)\n{}\nids:  {}\nmask: {}\n", n, file.string(),
             record.line, kept,
             kept < example.ids.size() ? fmt::format(" of {} (--max-length)", example.ids.size()) : "", trained, text,
             fmt::join(example.ids.begin(), example.ids.begin() + static_cast<std::ptrdiff_t>(kept), " "),
             fmt::join(example.trained.begin(), example.trained.begin() + static_cast<std::ptrdiff_t>(kept), " "));
  std::fflush(stdout);
}
}  // namespace detail

HPCTRAIN_RUNTIME_INLINE std::vector<text::WeightedData> SftJsonl::sources(const Knobs& knobs) const {
  return listed_ ? *listed_ : text::parse_data_mix(file_.get(knobs).string());
}

HPCTRAIN_RUNTIME_INLINE std::optional<DataSizeAtLogin> SftJsonl::check_at_login(
    const Knobs& knobs, const std::optional<std::filesystem::path>& pretrained) const {
  const auto sources = this->sources(knobs);
  if (sources.size() == 1) return check_source_at_login(knobs, sources.front().path, pretrained, true);
  // A mix: its epoch holds as many examples as its sources together (train/data/mix.hpp).
  DataSizeAtLogin size;
  for (const auto& source : sources) {
    const auto part = check_source_at_login(knobs, source.path, pretrained, &source == &sources.front());
    size.examples += part.examples;
    size.what += (size.what.empty() ? "" : "; ") + part.what;
  }
  size.what = fmt::format("{} sources, {} examples an epoch: {}", sources.size(), size.examples, size.what);
  return size;
}

HPCTRAIN_RUNTIME_INLINE DataSizeAtLogin
SftJsonl::check_source_at_login(const Knobs& knobs, const std::filesystem::path& file,
                                const std::optional<std::filesystem::path>& pretrained, bool first) const {
  if (!std::filesystem::exists(file))
    throw SpecError(errors::spec_data_jsonl, file.string(), "no such file or directory");
  const auto records = static_cast<std::int64_t>(text::validate_sft_data(file, read_options(knobs)).examples);
  std::int64_t kept = 0;
  for (std::int64_t index = 0; index < records; ++index) kept += keeps(index) ? 1 : 0;
  const DataSizeAtLogin size{kept, kept == records
                                       ? fmt::format("{} ({} records, counted at login)", file.string(), records)
                                       : fmt::format("{} ({} of its {} records in this split, counted at login)",
                                                     file.string(), kept, records)};
  const auto directory = tokenizer_ ? std::optional(tokenizer_->get(knobs)) : pretrained;
  if (!directory) return size;  // the worker says that a tokenizer is needed
  const auto tokenizer = detail::login_tokenizer(*directory);
  text::SftReader reader(file, read_options(knobs));
  text::SftRecord record;
  if (!reader.next(record)) return size;
  std::optional<text::ConversationRenderer> renderer;
  text::SftExample example;
  try {
    renderer = text::sft_renderer(tokenizer, chat_template_ ? std::optional(chat_template_->get(knobs)) : std::nullopt);
    example = text::tokenize_sft(record, tokenizer, renderer ? &*renderer : nullptr);
  } catch (const Error& error) {
    throw SpecError(errors::spec_chat_template, fmt::format("{}:{}", file.string(), reader.line()),
                    fmt::format("the first record does not render: {}", error.what()));
  }
  detail::check_sft_sample(file, reader, record.line, example, tokenizer, renderer ? &*renderer : nullptr,
                           max_length_.get(knobs), overlong_ == Overlong::drop);
  if (const auto n = show_example_(knobs); n > 0 && first)  // of the first source
    detail::show_sft_example(file, read_options(knobs), n, tokenizer, renderer ? &*renderer : nullptr,
                             max_length_.get(knobs));
  return size;
}

HPCTRAIN_RUNTIME_INLINE data::Source SftJsonl::operator()(const RunContext& run) const {
  auto dataset = load(run);
  const auto description = fmt::format("{} ({} rows)", file_.get(run.knobs).string(), dataset->size());
  return data::Source([dataset] { return dataset; }, description);
}

HPCTRAIN_RUNTIME_INLINE text::SftRecipe SftJsonl::recipe(const Knobs& knobs, const std::filesystem::path& file,
                                                         const std::optional<std::filesystem::path>& pretrained) const {
  text::SftRecipe recipe;
  recipe.jsonl = file;
  const auto directory = tokenizer_ ? std::optional(tokenizer_->get(knobs)) : pretrained;
  if (!directory || directory->empty())
    throw SpecError(errors::spec_data_jsonl, recipe.jsonl.string(),
                    "needs a tokenizer: lm::from_pretrained(...) or .tokenizer(dir)");
  recipe.tokenizer_dir = *directory;
  if (chat_template_) recipe.chat_template = chat_template_->get(knobs);
  recipe.tools = read_options(knobs).tools;
  recipe.max_length = max_length_.get(knobs);
  hpctrain::detail::require(recipe.max_length >= 2, "sft.max_length", recipe.max_length, "must be at least 2");
  recipe.drop_overlong = overlong_ == Overlong::drop;
  return recipe;
}

HPCTRAIN_RUNTIME_INLINE void SftJsonl::prepare_in_job(const Knobs& knobs,
                                                      const std::optional<std::filesystem::path>& pretrained,
                                                      const std::filesystem::path& prepared_dir) const {
  if (!tokenizer_ && !pretrained) return;  // the ranks say that a tokenizer is needed
  for (const auto& source : sources(knobs)) {
    const auto recipe = this->recipe(knobs, source.path, pretrained);
    const auto tokenizer = text::load_pretrained_tokenizer(recipe.tokenizer_dir);
    const auto digest = text::sft_source_digest(recipe, tokenizer);
    const auto file = text::sft_tokens_path(prepared_dir, digest);
    if (text::sft_tokens_prepared(file, digest, tokenizer)) {
      fmt::print("hpctrain: {}: already prepared in {} (the same inputs); not preparing again\n", recipe.jsonl.string(),
                 file.string());
      continue;
    }
    const auto result = text::prepare_sft_tokens(recipe, file);
    const auto& checks = result.checks;
    fmt::print(
        "hpctrain: prepared {}: {} examples, {} tokens in {} ({:.2f} MB/s, {:.0f} examples/s on {} threads); "
        "checks: {} with a trained token, {} doubled BOS, {} ends of turn outside the loss, {} turns ending in "
        "text\n",
        recipe.jsonl.string(), result.records, result.tokens, file.string(), result.megabytes_per_second(),
        result.examples_per_second(), result.threads, checks.trained, checks.doubled_bos, checks.untrained_end_of_turn,
        checks.open_turns);
    for (const auto& line : text::sft_warnings(checks, recipe.jsonl, tokenizer, text::SftCheckTokens::of(tokenizer)))
      fmt::print("{}\n", line);
  }
  std::fflush(stdout);
}

HPCTRAIN_RUNTIME_INLINE std::shared_ptr<const data::Dataset> SftJsonl::load(const RunContext& run) const {
  const auto sources = this->sources(run.knobs);
  if (sources.size() == 1) return load_source(run, sources.front().path);
  // The sources' rows one after the other, in one dataset: a batch may take rows of several.
  std::vector<text::SftExample> examples;
  std::vector<std::vector<std::size_t>> rows;
  std::vector<data::MixPart> parts;
  std::shared_ptr<SftDataset> part;
  for (const auto& source : sources) {
    part = load_source(run, source.path);
    const auto offset = examples.size();
    for (auto row : part->rows()) {
      for (auto& e : row) e += offset;
      rows.push_back(std::move(row));
    }
    auto own = part->release_examples();
    examples.insert(examples.end(), std::make_move_iterator(own.begin()), std::make_move_iterator(own.end()));
    parts.push_back({source.path.string(), part->size(), source.weight.value_or(static_cast<double>(part->size()))});
  }
  // One tokenizer and one length rule for every source: the last one's padding is every one's.
  auto dataset = std::make_shared<SftDataset>(std::move(examples), std::move(rows), part->pad_id());
  dataset->round_lengths(part->length_rounding().first, part->length_rounding().second);
  // Without weights the sources are concatenated; the held-out split keeps each source's examples once.
  if (!sources.front().weight || split_ == Split::validation) return dataset;
  return std::make_shared<data::MixedDataset>(dataset, std::move(parts), static_cast<std::uint64_t>(run.seed));
}

HPCTRAIN_RUNTIME_INLINE std::shared_ptr<SftDataset> SftJsonl::load_source(const RunContext& run,
                                                                          const std::filesystem::path& file) const {
  const auto recipe = this->recipe(run.knobs, file, tokenizer_ ? std::nullopt : tokenizer_directory(run));
  const auto tokenizer = text::load_pretrained_tokenizer(recipe.tokenizer_dir);
  const auto multiple = pad_to_multiple_of_.get(run.knobs);
  hpctrain::detail::require(multiple >= 1, "sft.pad_to_multiple_of", multiple, "must be at least 1");

  // The job's prepared file for exactly these inputs (its name is their digest), else tokenized here.
  std::optional<std::filesystem::path> prepared;
  const auto digest = text::sft_source_digest(recipe, tokenizer);
  if (run.prepared_dir)
    if (const auto path = text::sft_tokens_path(*run.prepared_dir, digest); std::filesystem::is_regular_file(path))
      prepared = path;
  auto kept = prepared ? read_prepared(*prepared, digest, tokenizer) : tokenize_here(recipe, tokenizer);
  if (kept.examples.empty())
    throw SpecError(errors::spec_data_jsonl, file.string(),
                    fmt::format("no example left to train on ({} read)", kept.seen));
  const std::int64_t pad = tokenizer.pad_id().value_or(tokenizer.eos_id().value_or(0));
  auto dataset = packing_.get(run.knobs) ? pack(std::move(kept.examples), recipe.max_length, pad)
                                         : SftDataset::unpacked(std::move(kept.examples), pad);
  dataset->round_lengths(multiple, recipe.max_length);
  if (run.rank == 0) {
    // The padding the batches carry depends on the batch size: the Trainer reports it (SftDataset::fill).
    fmt::print(
        "hpctrain: {}: {} examples read ({}), {} truncated and {} dropped at {} tokens, {} without a trained token "
        "left out; {} rows{}\n",
        file.string(), kept.seen,
        prepared ? "prepared by the job: " + prepared->string() : std::string("tokenized in each rank"), kept.truncated,
        kept.dropped, recipe.max_length, kept.empty, dataset->size(), dataset->packed() ? " (packed)" : "");
    std::fflush(stdout);
  }
  return dataset;
}

HPCTRAIN_RUNTIME_INLINE FinishHook report_response_loss() {
  return FinishHook::unit_by_unit([](const FinishContext& at_end) {  // reads no weight: nothing to gather
    if (at_end.run.rank != 0) return;
    if (at_end.result.eval_loss_at_start)
      fmt::print("response_loss_before={:.8g}\n", *at_end.result.eval_loss_at_start);
    if (at_end.result.eval_loss) fmt::print("response_loss_after={:.8g}\n", *at_end.result.eval_loss);
  });
}
#endif  // HPCTRAIN_RUNTIME_DEFINITIONS

/// At the end, rank 0 prints `response_loss_before=` (Training::evaluate_at_start) and `response_loss_after=`:
/// the mean loss over the trained (response) tokens of the evaluation data, before and after fine-tuning.
HPCTRAIN_RUNTIME_INLINE FinishHook report_response_loss();

}  // namespace hpctrain::lm
