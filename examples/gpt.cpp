// A small GPT-2 (models/gpt2.hpp) pretrained from scratch on the fortunes corpus, data-parallel.
//   ./gpt --local 2 --max-steps 30        2 ranks on this machine: falling loss and tokens/s in a minute or two
//   ./gpt --local 2                       the full default run: 300 steps of 16 x 128 tokens
//   ./gpt --submit                        2 nodes x 1 CPU task on the cluster (scripts/demo with HPCTRAIN_DEMO_EXAMPLE=gpt)
//   ./gpt --help                          every knob: model size, sequence length, schedule, precision, ...
// The job's preparation step tokenizes /usr/share/games/fortunes once with GPT-2's BPE (a 95/5 split by
// fortune into train.tokens / val.tokens); every rank then reads the token files memory-mapped. Training:
// AdamW with weight-decay groups, warmup + cosine, gradient clipping, bf16 autocast where the CPU has bf16
// instructions (or on a GPU), validation loss and perplexity every --eval-every steps, checkpoints and
// USR2 -> checkpoint -> requeue as the CNN example has. At the end rank 0 prints `val_loss=<value>`, a greedy
// sample from our generation code, and exports the model in Hugging Face format to <run dir>/export/
// (config.json, model.safetensors, gpt2.tiktoken) — what `generate --model` and `sft --from` read.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include <hpctrain/hpctrain.hpp>
#include <hpctrain/models/models.hpp>
#include <hpctrain/text/prepare_step.hpp>

using namespace std::chrono_literals;
namespace ht = hpctrain;
namespace hm = hpctrain::models;
namespace fs = std::filesystem;

namespace {

const char* const fortunes_dir = "/usr/share/games/fortunes";  // Debian's `fortunes`

/// GPT-2's ranks, installed by scripts/setup (HPCTRAIN_GPT_TOKENIZER overrides: a tokenizer.json or *.tiktoken).
fs::path tokenizer_file() {
  if (const char* file = std::getenv("HPCTRAIN_GPT_TOKENIZER"); file != nullptr && *file != '\0') return file;
  const char* home = std::getenv("HOME");
  return fs::path(home != nullptr ? home : "") / ".cache/hpctrain/gpt2.tiktoken";
}

/// Every fortune file (the `.dat` indexes and the `.u8` links to the same files left out), in name order.
std::vector<fs::path> fortune_files() {
  std::vector<fs::path> files;
  if (fs::is_directory(fortunes_dir))
    for (const auto& entry : fs::directory_iterator(fortunes_dir))
      if (entry.is_regular_file() && !entry.is_symlink() && entry.path().extension() != ".dat") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

/// Whether this CPU runs bf16 matrix products natively (AVX512-BF16 or AMX): there CPU autocast pays off.
bool cpu_has_bf16() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line))
    if (line.rfind("flags", 0) == 0) return line.find(" avx512_bf16") != std::string::npos || line.find(" amx_bf16") != std::string::npos;
  return false;
}

/// The knob `--precision`: auto means bf16 on a GPU or a CPU with bf16 instructions, else fp32.
ht::Precision precision_for(const std::string& knob) {
  if (knob == "bf16") return ht::bf16;
  if (knob == "fp32") return ht::fp32;
  return torch::cuda::is_available() || cpu_has_bf16() ? ht::bf16 : ht::fp32;
}

/// Mean cross entropy per target token of logits [B, T, V] against targets [B, T], in fp32 under autocast.
torch::Tensor language_model_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32), targets.reshape({-1}));
}

/// Evaluation weighs each batch by its target tokens, so the loss (and the perplexity) is per token.
ht::EvalOutput language_model_eval(ht::StepContext& context, const ht::data::Batch& batch) {
  auto logits = context.forward(batch.inputs);
  auto loss = context.loss(logits, batch.targets);
  auto weight = torch::scalar_tensor(static_cast<double>(batch.targets.numel()), torch::TensorOptions(torch::kFloat64).device(context.device));
  return {std::move(loss), std::move(logits), std::move(weight)};
}

