#pragma once
// What the tests of a block's rewrites share (selective_recompute_test, fused_projections_test): a two-block model
// small enough to compare every gradient, one training step of it that records its loss, every gradient and the
// matrix-product kernels it ran, and the bounds two computations of the same products are held to.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <hpctrain/models/lora/lora.hpp>
#include <hpctrain/models/models.hpp>
#include <hpctrain/train/precision.hpp>

namespace block_step {

namespace hm = hpctrain::models;

/// Bytes the C allocator hands out now, every arena and every mmapped block (glibc), or -1 elsewhere.
inline std::int64_t heap_in_use() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
  const auto info = mallinfo2();
  return static_cast<std::int64_t>(info.uordblks + info.hblkhd);
#else
  return -1;
#endif
}

constexpr std::int64_t vocabulary = 97, batch = 2, sequence = 16;

/// Two Llama blocks of width 32 with grouped-query attention (q 32 wide, k and v 16); Qwen2's q/k/v biases on ask.
inline hm::LlamaConfig tiny_llama(double attention_dropout, bool qkv_bias = false) {
  hm::LlamaConfig config;
  config.vocab_size = vocabulary;
  config.hidden_size = 32;
  config.intermediate_size = 64;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.attention_dropout = attention_dropout;
  config.qkv_bias = qkv_bias;
  config.tie_word_embeddings = false;
  return config;
}

/// The widest sum in these models' products and their gradients: the width 64 (the MLP) and the 2 x 16 tokens.
constexpr double widest_sum = 64;
/// The products a gradient passes through on its way from the loss to the first block's weights: the head, and per
/// block at most 4 (o_proj or c_proj, then v/q/k; down, then gate/up; the attention between).
constexpr double chain = 1 + 2 * 4;

/// Two computations of the same products summed in other orders (another kernel, a fused product, the weight
/// gradient as gᵀ·x where autograd computes (xᵀ·g)ᵀ): a reordered sum of n fp32 terms moves by at most about
/// √n·2^-24 relative, and the differences of the products a gradient goes through add up: chain · √64 · 2^-24 =
/// 4.3e-6 (the tests print the measured values beside it).
inline const double fp32_bound = chain * std::sqrt(widest_sum) * std::ldexp(1.0, -24);
/// Under bf16 autocast each product's result is rounded to bf16 (2^-8 relative): a reordered sum may round the
/// other way, and that moves the gradients downstream by as much, chain times at most.
inline const double bf16_bound = chain * std::ldexp(1.0, -8);

/// tiny_llama with LoRA r=4 on q_proj and v_proj (the base frozen), its B matrices random (PEFT starts them at 0,
/// which would leave A without a gradient), from the seed `seed`.
inline hm::Llama tiny_llama_with_lora(std::uint64_t seed) {
  torch::manual_seed(seed);
  hm::Llama model(tiny_llama(0.0));
  hm::LoraConfig lora;
  lora.r = 4;
  lora.targets = {"q_proj", "v_proj"};
  hm::apply_lora(*model, lora);
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters())
    if (item.key().find(".lora_B.") != std::string::npos) item.value().normal_(0.0, 0.1);
  return model;
}

inline double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  const auto x = a.to(torch::kFloat64), y = b.to(torch::kFloat64);
  return (x - y).norm().item<double>() / std::max(y.norm().item<double>(), 1e-30);
}

/// Counts the calls of the ops or autograd nodes named `names` in `scope` while alive, through a global
/// RecordFunction callback (several may be alive at once).
class OpCount {
 public:
  OpCount(std::vector<std::string> names, at::RecordScope scope) : names_(std::move(names)) {
    std::lock_guard<std::mutex> lock(mutex());
    live().push_back(this);
    handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&on_start).scopes({scope}));
  }
  ~OpCount() {
    at::removeCallback(handle_);
    std::lock_guard<std::mutex> lock(mutex());
    live().erase(std::find(live().begin(), live().end(), this));
  }
  OpCount(const OpCount&) = delete;
  OpCount& operator=(const OpCount&) = delete;
  long value() const { return count_; }

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<OpCount*>& live() {
    static std::vector<OpCount*> counts;
    return counts;
  }
  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& function) {
    std::lock_guard<std::mutex> lock(mutex());
    for (auto* counter : live())
      if (std::find(counter->names_.begin(), counter->names_.end(), function.name()) != counter->names_.end())
        ++counter->count_;
    return nullptr;
  }
  std::vector<std::string> names_;
  std::atomic<long> count_{0};
  at::CallbackHandle handle_;
};

/// ATen's matrix-product kernels (mm, addmm, bmm, baddbmm) while alive. The composite ops that reach them (linear,
/// matmul) are not counted: each lands in one kernel call.
struct MatrixKernelCount : OpCount {
  MatrixKernelCount() : OpCount({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}, at::RecordScope::FUNCTION) {}
};

struct Step {
  double loss = 0;
  long products = 0;                                             ///< matrix-product kernels, forward and backward
  std::vector<std::pair<std::string, torch::Tensor>> gradients;  ///< of every parameter that trains
};

/// One training forward and backward of `model` under `recompute`, from the same random state (dropout).
inline Step step(hm::CausalLM& model, const torch::Tensor& ids, hpctrain::Precision precision,
                 hm::Recompute recompute = hm::Recompute::none) {
  model.train();
  model.set_activation_checkpointing(recompute);
  model.zero_grad();
  torch::manual_seed(1234);
  MatrixKernelCount products;
  torch::Tensor loss;
  {
    hpctrain::AutocastScope autocast(precision, torch::Device(torch::kCPU));
    const auto logits = model.forward(ids.narrow(1, 0, sequence));
    loss = torch::nn::functional::cross_entropy(logits.reshape({-1, vocabulary}).to(torch::kFloat32),
                                                ids.narrow(1, 1, sequence).reshape({-1}));
  }
  loss.backward();
  Step out;
  out.products = products.value();
  out.loss = loss.item<double>();
  for (const auto& item : model.named_parameters())
    if (item.value().requires_grad()) out.gradients.emplace_back(item.key(), item.value().grad().clone());
  return out;
}

}  // namespace block_step
