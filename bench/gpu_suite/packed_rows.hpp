#pragma once
// Rows "packed.<model>.<precision>": the packed attention path (several examples in one row,
// models::TokenLayout's position_ids restarting per example and document_ids keeping attention inside each)
// against the padded one (one example per row, padding at the end, plain causal attention), on the device.
// Both see the same tokens and count the same targets, so the summed loss and its gradients must agree.
// On CUDA the paths take different kernels: padded rows SDPA's flash (causal, no mask), packed rows in bf16
// the variable-length flash kernel (cu_seqlens, models::packed_attention) and, with it switched off, SDPA with
// the boolean mask (which rules flash out): what this row checks beyond tests/lm/lm_test.cpp's CPU
// comparison. Each path's backend and its time are in the row. "llama-window" is the Llama with a sliding window
// shorter than most examples (Mistral's, Phi-3's): flash's window_size_left on the variable-length path, the band
// as a mask on the others, padded rows included.
#include <algorithm>
#include <chrono>
#include <optional>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <hpctrain/lm/loss.hpp>
#include <hpctrain/models/gpt2.hpp>
#include <hpctrain/models/llama.hpp>
#include <hpctrain/train/precision.hpp>

#include "compare.hpp"
#include "report.hpp"

namespace hpctrain_gpu_suite {

namespace packed_rows {

inline std::vector<std::int64_t> example_lengths(bool cuda) {
  if (cuda) return {300, 200, 500, 24};  // one row of 1024 when packed
  return {9, 5, 13};
}

inline hpctrain::models::Llama llama(bool cuda, bool windowed = false) {
  hpctrain::models::LlamaConfig config;
  if (windowed) config.sliding_window = cuda ? 128 : 4;
  config.vocab_size = cuda ? 8192 : 97;
  config.hidden_size = cuda ? 1024 : 32;
  config.intermediate_size = cuda ? 2816 : 64;
  config.num_hidden_layers = cuda ? 4 : 2;
  config.num_attention_heads = cuda ? 16 : 4;
  config.num_key_value_heads = cuda ? 4 : 2;  // grouped-query attention on both paths
  return hpctrain::models::Llama(config);
}

inline hpctrain::models::GPT2 gpt2(bool cuda) {
  hpctrain::models::GPT2Config config;
  config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0;
  config.vocab_size = cuda ? 8192 : 97;
  config.n_layer = cuda ? 4 : 2;
  config.n_head = cuda ? 12 : 2;
  config.n_embd = cuda ? 768 : 32;
  config.n_positions = cuda ? 1024 : 64;
  return hpctrain::models::GPT2(config);
}

/// The examples' tokens, random ids below `vocab`.
inline std::vector<torch::Tensor> examples(bool cuda, std::int64_t vocab) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> out;
  for (const auto length : example_lengths(cuda)) out.push_back(torch::randint(vocab, {length}, torch::kLong));
  return out;
}

/// Next-token targets within one example: its last token predicts nothing.
inline torch::Tensor targets_of(const torch::Tensor& example) {
  auto targets = torch::full_like(example, hpctrain::lm::ignore_index);
  const auto n = example.size(0);
  if (n > 1) targets.narrow(0, 0, n - 1).copy_(example.narrow(0, 1, n - 1));
  return targets;
}

struct LossAndGradients {
  double loss_sum = 0;
  std::vector<torch::Tensor> gradients;
};

inline LossAndGradients backward_of(hpctrain::models::CausalLM& model, const torch::Tensor& logits,
                                    const torch::Tensor& targets) {
  const auto [sum, count] = hpctrain::lm::token_loss_sum(logits, targets);
  sum.backward();
  LossAndGradients out{sum.item<double>(), {}};
  for (const auto& parameter : model.parameters())
    out.gradients.push_back(parameter.grad().detach().clone());  // on the device: timed
  model.zero_grad();
  return out;
}

/// One example per row, padded at the end (pad id 0, untrained), through the plain causal forward.
inline LossAndGradients padded(hpctrain::models::CausalLM& model, const std::vector<torch::Tensor>& docs,
                               const torch::Device& device, hpctrain::Precision precision) {
  std::int64_t longest = 0;
  for (const auto& doc : docs) longest = std::max(longest, doc.size(0));
  const auto rows = static_cast<std::int64_t>(docs.size());
  auto inputs = torch::zeros({rows, longest}, torch::kLong);
  auto targets = torch::full({rows, longest}, hpctrain::lm::ignore_index, torch::kLong);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto n = docs[r].size(0);
    inputs[r].narrow(0, 0, n).copy_(docs[r]);
    targets[r].narrow(0, 0, n).copy_(targets_of(docs[r]));
  }
  torch::Tensor logits;
  {
    hpctrain::AutocastScope autocast(precision, device);
    logits = model.forward(inputs.to(device));
  }
  return backward_of(model, logits, targets.to(device));
}