/// The description without the parts that depend on knob values (model, optimizer, data, precision, schedule):
/// train_gpt adds them in the worker.
ht::Training describe() {
  return ht::Training()
      .loss(language_model_loss)
      .eval_step(language_model_eval)
      .batch_size(ht::global(16))  // 16 windows of --seq-len tokens per optimizer step, at any world size dividing 16
      .epochs(100)                 // the step budget below ends the run first
      .max_steps(300)             // about 0.9 epoch of the corpus; --max-steps changes it
      .lr(1e-3)
      .clip_grad_norm(1.0)
      .seed(1)
      .eval_batch_size(16)
      .keep_checkpoints(2)
      .metric(ht::metrics::perplexity)
      .knob<std::int64_t>("n_layer", 4, "transformer blocks", ht::positive())
      .knob<std::int64_t>("n_head", 4, "attention heads (must divide --n-embd)", ht::positive())
      .knob<std::int64_t>("n_embd", 128, "model width", ht::positive())
      .knob<std::int64_t>("seq_len", 128, "tokens per training window (and the model's n_positions)", ht::positive())
      .knob<double>("dropout", 0.0, "dropout of embeddings, attention and residuals",
                    ht::KnobCheck<double>([](double p) { return p >= 0.0 && p < 1.0; }, "must be in [0, 1)"))
      .knob<double>("weight_decay", 0.1, "AdamW weight decay of the matrices (biases, norms: none)", ht::non_negative())
      .knob<std::int64_t>("warmup_steps", 30, "linear warmup steps before the cosine decay", ht::non_negative())
      .knob<double>("min_lr_fraction", 0.1, "the cosine ends at this fraction of --lr",
                    ht::KnobCheck<double>([](double f) { return f >= 0.0 && f <= 1.0; }, "must be in [0, 1]"))
      .knob<std::string>("precision", "auto", "bf16, fp32, or auto (bf16 on a GPU or a CPU with AVX512-BF16/AMX)",
                         ht::KnobCheck<std::string>([](const std::string& p) { return p == "auto" || p == "bf16" || p == "fp32"; },
                                                    "must be auto, bf16 or fp32"))
      .knob<std::int64_t>("log_every", 10, "steps between progress lines", ht::positive())
      .knob<std::int64_t>("eval_every", 100, "steps between validation passes (0: only at the end)", ht::non_negative())
      .knob<std::int64_t>("checkpoint_every", 100, "steps between checkpoints (0: only at the end)", ht::non_negative())
      .knob<std::string>("prompt", "Q: What is the meaning of life?\nA:", "prompt of the sample printed at the end")
      .knob<std::int64_t>("sample_tokens", 40, "tokens of the greedy sample printed at the end", ht::non_negative())
      .knob<bool>("save_initial", false, "also write the step-0 weights to <run dir>/initial/ (the loss-curve oracle test reads them)");
}

/// The model the knobs ask for: GPT-2 with the vocabulary of the tokenizer that made the token files.
hm::GPT2Config model_config(const ht::Knobs& knobs, std::int64_t vocab_size) {
  hm::GPT2Config config;
  config.vocab_size = vocab_size;
  config.n_layer = knobs.get<std::int64_t>("n_layer");
  config.n_head = knobs.get<std::int64_t>("n_head");
  config.n_embd = knobs.get<std::int64_t>("n_embd");
  config.n_positions = knobs.get<std::int64_t>("seq_len");
  config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = knobs.get<double>("dropout");
  config.validate();  // --n-head 5 with --n-embd 128 fails here, naming the field
  return config;
}

/// The end of a finished run, on rank 0: val_loss, a greedy sample, and the Hugging Face export.
void finish(hm::GPT2Impl& model, const ht::TrainResult& result, const ht::Knobs& knobs, const fs::path& run_dir) {
  const auto export_dir = run_dir / "export";
  hm::save_pretrained(model, export_dir);
  const auto tokenizer_path = tokenizer_file();
  fs::copy_file(tokenizer_path, export_dir / tokenizer_path.filename(), fs::copy_options::overwrite_existing);
  const auto tokenizer = ht::text::load_tokenizer(tokenizer_path);
  std::vector<std::int64_t> prompt;
  for (auto id : tokenizer.encode(knobs.get<std::string>("prompt"))) prompt.push_back(static_cast<std::int64_t>(id));
  hm::GenerationOptions options;
  options.max_new_tokens = std::min(knobs.get<std::int64_t>("sample_tokens"), model.config().n_positions - static_cast<std::int64_t>(prompt.size()));
  std::string sample;
  if (!prompt.empty() && options.max_new_tokens > 0) {
    const auto tokens = hm::generate(model, prompt, options);
    sample = tokenizer.decode(std::vector<ht::text::TokenId>(tokens.begin(), tokens.end()));
  }
  std::cout << fmt::format("exported the model to {} (config.json, model.safetensors, {})\n", export_dir.string(),
                           tokenizer_path.filename().string());
  if (!sample.empty()) std::cout << fmt::format("sample (greedy): {}{}\n", knobs.get<std::string>("prompt"), sample);
  if (result.eval_loss) std::cout << fmt::format("val_loss={:.4f}\n", *result.eval_loss);
  std::cout << std::flush;
}

