// Supervised fine-tuning (seed 000's workflow in small): a GPT-2 or Llama saved in Hugging Face format,
// fine-tuned data-parallel on the question/answer pairs of the fortunes corpus with the loss on the
// response tokens only, then exported in Hugging Face format again.
//   ./sft --from DIR --local 2                   2 ranks on this machine; DIR = config.json, model.safetensors
//                                                (or shards) and tokenizer.json (or a *.tiktoken file)
//   ./sft --from DIR --submit                    2 nodes x 1 CPU task on the cluster
//   ./sft --from DIR --local 2 --epochs 2 --lr 1e-4 --export out/     knobs: see --help
//   ./sft --from DIR --list-pairs                the examples as JSON lines (text, ids, loss mask); no training
// The log shows `response_loss_before=` (the validation pairs' masked loss of the model as loaded) and,
// at the end, `response_loss_after=` and where the fine-tuned model went (`<run dir>/export` by default):
//   build/examples/generate --model <run dir>/export --prompt $'Q: What is the difference between a duck?\nA:'
//
// Data. Every fortune (the files of /usr/share/games/fortunes, entries separated by "%" lines) is searched
// for a line starting "Q:" followed, after its continuation lines and blank lines, by a line starting "A:".
// The answer runs to the next blank line, "Q:" line or "-- attribution" line; whitespace (line breaks, tabs)
// collapses to one space. A pair becomes the prompt "Q: <question>\nA:" and the response " <answer>" followed
// by the model's end-of-text token (when the config names one inside the vocabulary). Prompt and response
// are tokenized separately and concatenated (for a Llama config with a bos_token_id, BOS goes first: our
// encode adds none and Llama was trained with it). Every 16th pair is held out for validation.
//
// Masking and padding. A batch is right-padded to its longest sequence: a causal model's real positions
// never attend to the padding after them, so no attention mask is needed. The batch's "loss_mask" field
// (per target position) is 1 where the target is a response token and 0 on the prompt and the padding;
// the step's loss is the mean cross entropy over the masked-in tokens. Each rank averages over its own
// micro-batch's response tokens and the strategy averages the gradients over ranks.
#include <hpctrain/hpctrain.hpp>
#include <hpctrain/job/files.hpp>
#include <hpctrain/models/models.hpp>
#include <hpctrain/text/tiktoken.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

using namespace std::chrono_literals;
namespace ht = hpctrain;
namespace hm = hpctrain::models;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t validation_stride = 16;  ///< every 16th pair is held out

// ---- pairs from the fortunes corpus ---------------------------------------------------------------------

/// One question and its answer, whitespace collapsed.
struct Pair {
  std::string question, answer;
  std::string prompt() const { return "Q: " + question + "\nA:"; }
  std::string response() const { return " " + answer; }
};

bool is_blank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }
bool starts_with_tag(std::string_view line, std::string_view tag) { return line.substr(0, tag.size()) == tag; }
bool is_attribution(std::string_view line) {
  const auto first = line.find_first_not_of(" \t");
  return first != std::string_view::npos && line.substr(first, 2) == "--";
}

/// Runs of spaces, tabs and line breaks → one space; no space at either end.
std::string collapse_whitespace(std::string_view text) {
  std::string out;
  bool space = false;
  for (char c : text) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      space = !out.empty();
    } else {
      if (space) out.push_back(' ');
      space = false;
      out.push_back(c);
    }
  }
  return out;
}