/// Every example in one row: positions restart at 0 per example, document ids keep attention inside each.
inline LossAndGradients packed(hpctrain::models::CausalLM& model, const std::vector<torch::Tensor>& docs,
                               const torch::Device& device, hpctrain::Precision precision) {
  std::vector<torch::Tensor> ids, positions, documents, targets;
  for (std::size_t d = 0; d < docs.size(); ++d) {
    const auto n = docs[d].size(0);
    ids.push_back(docs[d]);
    positions.push_back(torch::arange(n, torch::kLong));
    documents.push_back(torch::full({n}, static_cast<std::int64_t>(d), torch::kLong));
    targets.push_back(targets_of(docs[d]));
  }
  auto row = [&](const std::vector<torch::Tensor>& parts) { return torch::cat(parts).unsqueeze(0).to(device); };
  torch::Tensor logits;
  {
    hpctrain::AutocastScope autocast(precision, device);
    logits = model.forward(row(ids), hpctrain::models::TokenLayout{row(positions), row(documents)});
  }
  return backward_of(model, logits, row(targets));
}

/// The SDPA backend ATen picks (at::_fused_sdp_choice) for `heads` heads of dim `head_dim` over `tokens` tokens
/// in the forward's dtype: causal without a mask (the padded path) or with a boolean mask (the masked packed path).
inline std::string sdpa_backend(std::int64_t heads, std::int64_t head_dim, std::int64_t tokens, bool with_mask,
                                const torch::Device& device, hpctrain::Precision precision) {
  const auto dtype = precision == hpctrain::Precision::bf16 ? torch::kBFloat16 : torch::kFloat32;
  const auto q = torch::zeros({1, heads, tokens, head_dim}, torch::TensorOptions().dtype(dtype).device(device));
  std::optional<torch::Tensor> mask;
  if (with_mask)
    mask = torch::ones({1, 1, tokens, tokens}, torch::TensorOptions().dtype(torch::kBool).device(device)).tril();
  const auto choice = at::_fused_sdp_choice(q, q, q, mask, 0.0, /*is_causal=*/!with_mask);
  switch (choice) {
    case 0: return "math";
    case 1: return "flash";
    case 2: return "memory-efficient";
    case 3: return "cuDNN";
    default: return fmt::format("backend {}", choice);
  }
}

/// `run()`'s result and its milliseconds (the device's queue waited for).
template <class Run>
std::pair<LossAndGradients, double> timed(const torch::Device& device, Run run) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
  const auto start = std::chrono::steady_clock::now();
  auto result = run();
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
  return {std::move(result),
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count()};
}

