#pragma once
// Direct preference optimisation (DPO), as TRL's DPOTrainer trains it (trl 0.24): preference pairs from JSONL
// (lm/preference_data.hpp), each batch's chosen and rejected completions through one forward of the policy, the loss
// of lm/dpo_loss.hpp against a reference — the start weights. With LoRA (`--lora-r N`) the reference is the same
// model with its adapters switched off (models::AdaptersOff; TRL's behaviour with PEFT); without, the job's preparation
// step computes the reference log-probabilities of every pair once from the start weights and stores them with the
// tokens: training holds one model. `--loss-chunk-tokens N` applies the head N tokens at a time (lm/chunked_logps.hpp).
// The train records carry TRL's metrics (StepContext::report), the evaluation records them as `eval_<name>`.
//
// Defined inline in this header, not in the compiled runtime (compiled_runtime.hpp): a program that includes it
// compiles the DPO pieces itself.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <hpctrain/checksums.hpp>
#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>
#include <hpctrain/files.hpp>
#include <hpctrain/lm/chunked_logps.hpp>
#include <hpctrain/lm/dpo_loss.hpp>
#include <hpctrain/lm/lm.hpp>
#include <hpctrain/lm/loss.hpp>
#include <hpctrain/lm/preference_data.hpp>
#include <hpctrain/lm/setting.hpp>
#include <hpctrain/lm/sft.hpp>
#include <hpctrain/models/hf/hf_checkpoint.hpp>
#include <hpctrain/models/lora/lora_layer.hpp>
#include <hpctrain/text/chat_template.hpp>
#include <hpctrain/text/pretrained_tokenizer.hpp>
#include <hpctrain/train/metrics.hpp>
#include <hpctrain/train/run_context.hpp>
#include <hpctrain/train/step.hpp>
#include <hpctrain/train/training.hpp>

namespace hpctrain::lm {

/// `--ref-model`'s directory where the run declares that knob and gives one (dpo_training), else nothing.
inline std::optional<std::filesystem::path> held_reference_directory(const Knobs& knobs) {
  if (!knobs.find("ref_model")) return std::nullopt;
  const auto directory = knobs.get<std::string>("ref_model");
  if (directory.empty()) return std::nullopt;
  return std::filesystem::path(directory);
}

/// Whether the reference is the start weights' log-probabilities, computed once and stored with the pairs: not with
/// LoRA (the model with its adapters off is the reference) nor with `--ref-model` (a model held in memory).
inline bool stores_reference(const Knobs& knobs) {
  const bool lora = knobs.find("lora_r") && knobs.get<std::int64_t>("lora_r") > 0;
  return !lora && !held_reference_directory(knobs);
}

/// `--loss-chunk-tokens` where the run declares it (dpo_training does), else 0: the whole logits.
inline std::int64_t loss_chunk_tokens(const Knobs& knobs) {
  return knobs.find(loss_chunk_knob) ? knobs.get<std::int64_t>(loss_chunk_knob) : 0;
}

/// completion_logps of `model` on `inputs` [N, T] against `targets` [N, T], the head applied `chunk` tokens at a time
/// (lm/chunked_logps.hpp): the same sums, the N × T × vocabulary logits never whole. `vocabulary`: the head's rows.
inline CompletionLogps chunked_completion_logps(models::CausalLM& model, const torch::Tensor& inputs,
                                                const torch::Tensor& targets, std::int64_t chunk,
                                                std::int64_t* vocabulary = nullptr) {
  torch::Tensor logit_sums;
  const auto token_logps = model.with_head(model.hidden_states(inputs), [&](const torch::Tensor& h) {
    auto [logps, sums] =
        chunked_token_logps(h, model.head_weight(), targets, chunk, ignore_index, model.final_logit_softcap());
    logit_sums = std::move(sums);
    if (vocabulary) *vocabulary = model.head_weight().size(0);
    return logps;
  });
  const auto mask = targets.ne(ignore_index).to(torch::kFloat32);
  return {token_logps.sum(-1), mask.sum(-1), logit_sums.sum(-1), token_logps};
}

/// The data factory of `preference_jsonl`: options as chained setters (each a value or `lm::knob(...)`).
class PreferenceJsonl {
 public:
  explicit PreferenceJsonl(Setting<std::filesystem::path> file) : file_(std::move(file)) {}
  /// Tokens of prompt + completion, the end kept (TRL's max_length, truncation_mode "keep_end"). Default: 1024.
  PreferenceJsonl& max_length(Setting<std::int64_t> tokens) {
    max_length_ = std::move(tokens);
    return *this;
  }
  /// The prompt's last tokens kept (TRL's max_prompt_length). Default: 512.
  PreferenceJsonl& max_prompt_length(Setting<std::int64_t> tokens) {
    max_prompt_length_ = std::move(tokens);
    return *this;
  }
  /// Each completion's first tokens kept, its EOS counted (TRL's max_completion_length); 0: all. Default: 0.
  PreferenceJsonl& max_completion_length(Setting<std::int64_t> tokens) {
    max_completion_length_ = std::move(tokens);
    return *this;
  }
  /// Keep a deterministic part of the file, as lm::SftJsonl::split does. Default: all.
  PreferenceJsonl& split(Split part, std::int64_t every = 16) {
    hpctrain::detail::require(every >= 2, "preference.split", every, "holds out every n-th pair: n must be at least 2");
    split_ = part;
    every_ = every;
    return *this;
  }