/// The Q/A pairs of one fortune (its lines): a "Q:" line and its continuation lines, optional blank lines,
/// then an "A:" line and its continuation lines up to a blank, "Q:" or attribution line.
std::vector<Pair> pairs_in_fortune(const std::vector<std::string>& lines) {
  std::vector<Pair> pairs;
  std::size_t i = 0;
  while (i < lines.size()) {
    if (!starts_with_tag(lines[i], "Q:")) {
      ++i;
      continue;
    }
    std::string question = lines[i].substr(2);
    std::size_t j = i + 1;
    for (; j < lines.size() && !is_blank(lines[j]) && !starts_with_tag(lines[j], "Q:") && !starts_with_tag(lines[j], "A:"); ++j)
      question += "\n" + lines[j];
    while (j < lines.size() && is_blank(lines[j])) ++j;
    if (j == lines.size() || !starts_with_tag(lines[j], "A:")) {  // a question without an answer
      i = j;
      continue;
    }
    std::string answer = lines[j].substr(2);
    std::size_t k = j + 1;
    for (; k < lines.size() && !is_blank(lines[k]) && !starts_with_tag(lines[k], "Q:") && !is_attribution(lines[k]); ++k)
      answer += "\n" + lines[k];
    Pair pair{collapse_whitespace(question), collapse_whitespace(answer)};
    if (!pair.question.empty() && !pair.answer.empty()) pairs.push_back(std::move(pair));
    i = k;
  }
  return pairs;
}

/// Every pair in the fortune files of `directory` (files in name order; `.dat` indexes and `.u8` links skipped).
std::vector<Pair> read_pairs(const fs::path& directory) {
  std::vector<fs::path> files;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(directory, error)) {
    const auto name = entry.path().filename().string();
    if (entry.is_symlink() || !entry.is_regular_file() || entry.path().has_extension()) continue;
    files.push_back(entry.path());
  }
  if (error) throw ht::RuntimeError(ht::errors::runtime_io, fmt::format("{}: cannot list the fortune files: {}", directory.string(), error.message()));
  std::sort(files.begin(), files.end());
  std::vector<Pair> pairs;
  for (const auto& file : files) {
    std::ifstream in(file);
    std::vector<std::string> fortune;
    std::string line;
    const auto flush = [&] {
      for (auto& pair : pairs_in_fortune(fortune)) pairs.push_back(std::move(pair));
      fortune.clear();
    };
    while (std::getline(in, line)) {
      if (line == "%") flush();
      else fortune.push_back(line);
    }
    flush();
  }
  if (pairs.empty())
    throw ht::RuntimeError(ht::errors::runtime_io, fmt::format("{}: no \"Q: ... A: ...\" pairs in its fortune files", directory.string()));
  return pairs;
}

// ---- examples: token ids and the loss mask -----------------------------------------------------------

/// A tokenized pair: `ids` = [BOS] prompt response [EOS]; the first `prompt_tokens` ids are the prompt.
struct Example {
  std::vector<std::int64_t> ids;
  std::int64_t prompt_tokens = 0;
};

/// What a checkpoint directory says about tokens: its tokenizer file and the special ids it needs.
struct TokenSetup {
  fs::path tokenizer_file;
  std::optional<std::int64_t> bos, eos;  ///< bos only for Llama configs; both only inside the vocabulary
  std::int64_t vocab_size = 0, max_length = 0;
};

/// The tokenizer file of a checkpoint directory: tokenizer.json, else the first *.tiktoken file.
std::optional<fs::path> find_tokenizer(const fs::path& directory) {
  if (fs::is_regular_file(directory / "tokenizer.json")) return directory / "tokenizer.json";
  std::vector<fs::path> candidates;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(directory, error))
    if (entry.path().extension() == ".tiktoken") candidates.push_back(entry.path());
  std::sort(candidates.begin(), candidates.end());
  if (candidates.empty()) return std::nullopt;
  return candidates.front();
}

/// Whether `directory` looks like a checkpoint sft can start from (the --from knob's check).
bool is_checkpoint_directory(const std::string& directory) {
  return fs::is_regular_file(fs::path(directory) / "config.json") && find_tokenizer(directory).has_value();
}