/// Packed against padded; on CUDA in bf16 both packed paths (variable-length flash, then the mask), each
/// compared with the padded one, with the SDPA backends and the times of a forward + backward (after one
/// warmup call of each).
inline Row compare(const std::string& family, hpctrain::models::CausalLM& model, std::int64_t vocab, std::int64_t heads,
                   std::int64_t head_dim, const torch::Device& device, hpctrain::Precision precision) {
  const bool cuda = device.is_cuda();
  const std::string precision_name(hpctrain::to_string(precision));
  const auto docs = examples(cuda, vocab);
  std::int64_t tokens = 0;
  for (const auto& doc : docs) tokens += doc.size(0);
  Row row{fmt::format("packed.{}.{}", family, precision_name),
          fmt::format("packed vs padded attention, {} ({} examples, {})", family, docs.size(), precision_name),
          Status::pass, "", nlohmann::json::object()};
  const bool varlen = cuda && precision == hpctrain::Precision::bf16;  // where packed_attention takes cu_seqlens
  const double tolerance = tolerance_for(precision);
  (void)padded(model, docs, device, precision);  // warmup: kernels chosen, the allocator's blocks made
  const auto [a, padded_ms] = timed(device, [&] { return padded(model, docs, device, precision); });
  std::vector<std::string> parts;
  bool pass = true;
  const auto check = [&](const char* path, bool varlen_on) {
    hpctrain::models::set_varlen_attention(varlen_on);
    (void)packed(model, docs, device, precision);
    const auto [b, ms] = timed(device, [&] { return packed(model, docs, device, precision); });
    hpctrain::models::set_varlen_attention(true);
    const double loss_error = relative_error(b.loss_sum, a.loss_sum);
    const double gradient_error = relative_error(b.gradients, a.gradients);
    pass = pass && loss_error <= tolerance && gradient_error <= tolerance;
    const auto backend =
        varlen_on ? std::string("flash varlen") : sdpa_backend(heads, head_dim, tokens, true, device, precision);
    parts.push_back(fmt::format("{} ({}, {:.1f} ms): loss {}, gradients {}", path, backend, ms,
                                within(loss_error, tolerance), within(gradient_error, tolerance)));
    row.figures[fmt::format("{}_loss_relative_error", path)] = loss_error;
    row.figures[fmt::format("{}_gradient_relative_error", path)] = gradient_error;
    row.figures[fmt::format("{}_ms", path)] = ms;
    row.figures[fmt::format("{}_backend", path)] = backend;
  };
  if (varlen) check("varlen", true);
  check("masked", false);
  row.status = pass ? Status::pass : Status::fail;
  row.result =
      fmt::format("padded ({}, {:.1f} ms); {}", sdpa_backend(heads, head_dim, tokens, false, device, precision),
                  padded_ms, fmt::join(parts, "; "));
  row.figures["padded_ms"] = padded_ms;
  row.figures["padded_loss_sum"] = a.loss_sum;
  row.figures["tolerance"] = tolerance;
  return row;
}

}  // namespace packed_rows

inline int run_packed_rows(const torch::Device& device) {
  const bool cuda = device.is_cuda();
  int failures = 0;
  for (const auto precision : {hpctrain::Precision::fp32, hpctrain::Precision::bf16}) {
    for (const std::string family : {"llama", "llama-window", "gpt2"}) {
      const std::string id = fmt::format("packed.{}.{}", family, hpctrain::to_string(precision));
      Row row;
      try {
        torch::manual_seed(0);
        if (family != "gpt2") {
          auto model = packed_rows::llama(cuda, family == "llama-window");
          model->to(device);
          const auto& config = model->config();
          row = packed_rows::compare(family, *model, config.vocab_size, config.num_attention_heads,
                                     config.head_dimension(), device, precision);
        } else {
          auto model = packed_rows::gpt2(cuda);
          model->to(device);
          const auto& config = model->config();
          row = packed_rows::compare(family, *model, config.vocab_size, config.n_head, config.head_dim(), device,
                                     precision);
        }
      } catch (const std::exception& e) {
        row = failed_row(id, fmt::format("packed vs padded attention, {}", family), e.what());
      }
      print(row);
      failures += row.status == Status::fail;
    }
  }
  return failures;
}

}  // namespace hpctrain_gpu_suite
