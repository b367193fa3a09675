#pragma once
// Rows "packed.<model>.<precision>": the packed attention path (several examples in one row,
// models::TokenLayout's position_ids restarting per example and document_ids keeping attention inside each)
// against the padded one (one example per row, padding at the end, plain causal attention), on the device.
// Both see the same tokens and count the same targets, so the summed loss and its gradients must agree.
// On CUDA the two paths take different SDPA kernels (a boolean mask rules out flash attention; padded rows
// at bf16 use it), which is what this row checks beyond tests/models/lm_test.cpp's CPU comparison.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
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

inline hpctrain::models::Llama llama(bool cuda) {
  hpctrain::models::LlamaConfig config;
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

inline LossAndGradients backward_of(hpctrain::models::CausalLM& model, const torch::Tensor& logits, const torch::Tensor& targets) {
  const auto [sum, count] = hpctrain::lm::token_loss_sum(logits, targets);
  sum.backward();
  LossAndGradients out{sum.item<double>(), {}};
  for (const auto& parameter : model.parameters()) out.gradients.push_back(parameter.grad().detach().to(torch::kCPU).clone());
  model.zero_grad();
  return out;
}

/// One example per row, padded at the end (pad id 0, untrained), through the plain causal forward.
inline LossAndGradients padded(hpctrain::models::CausalLM& model, const std::vector<torch::Tensor>& docs, const torch::Device& device,
                               hpctrain::Precision precision) {
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
inline LossAndGradients packed(hpctrain::models::CausalLM& model, const std::vector<torch::Tensor>& docs, const torch::Device& device,
                               hpctrain::Precision precision) {
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

inline Row compare(const std::string& family, hpctrain::models::CausalLM& model, std::int64_t vocab, const torch::Device& device,
                   hpctrain::Precision precision) {
  const bool cuda = device.is_cuda();
  const std::string precision_name(hpctrain::to_string(precision));
  const auto docs = examples(cuda, vocab);
  Row row{fmt::format("packed.{}.{}", family, precision_name),
          fmt::format("packed vs padded attention, {} ({} examples, {})", family, docs.size(), precision_name), Status::pass, "",
          nlohmann::json::object()};
  const auto a = padded(model, docs, device, precision);
  const auto b = packed(model, docs, device, precision);
  const double tolerance = tolerance_for(precision);
  const double loss_error = relative_error(b.loss_sum, a.loss_sum);
  const double gradient_error = relative_error(b.gradients, a.gradients);
  row.status = loss_error <= tolerance && gradient_error <= tolerance ? Status::pass : Status::fail;
  row.result = fmt::format("loss {}, gradients {}", within(loss_error, tolerance), within(gradient_error, tolerance));
  row.figures["padded_loss_sum"] = a.loss_sum;
  row.figures["packed_loss_sum"] = b.loss_sum;
  row.figures["loss_relative_error"] = loss_error;
  row.figures["gradient_relative_error"] = gradient_error;
  row.figures["tolerance"] = tolerance;
  return row;
}

}  // namespace packed_rows

inline int run_packed_rows(const torch::Device& device) {
  const bool cuda = device.is_cuda();
  int failures = 0;
  for (const auto precision : {hpctrain::Precision::fp32, hpctrain::Precision::bf16}) {
    for (const std::string family : {"llama", "gpt2"}) {
      const std::string id = fmt::format("packed.{}.{}", family, hpctrain::to_string(precision));
      Row row;
      try {
        torch::manual_seed(0);
        if (family == "llama") {
          auto model = packed_rows::llama(cuda);
          model->to(device);
          row = packed_rows::compare(family, *model, model->config().vocab_size, device, precision);
        } else {
          auto model = packed_rows::gpt2(cuda);
          model->to(device);
          row = packed_rows::compare(family, *model, model->config().vocab_size, device, precision);
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