TokenSetup token_setup(const fs::path& directory, std::int64_t max_length) {
  TokenSetup setup;
  const auto tokenizer = find_tokenizer(directory);
  if (!tokenizer)
    throw ht::SpecError(ht::errors::spec_knob, "--from = " + directory.string(), "holds neither tokenizer.json nor a *.tiktoken file");
  setup.tokenizer_file = *tokenizer;
  const auto type = hm::detail::read_json_file(directory / "config.json").value("model_type", std::string());
  const auto inside = [&](std::optional<std::int64_t> id) { return id && *id >= 0 && *id < setup.vocab_size ? id : std::nullopt; };
  if (type == "llama") {
    const auto config = hm::read_llama_config(directory);
    setup.vocab_size = config.vocab_size;
    setup.bos = inside(config.bos_token_id);
    setup.eos = inside(config.eos_token_id);
    setup.max_length = max_length;
  } else {
    const auto config = hm::read_gpt2_config(directory);  // load_pretrained refuses other model types later
    setup.vocab_size = config.vocab_size;
    setup.eos = inside(config.eos_token_id);
    setup.max_length = std::min(max_length, config.n_positions);
  }
  return setup;
}

/// The example of `pair`, cut to `setup.max_length + 1` ids (inputs and targets are one shorter).
Example tokenize(const Pair& pair, const ht::text::Tokenizer& tokenizer, const TokenSetup& setup) {
  Example example;
  if (setup.bos) example.ids.push_back(*setup.bos);
  for (auto id : tokenizer.encode(pair.prompt())) example.ids.push_back(id);
  example.prompt_tokens = static_cast<std::int64_t>(example.ids.size());
  for (auto id : tokenizer.encode(pair.response())) example.ids.push_back(id);
  if (setup.eos) example.ids.push_back(*setup.eos);
  if (static_cast<std::int64_t>(example.ids.size()) > setup.max_length + 1) example.ids.resize(static_cast<std::size_t>(setup.max_length + 1));
  return example;
}

/// The loss mask of `example` per target position t (the target is ids[t + 1]): 1 on response tokens.
std::vector<float> loss_mask(const Example& example) {
  std::vector<float> mask(example.ids.size() - 1, 0.0F);
  for (std::size_t t = 0; t + 1 < example.ids.size(); ++t) mask[t] = static_cast<std::int64_t>(t + 1) >= example.prompt_tokens ? 1.0F : 0.0F;
  return mask;
}

/// Tokenized pairs; a batch is right-padded to its longest example, with a "loss_mask" field.
class PairDataset : public ht::data::Dataset {
 public:
  explicit PairDataset(std::vector<Example> examples) : examples_(std::move(examples)) {}
  std::int64_t size() const override { return static_cast<std::int64_t>(examples_.size()); }
  ht::data::Batch batch(const std::vector<std::int64_t>& indices) const override {
    std::int64_t length = 1;
    for (auto i : indices) length = std::max<std::int64_t>(length, static_cast<std::int64_t>(examples_[static_cast<std::size_t>(i)].ids.size()) - 1);
    const auto n = static_cast<std::int64_t>(indices.size());
    auto inputs = torch::zeros({n, length}, torch::kInt64), targets = torch::zeros({n, length}, torch::kInt64);
    auto mask = torch::zeros({n, length}, torch::kFloat32);
    auto in = inputs.accessor<std::int64_t, 2>(), out = targets.accessor<std::int64_t, 2>();
    auto m = mask.accessor<float, 2>();
    for (std::int64_t row = 0; row < n; ++row) {
      const auto& example = examples_[static_cast<std::size_t>(indices[static_cast<std::size_t>(row)])];
      const auto row_mask = loss_mask(example);
      for (std::size_t t = 0; t < row_mask.size(); ++t) {
        in[row][static_cast<std::int64_t>(t)] = example.ids[t];
        out[row][static_cast<std::int64_t>(t)] = example.ids[t + 1];
        m[row][static_cast<std::int64_t>(t)] = row_mask[t];
      }
    }
    return {inputs, targets, {{"loss_mask", mask}}};
  }

 private:
  std::vector<Example> examples_;
};

// ---- the run's shared state ----------------------------------------------------------------------------