/// One rank: the knob-dependent parts of the description, training, then rank 0's finish.
int train_gpt(ht::Training training, const ht::Knobs& knobs) {
  const auto world = ht::slurm::world_from_environment();
  const auto tokens_dir = ht::text::prepared_tokens_dir();
  const auto train_tokens = tokens_dir / "train.tokens";
  const auto header = ht::text::read_token_file_header(train_tokens);
  const auto config = model_config(knobs, static_cast<std::int64_t>(header.vocab_size));
  const std::int64_t seq_len = config.n_positions;
  const auto run_dir = ht::resolve_run_directory(training.run_dir()).path;
  std::optional<fs::path> initial_dir;
  if (knobs.get<bool>("save_initial") && world.rank == 0) initial_dir = run_dir / "initial";

  auto trained = std::make_shared<hm::GPT2>(nullptr);  // the factory's model: rank 0 exports it after training
  training.model([config, trained, initial_dir] {
            hm::GPT2 model(config);  // seeded by the Trainer: rank 0's initialisation is broadcast to all
            if (initial_dir) hm::save_pretrained(*model, *initial_dir);
            *trained = model;
            return model;
          })
      .optimizer([knobs](const ht::NamedParameters& parameters) {
        auto options = torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(knobs.get<double>("weight_decay"));
        return torch::optim::AdamW(ht::weight_decay_groups(parameters, options), options);
      })
      .train_data(ht::data::tokens(train_tokens, seq_len, ht::data::TokenFileOptions().fingerprint(header.fingerprint)))
      .eval_data(ht::data::tokens(tokens_dir / "val.tokens", seq_len, ht::data::TokenFileOptions().fingerprint(header.fingerprint)))
      .precision(precision_for(knobs.get<std::string>("precision")))
      .schedule(ht::LrSchedule::warmup_cosine(knobs.get<std::int64_t>("warmup_steps"), knobs.get<double>("min_lr_fraction")))
      .log_every(knobs.get<std::int64_t>("log_every"))
      .eval_every(knobs.get<std::int64_t>("eval_every"))
      .checkpoint_every(knobs.get<std::int64_t>("checkpoint_every"))
      .flops_per_example(static_cast<double>(hm::flops_per_token(config, seq_len) * seq_len));
  const auto configured = ht::with_knobs(training, knobs);
  if (world.rank == 0) fmt::print("hpctrain: {}\n", ht::resolve_run_directory(configured.run_dir()).describe());
  std::fflush(stdout);
  const auto result = ht::train(configured, world);
  if (result.exit_code == ht::exit_ok && world.rank == 0) finish(**trained, result, knobs, run_dir);
  return result.exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  ht::install_spec_error_exit();  // a wrong setter below exits 2 naming the field, like the command line
  auto job = ht::Job("gpt")
                 .nodes(2).tasks_per_node(1).cpus_per_task(1)
                 .time(30min).partition("debug")
                 .requeue_on_timeout(1min)  // USR2 a minute before the limit: checkpoint, requeue, resume
                 .prepare(ht::text::prepare_tokens_step(fortune_files(), tokenizer_file(),
                                                        ht::text::PrepareOptions().validation_fraction(0.05)));
  const auto training = describe();
  ht::Knobs knobs;
  try {
    knobs = ht::training_knobs(training);  // the rest is validated in the worker, once the knobs made it whole
  } catch (const ht::SpecError& error) {
    std::cerr << error.what() << "\n";
    return ht::exit_usage;
  }
  return ht::run_job(argc, argv, job, knobs, [&training](const ht::Knobs& values) {
    try {
      return train_gpt(training, values);
    } catch (const ht::SpecError& error) {
      std::cerr << error.what() << "\n";
      return ht::exit_usage;
    } catch (const std::exception& error) {  // RuntimeError, and c10::Error from LibTorch
      std::cerr << error.what() << "\n";
      return ht::exit_failure;
    }
  });
}