  /// On the login node: every row of the file is a pair that renders (SpecError naming the file and the line).
  std::optional<DataSizeAtLogin> check_at_login(const Knobs& knobs,
                                                const std::optional<std::filesystem::path>& pretrained) const {
    const auto file = file_.get(knobs);
    if (!std::filesystem::is_regular_file(file))
      throw SpecError(errors::spec_data_jsonl, file.string(), "no such file");
    if (!pretrained) return std::nullopt;  // the worker says that a tokenizer is needed
    const auto rows = read(file, *pretrained);
    std::int64_t kept = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) kept += keeps(static_cast<std::int64_t>(i)) ? 1 : 0;
    return DataSizeAtLogin{kept,
                           fmt::format("{} ({} of its {} pairs, read at login)", file.string(), kept, rows.size())};
  }

  /// In the job's preparation step (once, before the ranks, as lm::sft_jsonl's): the pairs read, rendered and
  /// tokenized, and where the reference is the start weights (no LoRA, no --ref-model) their log-probabilities under
  /// them, on the step's GPU where it has one; saved to `<prepared_dir>/dpo/<digest>.pt` (written whole or not at
  /// all), which the ranks read instead of doing both themselves.
  void prepare_in_job(const Knobs& knobs, const std::optional<std::filesystem::path>& pretrained,
                      const std::filesystem::path& prepared_dir) const {
    if (!pretrained) return;  // the ranks say that the model's directory is needed
    const auto prepared = prepared_file(knobs, *pretrained, prepared_dir);
    if (std::filesystem::is_regular_file(prepared)) {
      fmt::print("hpctrain: {}: already prepared in {} (the same inputs); not preparing again\n",
                 file_.get(knobs).string(), prepared.string());
      std::fflush(stdout);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    const auto dataset = tokenized(knobs, *pretrained);
    const auto device = torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
    if (stores_reference(knobs))
      dataset->set_reference(reference_logps(*dataset, *pretrained, device, loss_chunk_tokens(knobs)));
    std::filesystem::create_directories(prepared.parent_path());
    hpctrain::detail::write_file_atomically(prepared, dataset->serialized());
    fmt::print(
        "hpctrain: prepared {}: {} pairs{} in {} ({:.1f} s)\n", file_.get(knobs).string(), dataset->size(),
        dataset->has_reference() ? fmt::format(" and their reference log-probabilities (on {})", device.str()) : "",
        prepared.string(), std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    std::fflush(stdout);
  }

  /// In the worker: the job's prepared pairs when it has them for these inputs, else the file read, rendered and
  /// tokenized here (each rank); without LoRA (and --ref-model) the reference log-probabilities of every pair under
  /// the start weights, prepared or computed here.
  data::Source operator()(const RunContext& run) const {
    const auto file = file_.get(run.knobs);
    if (!run.pretrained_dir)
      throw SpecError(errors::spec_data_jsonl, file.string(), "needs the model's directory: lm::from_pretrained(...)");
    std::shared_ptr<PreferenceDataset> dataset;
    std::string origin = "tokenized in each rank";
    if (run.prepared_dir) {
      const auto prepared = prepared_file(run.knobs, *run.pretrained_dir, *run.prepared_dir);
      if (std::filesystem::is_regular_file(prepared)) {
        dataset = PreferenceDataset::deserialized(hpctrain::detail::read_file(prepared), prepared);
        origin = "prepared by the job: " + prepared.string();
      }
    }
    if (!dataset) dataset = tokenized(run.knobs, *run.pretrained_dir);
    std::string reference = "the reference: the model with its adapters off";
    if (const auto held = held_reference_directory(run.knobs)) {
      dataset->set_reference({});
      reference = fmt::format("the reference: the model of {}, held in memory", held->string());
    } else if (run.lora) {
      dataset->set_reference({});
    } else if (dataset->has_reference()) {
      reference = "the reference log-probabilities of the start weights from the job's preparation";
    } else {
      const auto start = std::chrono::steady_clock::now();
      dataset->set_reference(reference_logps(*dataset, *run.pretrained_dir, torch::kCPU, loss_chunk_tokens(run.knobs)));
      reference = fmt::format("the reference log-probabilities of the start weights computed here in {:.1f} s",
                              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    if (run.rank == 0) {
      fmt::print("hpctrain: {}: {} pairs ({}); {}\n", file.string(), dataset->size(), origin, reference);
      std::fflush(stdout);
    }
    return data::Source([dataset] { return dataset; }, fmt::format("{} ({} pairs)", file.string(), dataset->size()));
  }

  /// The completions' summed log-probabilities [size, 2] (chosen, rejected) under the model of `directory`, in fp32
  /// on `device` (returned on the CPU), 8 pairs a forward, the head `chunk` tokens at a time where it is positive.
  static torch::Tensor reference_logps(const PreferenceDataset& dataset, const std::filesystem::path& directory,
                                       torch::Device device, std::int64_t chunk) {
    auto model = models::load_pretrained(directory, torch::kFloat32);
    model->to(device);
    model->eval();
    torch::NoGradGuard no_grad;
    auto out = torch::zeros({dataset.size(), 2}, torch::kFloat32);
    for (std::int64_t begin = 0; begin < dataset.size(); begin += 8) {
      std::vector<std::int64_t> indices;
      for (auto i = begin; i < std::min(dataset.size(), begin + 8); ++i) indices.push_back(i);
      const auto batch = dataset.batch(indices);
      const auto n = batch.inputs.size(0), length = batch.inputs.size(2);
      const auto inputs = batch.inputs.reshape({2 * n, length}).to(device);
      const auto targets = batch.targets.reshape({2 * n, length}).to(device);
      const auto logps = chunk > 0 ? chunked_completion_logps(*model, inputs, targets, chunk).logps
                                   : completion_logps(model->forward(inputs), targets).logps;
      out.narrow(0, begin, n).copy_(logps.view({n, 2}).cpu());
    }
    return out;
  }

 private:
  /// The kept pairs of the file, read, rendered and tokenized with the model's tokenizer and template.
  std::shared_ptr<PreferenceDataset> tokenized(const Knobs& knobs, const std::filesystem::path& model_dir) const {
    const auto tokenizer = text::load_pretrained_tokenizer(model_dir);
    const PreferenceLengths lengths{max_length_.get(knobs), max_prompt_length_.get(knobs),
                                    max_completion_length_.get(knobs)};
    const auto rows = read(file_.get(knobs), model_dir);
    std::vector<PreferenceExample> examples;
    for (std::size_t i = 0; i < rows.size(); ++i)
      if (keeps(static_cast<std::int64_t>(i)))
        examples.push_back(tokenize_preference(rows[i].second, tokenizer, lengths));
    const std::int64_t pad = tokenizer.pad_id().value_or(tokenizer.eos_id().value_or(0));
    return std::make_shared<PreferenceDataset>(std::move(examples), pad);
  }

  /// Where the preparation step keeps these inputs' pairs: named by a CRC-32C of what they depend on (the file, the
  /// model directory's files, the lengths, the part kept, whether the reference is stored and the reference pass's
  /// --loss-chunk-tokens), so that other inputs never read them.
  std::filesystem::path prepared_file(const Knobs& knobs, const std::filesystem::path& model_dir,
                                      const std::filesystem::path& prepared_dir) const {
    const auto stamp = [](const std::filesystem::path& path) {
      std::error_code error;
      const auto size = std::filesystem::file_size(path, error);
      const auto time = std::filesystem::last_write_time(path, error).time_since_epoch().count();
      return fmt::format("{}:{}:{};", std::filesystem::absolute(path).string(), size, time);
    };
    const auto file = file_.get(knobs);
    std::string inputs = stamp(file);
    std::vector<std::filesystem::path> model_files;
    for (const auto& entry : std::filesystem::directory_iterator(model_dir)) model_files.push_back(entry.path());
    std::sort(model_files.begin(), model_files.end());
    for (const auto& path : model_files) inputs += stamp(path);
    // The reference pass's chunking too: its log-probabilities differ by the sums' order (rounding) with it.
    inputs += fmt::format("{}:{}:{}:{}:{}:{}:{}", max_length_.get(knobs), max_prompt_length_.get(knobs),
                          max_completion_length_.get(knobs), static_cast<int>(split_), every_, stores_reference(knobs),
                          loss_chunk_tokens(knobs));
    return prepared_dir / "dpo" / fmt::format("{}-{:08x}.pt", file.stem().string(), hpctrain::detail::crc32c(inputs));
  }

  std::vector<std::pair<std::size_t, PreferenceText>> read(const std::filesystem::path& file,
                                                           const std::filesystem::path& model_dir) const {
    const auto tokenizer = text::load_pretrained_tokenizer(model_dir);
    std::optional<text::ChatTemplate> chat;
    if (tokenizer.chat_template_source())
      chat = text::ChatTemplate::parse(*tokenizer.chat_template_source(), "chat_template");
    text::ChatRenderOptions options;
    options.bos_token = tokenizer.bos_token();
    options.eos_token = tokenizer.eos_token();
    return read_preference_jsonl(file, chat ? &*chat : nullptr, options);
  }
  bool keeps(std::int64_t index) const {
    const bool held_out = index % every_ == every_ / 2;
    return split_ == Split::all || (split_ == Split::validation) == held_out;
  }

  Setting<std::filesystem::path> file_;
  Setting<std::int64_t> max_length_ = std::int64_t{1024}, max_prompt_length_ = std::int64_t{512},
                        max_completion_length_ = std::int64_t{0};
  Split split_ = Split::all;
  std::int64_t every_ = 16;
};

/// Preference pairs from the JSONL file `file` (a path, or `lm::knob("data")`) in TRL's shapes.
inline PreferenceJsonl preference_jsonl(Setting<std::filesystem::path> file) {
  return PreferenceJsonl(std::move(file));
}

/// The loss's knobs of dpo_training as this run sets them.
inline DpoOptions dpo_options(const Knobs& knobs) {
  DpoOptions options;
  options.beta = knobs.get<double>("beta");
  options.label_smoothing = knobs.get<double>("label_smoothing");
  options.terms = parse_dpo_loss_terms(knobs.get<std::string>("loss_type")).value_or(options.terms);
  options.reference_free = knobs.get<bool>("reference_free");
  options.discopop_tau = knobs.get<double>("discopop_tau");
  options.rpo_alpha = knobs.get<double>("rpo_alpha");
  return options;
}

/// The reference model of `--ref-model` (TRL's ref_model): loaded on first use, on the step's device, in bf16 when the
/// run trains in bf16 (autocast computes in bf16 either way), else fp32; kept whole on every rank.
class HeldReference {
 public:
  models::CausalLM& model(const StepContext& context) {
    if (!model_) {
      const auto directory = held_reference_directory(context.knobs);
      hpctrain::detail::require(directory.has_value(), "preference.ref_model", "(none)",
                                "the held reference needs --ref-model DIR");
      model_ = models::load_pretrained(*directory,
                                       context.precision == Precision::bf16 ? torch::kBFloat16 : torch::kFloat32);
      model_->to(context.device);
      model_->eval();
    }
    return *model_;
  }

 private:
  std::shared_ptr<models::CausalLM> model_;
};

/// One batch of pairs through the policy (one forward of chosen and rejected rows) and the reference.
struct DpoBatch {
  DpoLosses out;
  std::vector<torch::Tensor> metrics;          ///< dpo_batch_metrics, in dpo_metric_names' order
  CompletionLogps chosen, rejected;            ///< the policy's, per side [n]
  torch::Tensor chosen_logps, rejected_logps;  ///< [n], what the loss compares (IPO: per token)
  torch::Tensor nll;                           ///< the chosen completions' mean token NLL where the loss reads it
  std::int64_t vocabulary = 0;
};

/// The reference log-probabilities of a batch's rows [2n]: stored with the pairs (computed once), from the model of
/// `--ref-model` (`held`), or the same model with its adapters off (TRL with PEFT); the head `chunk` tokens at a time
/// where it is positive.
inline torch::Tensor reference_logps(StepContext& context, const data::Batch& batch, const torch::Tensor& inputs,
                                     const torch::Tensor& targets, HeldReference* held, std::int64_t chunk) {
  if (batch.has("reference_logps")) return batch.field("reference_logps").to(torch::kFloat32).reshape({inputs.size(0)});
  torch::NoGradGuard no_grad;
  if (held && held_reference_directory(context.knobs)) {
    auto& model = held->model(context);
    if (chunk > 0) return chunked_completion_logps(model, inputs, targets, chunk).logps;
    return completion_logps(model.forward(inputs), targets).logps;
  }
  models::AdaptersOff off;
  if (chunk > 0) return chunked_completion_logps(chunked_head_model(context), inputs, targets, chunk).logps;
  return completion_logps(context.forward(inputs), targets).logps;
}

inline DpoBatch dpo_batch(StepContext& context, const data::Batch& batch, const DpoOptions& options,
                          HeldReference* held = nullptr) {
  const auto n = batch.inputs.size(0), length = batch.inputs.size(2);
  const auto inputs = batch.inputs.reshape({2 * n, length});  // chosen and rejected of each pair, one after the other
  const auto targets = batch.targets.reshape({2 * n, length});
  const auto chunk = loss_chunk_tokens(context.knobs);
  DpoBatch result;
  CompletionLogps policy;
  if (chunk > 0) {
    policy = chunked_completion_logps(chunked_head_model(context), inputs, targets, chunk, &result.vocabulary);
  } else {
    const auto logits = context.forward(inputs);
    policy = completion_logps(logits, targets);
    result.vocabulary = logits.size(-1);
  }
  auto reference = reference_logps(context, batch, inputs, targets, held, chunk);
  if (options.needs_nll())  // TRL's nll_loss: over the chosen completions' tokens of the micro-batch
    result.nll = chosen_nll(policy.token_logps.view({n, 2, length}).select(1, 0), batch.targets.select(1, 0));
  auto logps = policy.logps;
  if (options.has(DpoLossType::ipo)) {  // TRL's concatenated_forward: IPO averages per token
    logps = logps / policy.tokens.clamp_min(1);
    reference = reference / policy.tokens.clamp_min(1);
  }
  const auto pairs = logps.view({n, 2}), references = reference.view({n, 2});
  const auto side = [&](const CompletionLogps& all, std::int64_t s) {
    return CompletionLogps{all.logps.view({n, 2}).select(1, s), all.tokens.view({n, 2}).select(1, s),
                           all.logit_sums.view({n, 2}).select(1, s), all.token_logps.view({n, 2, length}).select(1, s)};
  };
  result.out = dpo_loss(pairs.select(1, 0), pairs.select(1, 1), references.select(1, 0), references.select(1, 1),
                        options, result.nll);
  result.chosen = side(policy, 0);
  result.rejected = side(policy, 1);
  result.chosen_logps = pairs.select(1, 0).detach();
  result.rejected_logps = pairs.select(1, 1).detach();
  result.metrics = dpo_batch_metrics(result.out, result.chosen, result.rejected, result.chosen_logps,
                                     result.rejected_logps, result.vocabulary);
  return result;
}

/// The step of dpo_training: the mean loss over the micro-batch's pairs; TRL's metrics reported for the train record.
inline torch::Tensor dpo_step(StepContext& context, const data::Batch& batch, HeldReference* held = nullptr) {
  const auto result = dpo_batch(context, batch, dpo_options(context.knobs), held);
  for (std::size_t i = 0; i < result.metrics.size(); ++i) context.report(dpo_metric_names[i], result.metrics[i]);
  if (result.nll.defined()) context.report("nll_loss", result.nll.detach());
  return result.out.losses.mean();
}

/// The evaluation of dpo_training: the mean loss over pairs; per pair the columns the metrics of dpo_metrics read.
inline EvalOutput dpo_eval_step(StepContext& context, const data::Batch& batch, HeldReference* held = nullptr) {
  const auto result = dpo_batch(context, batch, dpo_options(context.knobs), held);
  const auto& out = result.out;
  const auto v = static_cast<double>(result.vocabulary);
  auto columns =
      torch::stack(
          {out.chosen_rewards, out.rejected_rewards, out.chosen_rewards.gt(out.rejected_rewards).to(torch::kFloat32),
           out.chosen_rewards - out.rejected_rewards, result.chosen_logps, result.rejected_logps,
           result.chosen.logit_sums / v, result.rejected.logit_sums / v, result.chosen.tokens, result.rejected.tokens},
          1)
          .to(torch::kFloat64);
  const auto rows = torch::scalar_tensor(static_cast<double>(batch.size()),
                                         torch::TensorOptions(torch::kFloat64).device(context.device));
  return {out.losses.mean(), std::move(columns), rows};
}

/// The evaluation's metrics under TRL's names: the means over pairs, the logits' over completion positions.
inline std::vector<metrics::Metric> dpo_metrics() {
  std::vector<metrics::Metric> list;
  for (std::int64_t c = 0; c < 8; ++c) {
    list.emplace_back(dpo_metric_names[c], [c](const metrics::Input& in) -> metrics::Sums {
      const auto sum = in.output.select(1, c).sum();
      if (c < 6) return {sum, torch::scalar_tensor(static_cast<double>(in.output.size(0)), sum.options())};
      return {sum, in.output.select(1, c + 2).sum()};  // tokens of that side
    });
  }
  return list;
}

/// A Training for DPO: dpo_step, dpo_eval_step and dpo_metrics, TRL's DPOConfig knobs `--beta` (0.1),
/// `--label-smoothing` (0), `--loss-type` (sigmoid; `name[:weight],...` for TRL's loss_type list and loss_weights),
/// `--reference-free`, `--rpo-alpha` (0: none), `--discopop-tau` (0.05), `--ref-model DIR` (a reference held in
/// memory) and the LoRA knobs (lm::with_lora_knobs). Add the model (lm::from_pretrained), the data
/// (lm::preference_jsonl) and the rest.
inline Training dpo_training() {
  Training training;
  auto held = std::make_shared<HeldReference>();
  training.step([held](StepContext& context, const data::Batch& batch) { return dpo_step(context, batch, held.get()); })
      .eval_step(
          [held](StepContext& context, const data::Batch& batch) { return dpo_eval_step(context, batch, held.get()); })
      .knob<double>("beta", 0.1, "DPO's beta: how far from the reference the policy may go (TRL's default 0.1)",
                    positive())
      .knob<double>("label_smoothing", 0.0, "label smoothing of the sigmoid, robust, exo_pair and aot losses (TRL's 0)",
                    KnobCheck<double>([](double v) { return v >= 0 && v < 0.5; }, "must be at least 0 and below 0.5"))
      .knob<std::string>(
          "loss_type", "sigmoid",
          "DPO's loss as TRL names it (sigmoid, robust, exo_pair, hinge, ipo, sppo_hard, nca_pair, aot, "
          "aot_pair, apo_zero, apo_down, discopop, sft), or a weighted sum: sigmoid:0.8,sft:0.2",
          KnobCheck<std::string>([](const std::string& v) { return parse_dpo_loss_terms(v).has_value(); },
                                 "must be TRL loss types with optional positive weights (sigmoid, ipo:0.5,sft:1; "
                                 "bco_pair is not implemented)"))
      .knob<bool>("reference_free", false, "compare the policy's log-ratios with 0, not the reference's (TRL's)")
      .knob<double>("rpo_alpha", 0.0, "add this times the chosen completions' NLL to the loss (RPO; 0: none)",
                    non_negative())
      .knob<double>("discopop_tau", 0.05, "the discopop loss's temperature (TRL's 0.05)", positive())
      .knob<std::int64_t>(loss_chunk_knob, 0,
                          "apply the head this many tokens at a time: the tokens x vocabulary logits are never whole "
                          "(0: whole logits)",
                          non_negative())
      .knob<std::string>("ref_model", "",
                         "a Hugging Face directory held in memory as the reference (TRL's ref_model); default: the "
                         "model with its LoRA adapters off, else the start weights' log-probabilities computed once",
                         // A directory of a config alone (which --from builds with random weights) would make the
                         // reference random: refused at login, not by the loader on every rank.
                         KnobCheck<std::string>(
                             [](const std::string& v) {
                               return v.empty() ||
                                      (std::filesystem::is_regular_file(std::filesystem::path(v) / "config.json") &&
                                       models::holds_weights(v));
                             },
                             "must be a Hugging Face model directory with its weights (config.json and "
                             "model.safetensors or model.safetensors.index.json)"));
  for (auto& metric : dpo_metrics()) training.metric(std::move(metric));
  return with_lora_knobs(std::move(training));
}

}  // namespace hpctrain::lm