/// What the model factory, the data sources and the report logger share in one process: the knobs they
/// need before the step sees them (factories cannot read knobs yet), the examples, and the model.
struct Session {
  fs::path from, fortunes, export_dir;
  std::int64_t max_length = 256;
  // Made once per process, by whichever of the model factory and the data sources runs first.
  bool loaded = false;
  std::int64_t pairs_found = 0;
  TokenSetup tokens;
  std::vector<Example> train, validation;
  std::vector<Pair> train_pairs, validation_pairs;  ///< the text of `train` and `validation`, in order
  std::shared_ptr<hm::CausalLM> model;
  std::optional<double> loss_before;
  double seconds_before = 0;

  void require_from() const {
    if (from.empty()) throw ht::SpecError(ht::errors::spec_knob, "--from", "is required: a Hugging Face directory (config.json, model.safetensors, tokenizer file)");
    if (!fs::is_directory(from)) throw ht::SpecError(ht::errors::spec_knob, "--from = " + from.string(), "no such directory");
    if (!fs::is_regular_file(from / "config.json"))
      throw ht::SpecError(ht::errors::spec_knob, "--from = " + from.string(), "has no config.json (not a Hugging Face checkpoint directory)");
  }

  void load() {
    if (loaded) return;
    require_from();
    tokens = token_setup(from, max_length);
    const auto tokenizer = ht::text::load_tokenizer(tokens.tokenizer_file);
    const auto pairs = read_pairs(fortunes);
    pairs_found = static_cast<std::int64_t>(pairs.size());
    for (std::size_t i = 0; i < pairs.size(); ++i) {
      auto example = tokenize(pairs[i], tokenizer, tokens);
      if (static_cast<std::int64_t>(example.ids.size()) <= example.prompt_tokens) continue;  // the prompt fills the context
      if (static_cast<std::int64_t>(i) % validation_stride == validation_stride / 2) {
        validation.push_back(std::move(example));
        validation_pairs.push_back(pairs[i]);
      } else {
        train.push_back(std::move(example));
        train_pairs.push_back(pairs[i]);
      }
    }
    loaded = true;
  }
};

/// Per-token cross entropy of `logits` against the targets, times the loss mask: {sum, masked-in count}.
std::pair<torch::Tensor, torch::Tensor> masked_cross_entropy(const torch::Tensor& logits, const ht::data::Batch& batch) {
  const auto per_token = torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32), batch.targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  const auto mask = batch.field("loss_mask").reshape({-1}).to(per_token.dtype());
  return {(per_token * mask).sum(), mask.sum()};
}

/// The step seam: the mean cross entropy over the micro-batch's response tokens.
torch::Tensor response_step(ht::StepContext& context, const ht::data::Batch& batch) {
  const auto [sum, count] = masked_cross_entropy(context.forward(batch.inputs), batch);
  return sum / count.clamp_min(1);
}

/// The evaluation seam: the same mean, weighted by the response tokens (so the Trainer's eval loss is the
/// mean over every response token of the validation pairs).
ht::EvalOutput response_eval_step(ht::StepContext& context, const ht::data::Batch& batch) {
  auto logits = context.forward(batch.inputs);
  const auto [sum, count] = masked_cross_entropy(logits, batch);
  return {sum / count.clamp_min(1), logits, count.to(torch::kFloat64)};
}

/// The mean cross entropy over every response token of `examples`, computed in this process alone (fp32).
double response_loss(hm::CausalLM& model, const std::vector<Example>& examples) {
  torch::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const PairDataset dataset(examples);
  double sum = 0, count = 0;
  for (std::int64_t begin = 0; begin < dataset.size(); begin += 8) {
    std::vector<std::int64_t> indices;
    for (auto i = begin; i < std::min(dataset.size(), begin + 8); ++i) indices.push_back(i);
    const auto batch = dataset.batch(indices);
    const auto [s, c] = masked_cross_entropy(model.forward(batch.inputs), batch);
    sum += s.to(torch::kFloat64).item<double>();
    count += c.item<double>();
  }
  model.train(was_training);
  return sum / std::max(count, 1.0);
}

/// Copies the tokenizer file next to the exported weights (atomically, as the weights are written).
void copy_tokenizer(const fs::path& file, const fs::path& directory) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream content;
  if (in.is_open()) content << in.rdbuf();
  if (!in.is_open() || in.bad()) throw ht::RuntimeError(ht::errors::runtime_io, fmt::format("{}: cannot read", file.string()));
  ht::detail::write_file_atomically(directory / file.filename(), content.str());
}

/// Rank 0's report: the data and the loss before at the start; at the end (after the final evaluation,
/// which gathers the full model under any strategy) the loss after and the Hugging Face export.
class SftReport : public ht::Logger {
 public:
  explicit SftReport(std::shared_ptr<Session> session) : session_(std::move(session)) {}
  void start(const ht::RunInfo& info) override {
    run_dir_ = info.run_dir;
    const auto& s = *session_;
    fmt::print("sft: {} Q/A pairs in {}: {} train, {} validation; tokenizer {}{}{}\n", s.pairs_found, s.fortunes.string(), s.train.size(),
               s.validation.size(), s.tokens.tokenizer_file.string(), s.tokens.bos ? fmt::format(", BOS {} first", *s.tokens.bos) : "",
               s.tokens.eos ? fmt::format(", EOS {} last", *s.tokens.eos) : "");
    if (s.loss_before) fmt::print("response_loss_before={:.8g}  (validation, prompt masked; {:.2f} s)\n", *s.loss_before, s.seconds_before);
    std::fflush(stdout);
    clock_ = std::chrono::steady_clock::now();
  }
  void log(const ht::LogRecord&) override {}
  void finish() override {
    auto& s = *session_;
    const auto train_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_).count();
    const double after = response_loss(*s.model, s.validation);
    if (s.loss_before) fmt::print("response_loss_before={:.8g}\n", *s.loss_before);
    fmt::print("response_loss_after={:.8g}  (validation, prompt masked; training took {:.1f} s)\n", after, train_seconds);
    const auto directory = s.export_dir.empty() ? run_dir_ / "export" : s.export_dir;
    if (auto* gpt2 = dynamic_cast<hm::GPT2Impl*>(s.model.get())) hm::save_pretrained(*gpt2, directory);
    else if (auto* llama = dynamic_cast<hm::LlamaImpl*>(s.model.get())) hm::save_pretrained(*llama, directory);
    copy_tokenizer(s.tokens.tokenizer_file, directory);
    fmt::print("sft: exported the fine-tuned model to {}\n", directory.string());
    std::fflush(stdout);
  }

 private:
  std::shared_ptr<Session> session_;
  fs::path run_dir_;
  std::chrono::steady_clock::time_point clock_;
};

// ---- the command line --------------------------------------------------------------------------------

/// The value of `--name VALUE` or `--name=VALUE` in argv (the last one given), as the knob parser reads it.
std::optional<std::string> argument(int argc, char** argv, std::string_view name) {
  std::optional<std::string> value;
  const std::string flag = "--" + std::string(name);
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == flag && i + 1 < argc) value = argv[++i];
    else if (arg.starts_with(flag + "=")) value = std::string(arg.substr(flag.size() + 1));
  }
  return value;
}

bool has_flag(int argc, char** argv, std::string_view flag) {
  for (int i = 1; i < argc; ++i)
    if (argv[i] == flag) return true;
  return false;
}

/// `--list-pairs`: every example as a JSON line (split, prompt, response, ids, loss mask per target).
int list_pairs(Session& session) {
  session.load();
  const auto print = [](const char* split, const std::vector<Example>& examples, const std::vector<Pair>& pairs) {
    for (std::size_t i = 0; i < examples.size(); ++i) {
      const nlohmann::json line{{"split", split}, {"prompt", pairs[i].prompt()}, {"response", pairs[i].response()}, {"ids", examples[i].ids},
                                {"prompt_tokens", examples[i].prompt_tokens}, {"loss_mask", loss_mask(examples[i])}};
      std::cout << line.dump() << "\n";
    }
  };
  print("train", session.train, session.train_pairs);
  print("validation", session.validation, session.validation_pairs);
  std::cerr << fmt::format("sft: {} Q/A pairs: {} train, {} validation\n", session.pairs_found, session.train.size(), session.validation.size());
  return ht::exit_ok;
}

}  // namespace

int main(int argc, char** argv) {
  ht::install_spec_error_exit();
  auto session = std::make_shared<Session>();
  session->from = argument(argc, argv, "from").value_or("");
  session->fortunes = argument(argc, argv, "fortunes").value_or("/usr/share/games/fortunes");
  session->export_dir = argument(argc, argv, "export").value_or("");
  for (const char* name : {"max_length", "max-length"})
    if (const auto length = argument(argc, argv, name)) {
      try {
        session->max_length = std::stoll(*length);
      } catch (const std::exception&) {  // not a number: the knob parser refuses it below, naming the knob
      }
    }

  auto job = ht::Job("sft")
                 .nodes(2).tasks_per_node(1).cpus_per_task(1)
                 .time(30min).partition("debug")
                 .requeue_on_timeout(1min);

  auto training = ht::Training()
                      .model([session] {
                        session->load();
                        session->model = hm::load_pretrained(session->from);
                        const auto start = std::chrono::steady_clock::now();
                        session->loss_before = response_loss(*session->model, session->validation);
                        session->seconds_before = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                        return session->model;
                      })
                      .optimizer([](const ht::NamedParameters& parameters) {
                        const auto options = torch::optim::AdamWOptions(3e-4).betas({0.9, 0.95}).weight_decay(0.01);
                        return torch::optim::AdamW(ht::weight_decay_groups(parameters, options), options);
                      })
                      .train_data(ht::data::Source([session] { session->load(); return PairDataset(session->train); }, "fortune Q/A pairs (train)"))
                      .eval_data(ht::data::Source([session] { session->load(); return PairDataset(session->validation); }, "fortune Q/A pairs (validation)"))
                      .step(response_step)
                      .eval_step(response_eval_step)
                      .metric(ht::metrics::perplexity)
                      .batch_size(ht::global(16))
                      .eval_batch_size(16)
                      .epochs(3)
                      .schedule(ht::LrSchedule::warmup_cosine(5, 0.1))
                      .clip_grad_norm(1.0)
                      .seed(1)
                      .log_every(5)
                      .eval_every(20)
                      .checkpoint_every(50)
                      .keep_checkpoints(1)
                      .logger([session] { return std::make_unique<SftReport>(session); })
                      .knob<std::string>("from", "", "Hugging Face directory to start from (config.json, safetensors, tokenizer.json or *.tiktoken)",
                                         ht::KnobCheck<std::string>([](const std::string& v) { return v.empty() || is_checkpoint_directory(v); },
                                                                    "must be a directory holding config.json and tokenizer.json (or a *.tiktoken file)"))
                      .knob<std::string>("export", "", "where to write the fine-tuned model (default: <run dir>/export)")
                      .knob<std::string>("fortunes", "/usr/share/games/fortunes", "directory of fortune files to take Q/A pairs from")
                      .knob<std::int64_t>("max_length", 256, "longest sequence in tokens (longer pairs are cut)", ht::at_least(8));

  if (has_flag(argc, argv, "--list-pairs")) {
    try {
      return list_pairs(*session);
    } catch (const ht::SpecError& error) {
      std::cerr << error.what() << "\n";
      return ht::exit_usage;
    } catch (const std::exception& error) {
      std::cerr << error.what() << "\n";
      return ht::exit_failure;
    }
  }
  if ((has_flag(argc, argv, "--submit") || has_flag(argc, argv, "--local")) && session->from.empty()) {
    std::cerr << ht::SpecError(ht::errors::spec_knob, "--from", "is required: the Hugging Face directory to fine-tune").what() << "\n";
    return ht::exit_usage;
  }
  return ht::run(argc, argv, job, training);
}
