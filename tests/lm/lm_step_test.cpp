// The pieces of the language-model step that the GPU rows measure (docs/gpu.md), checked on the CPU against
// today's paths. The head and the loss a chunk of tokens at a time (lm/chunked_loss.hpp) against the whole-logits path
// (lm/loss.hpp): the same summed loss and the same gradients of the hidden states and of the head's weight —
// in fp32 within 1e-6 (only the order of the sums differs), under bf16 autocast within the rounding of one
// bf16 product; through GPT-2 and Llama (tied and untied heads, packed rows) down to every parameter's
// gradient; and the step of causal_lm_training with --loss-chunk-tokens. The fused RMSNorm (models/llama.hpp)
// against transformers' step-by-step one. --activation-checkpointing through causal_lm_training's model hook.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <hpctrain/lm/lm.hpp>
#include <hpctrain/models/models.hpp>
#include <hpctrain/train/worker.hpp>

namespace hm = hpctrain::models;
namespace lm = hpctrain::lm;

namespace {

/// The fp32 bound: the chunked and whole paths compute the same sums in other orders (the head's dot products
/// over the width, through matrix kernels chosen by the row count; the weight's gradient over the tokens, chunk
/// by chunk). A reordered sum of n fp32 terms moves by about √n·2^-24 relative (n ≤ 64 here: ~5e-7 at the
/// extreme, ~1e-7 typically, on any CPU's kernels), so 1e-6, the issue's figure, leaves room of 2–10x.
constexpr double fp32_reorder_bound = 1e-6;

/// ‖a − b‖ / ‖b‖ over the flattened tensors, in fp64.
double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  const auto x = a.to(torch::kFloat64), y = b.to(torch::kFloat64);
  return (x - y).norm().item<double>() / std::max(y.norm().item<double>(), 1e-30);
}

struct LossAndGradients {
  double loss;
  torch::Tensor hidden_grad, weight_grad;
};

/// The summed loss of hidden · weightᵀ against `targets` and its gradients: whole logits (chunk 0) or chunked.
LossAndGradients head_loss(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                           std::int64_t chunk, bool bf16 = false) {
  auto h = hidden.detach().clone().requires_grad_(true);
  auto w = weight.detach().clone().requires_grad_(true);
  torch::Tensor sum;
  {
    hpctrain::AutocastScope autocast(bf16 ? hpctrain::Precision::bf16 : hpctrain::Precision::fp32, torch::kCPU);
    sum = chunk == 0 ? lm::token_loss_sum(torch::linear(h, w), targets).first
                     : lm::chunked_token_loss_sum(h, w, targets, chunk).first;
  }
  (sum * 0.5).backward();  // a scale on the way back, as the mean and the accumulation give
  return {sum.item<double>(), h.grad(), w.grad()};
}

/// A head's input: hidden states [tokens, width], a weight [vocabulary, width], targets with every third
/// ignored (prompts, padding).
struct HeadInput {
  torch::Tensor hidden, weight, targets;
};
HeadInput head_input(std::uint64_t seed, std::int64_t tokens, std::int64_t width, std::int64_t vocabulary) {
  torch::manual_seed(seed);
  HeadInput in{torch::randn({tokens, width}), torch::randn({vocabulary, width}) * 0.2,
               torch::randint(vocabulary, {tokens}, torch::kInt64)};
  in.targets.index_put_({torch::arange(0, tokens, 3)}, lm::ignore_index);
  return in;
}

}  // namespace

TEST_CASE("chunked linear + cross-entropy equals the whole logits' loss and gradients in fp32",
          "[models][chunked_loss]") {
  const std::int64_t tokens = 37;
  const auto [hidden, weight, targets] = head_input(0, tokens, 24, 501);
  const auto whole = head_loss(hidden, weight, targets, 0);
  for (const std::int64_t chunk :
       {1, 8, 36, 37, 64}) {  // one token; a chunk that does not divide; one; bigger than all
    INFO("chunk " << chunk);
    const auto chunked = head_loss(hidden, weight, targets, chunk);
    const double loss = std::abs(chunked.loss - whole.loss) / std::abs(whole.loss);
    const double hidden_grad = relative_difference(chunked.hidden_grad, whole.hidden_grad);
    const double weight_grad = relative_difference(chunked.weight_grad, whole.weight_grad);
    WARN("fp32, chunk " << chunk << ": loss " << loss << ", hidden gradient " << hidden_grad << ", weight gradient "
                        << weight_grad << " (bound " << fp32_reorder_bound << ")");
    CHECK(loss <= fp32_reorder_bound);
    CHECK(hidden_grad <= fp32_reorder_bound);
    CHECK(weight_grad <= fp32_reorder_bound);
  }
  // The gradients are handed over in backward: a second backward through the same loss fails, never doubles them.
  {
    auto h = hidden.clone().requires_grad_(true);
    auto sum = lm::chunked_token_loss_sum(h, weight, targets, 8).first;
    sum.backward({}, /*retain_graph=*/true);
    CHECK_THROWS_WITH(sum.backward(), Catch::Contains("backward ran twice"));
  }
  // Ignored targets take no loss and give no gradient.
  const auto ignored = head_loss(hidden, weight, torch::full({tokens}, lm::ignore_index, torch::kInt64), 8);
  CHECK(ignored.loss == 0.0);
  CHECK(ignored.hidden_grad.abs().max().item<double>() == 0.0);
  CHECK(ignored.weight_grad.abs().max().item<double>() == 0.0);
}

TEST_CASE("chunked linear + cross-entropy under bf16 autocast stays within bf16's rounding of the whole logits",
          "[models][chunked_loss]") {
  const auto [hidden, weight, targets] = head_input(1, 64, 32, 300);
  const auto whole = head_loss(hidden, weight, targets, 0, true);
  const auto chunked = head_loss(hidden, weight, targets, 16, true);
  const auto fp32 = head_loss(hidden, weight, targets, 0, false);
  // Both take the head's operands in bf16 (8 bits of mantissa: 2^-9 relative per element) and the logits'
  // gradient in bf16 for the gradients' products; the whole path also rounds the logits and the products' results
  // to bf16, the chunked one keeps them in fp32. So each stays within a few bf16 roundings of fp32, and of each
  // other: 2e-2 is ~10 roundings.
  const double bound = 2e-2;
  const double loss = std::abs(chunked.loss - whole.loss) / std::abs(whole.loss);
  const double hidden_grad = relative_difference(chunked.hidden_grad, whole.hidden_grad);
  const double weight_grad = relative_difference(chunked.weight_grad, whole.weight_grad);
  WARN("bf16 chunked vs whole: loss " << loss << ", hidden gradient " << hidden_grad << ", weight gradient "
                                      << weight_grad << " (bound " << bound
                                      << "); against fp32, weight gradient: whole "
                                      << relative_difference(whole.weight_grad, fp32.weight_grad) << ", chunked "
                                      << relative_difference(chunked.weight_grad, fp32.weight_grad)
                                      << "; hidden gradient: whole "
                                      << relative_difference(whole.hidden_grad, fp32.hidden_grad) << ", chunked "
                                      << relative_difference(chunked.hidden_grad, fp32.hidden_grad));
  CHECK(loss <= bound);
  CHECK(hidden_grad <= bound);
  CHECK(weight_grad <= bound);
  // Rounding happened: the bf16 path is not the fp32 one (the test would pass vacuously if autocast were off).
  CHECK(relative_difference(whole.weight_grad, fp32.weight_grad) > 1e-6);
  CHECK(relative_difference(chunked.weight_grad, fp32.weight_grad) > 1e-6);
}

namespace {

hm::LlamaConfig tiny_llama_config(bool tied) {
  hm::LlamaConfig config;
  config.vocab_size = 211;
  config.hidden_size = 32;
  config.intermediate_size = 64;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.tie_word_embeddings = tied;
  return config;
}

/// The mean loss of `batch` through the whole logits (chunk 0) or chunked, and every parameter's gradient.
std::pair<double, std::vector<torch::Tensor>> model_loss(hm::CausalLM& model, const torch::Tensor& inputs,
                                                         const torch::Tensor& targets, const hm::TokenLayout* layout,
                                                         std::int64_t chunk) {
  model.zero_grad();
  torch::Tensor loss;
  if (chunk == 0) {
    loss = lm::token_loss(layout ? model.forward(inputs, *layout) : model.forward(inputs), targets);
  } else {  // what the Trainer's step computes: the head's chunks as the model applies it (a soft cap included)
    loss = lm::causal_lm_loss(model, inputs, targets, layout, chunk);
  }
  loss.backward();
  std::vector<torch::Tensor> gradients;
  for (const auto& parameter : model.parameters()) gradients.push_back(parameter.grad().clone());
  return {loss.item<double>(), gradients};
}

void check_model(hm::CausalLM& model, std::int64_t vocabulary) {
  torch::manual_seed(3);
  const auto tokens = torch::randint(vocabulary, {2, 17}, torch::kInt64);
  const auto inputs = tokens.narrow(1, 0, 16);
  auto targets = tokens.narrow(1, 1, 16).clone();
  targets.index_put_({0, torch::indexing::Slice(0, 5)}, lm::ignore_index);
  // A packed row of two examples (9 + 7 tokens) in the second case.
  const auto positions =
      torch::cat({torch::arange(9), torch::arange(7)}).to(torch::kInt64).expand({2, 16}).contiguous();
  const auto documents =
      torch::cat({torch::zeros({9}), torch::ones({7})}).to(torch::kInt64).expand({2, 16}).contiguous();
  const hm::TokenLayout packed{positions, documents};
  for (const hm::TokenLayout* layout : {static_cast<const hm::TokenLayout*>(nullptr), &packed}) {
    INFO((layout ? "packed" : "plain"));
    const auto [whole_loss, whole] = model_loss(model, inputs, targets, layout, 0);
    const auto [chunked_loss, chunked] = model_loss(model, inputs, targets, layout, 5);
    // The whole model's gradient as one vector (every tensor flattened, as the GPU suite compares): a tensor
    // whose gradient nearly cancels (a bias) has a large relative error of no consequence.
    const double loss = std::abs(chunked_loss - whole_loss) / whole_loss;
    const auto flat = [](const std::vector<torch::Tensor>& tensors) {
      std::vector<torch::Tensor> parts;
      for (const auto& tensor : tensors) parts.push_back(tensor.reshape({-1}));
      return torch::cat(parts);
    };
    const double gradients = relative_difference(flat(chunked), flat(whole));
    WARN((layout ? "packed" : "plain") << ": loss " << loss << ", gradients " << gradients << " (bound "
                                       << fp32_reorder_bound << ")");
    CHECK(loss <= fp32_reorder_bound);
    CHECK(gradients <= fp32_reorder_bound);
  }
}

}  // namespace

TEST_CASE("chunked loss through GPT-2 and Llama gives every parameter the whole logits' gradient",
          "[models][chunked_loss]") {
  SECTION("GPT-2, tied head") {
    hm::GPT2Config config;
    config.vocab_size = 211;
    config.n_layer = 2;
    config.n_head = 2;
    config.n_embd = 32;
    config.n_positions = 32;
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0;
    torch::manual_seed(0);
    hm::GPT2 model(config);
    CHECK(model->head_weight().is_same(model->wte->weight));
    check_model(*model, config.vocab_size);
  }
  SECTION("Llama, untied head") {
    torch::manual_seed(0);
    hm::Llama model(tiny_llama_config(false));
    CHECK(model->head_weight().is_same(model->lm_head->weight));
    check_model(*model, 211);
  }
  SECTION("Llama, tied head") {
    torch::manual_seed(0);
    hm::Llama model(tiny_llama_config(true));
    CHECK(model->head_weight().is_same(model->embed_tokens->weight));
    check_model(*model, 211);
  }
  SECTION("Gemma 2, its logits soft-capped") {
    // Weights of std 0.5 put the logits well past a cap of 2 (the chunks cap them, and take the gradient through it).
    const auto config = hm::LlamaConfig::from_json(nlohmann::json::parse(
        R"({"model_type": "gemma2", "vocab_size": 211, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "sliding_window": 6, "query_pre_attn_scalar": 8, "attn_logit_softcapping": 5.0,
            "final_logit_softcapping": 2.0, "initializer_range": 0.5})"));
    torch::manual_seed(0);
    hm::Llama model(config);
    CHECK(model->final_logit_softcap() == 2.0);
    check_model(*model, 211);
  }
}

TEST_CASE("causal_lm_training's step with --loss-chunk-tokens gives the whole logits' loss", "[models][chunked_loss]") {
  torch::manual_seed(0);
  hm::Llama model(tiny_llama_config(false));
  const auto training = lm::causal_lm_training();
  const auto defaults = hpctrain::training_knobs(training);
  CHECK(defaults.get<std::int64_t>("loss_chunk_tokens") == 0);
  const auto tokens = torch::randint(211, {2, 13}, torch::kInt64);
  hpctrain::data::Batch batch;
  batch.inputs = tokens.narrow(1, 0, 12);
  batch.targets = tokens.narrow(1, 1, 12);
  hpctrain::ForwardFunction forward = [&](torch::Tensor x) { return model->forward(x); };
  const hpctrain::LossFunction loss = lm::token_loss;
  auto step_loss = [&](const std::vector<std::string>& args) {
    const auto knobs = defaults.with_arguments(args);
    hpctrain::StepContext context{*model, forward, torch::kCPU, hpctrain::Precision::fp32, 0, 1, 0, 0, 1, loss, knobs};
    model->zero_grad();
    auto value = training.step()(context, batch);
    value.backward();
    return std::make_pair(value.item<double>(), model->lm_head->weight.grad().clone());
  };
  const auto [whole, whole_grad] = step_loss({});
  const auto [chunked, chunked_grad] = step_loss({"--loss-chunk-tokens", "7"});
  CHECK(std::abs(chunked - whole) <= fp32_reorder_bound * whole);
  CHECK(relative_difference(chunked_grad, whole_grad) <= fp32_reorder_bound);
  CHECK_THROWS(defaults.with_arguments({"--loss-chunk-tokens", "-1"}));
}

TEST_CASE(
    "RMSNorm on fp32 takes at::rms_norm, with an fp32 or a bf16 weight, and equals transformers' step-by-step norm",
    "[models][chunked_loss]") {
  torch::manual_seed(0);
  hm::RMSNorm norm(48, 1e-6);
  {
    torch::NoGradGuard no_grad;
    norm->weight.uniform_(0.5, 1.5);
  }
  const auto x = (torch::randn({3, 5, 48}) * 3).requires_grad_(true);
  const auto fused = norm(x);
  const auto gradient = torch::randn_like(fused);
  const auto [fused_input_grad, fused_weight_grad] = [&] {
    auto grads = torch::autograd::grad({fused}, {x, norm->weight}, {gradient});
    return std::make_pair(grads[0], grads[1]);
  }();
  const auto reference = norm->unfused(x);
  auto grads = torch::autograd::grad({reference}, {x, norm->weight}, {gradient});
  // The same fp32 sums (over the 48 features; the weight's gradient over 15 rows) in other orders.
  WARN("RMSNorm fused vs step by step: output "
       << relative_difference(fused, reference) << ", input gradient "
       << relative_difference(fused_input_grad, grads[0]) << ", weight gradient "
       << relative_difference(fused_weight_grad, grads[1]) << " (bound " << fp32_reorder_bound << ")");
  CHECK(relative_difference(fused, reference) <= fp32_reorder_bound);
  CHECK(relative_difference(fused_input_grad, grads[0]) <= fp32_reorder_bound);
  CHECK(relative_difference(fused_weight_grad, grads[1]) <= fp32_reorder_bound);
  // bf16 input keeps transformers' order (cast, then scale by the fp32 weight: an fp32 result).
  CHECK(norm(x.detach().to(torch::kBFloat16)).scalar_type() == torch::kFloat32);
  // A bf16 weight on the fp32 stream (LoRA's frozen blocks held in bf16): widened for at::rms_norm, what
  // transformers' fp32 product with it gives, within reassociation, its gradient rounded to the weight's dtype.
  hm::RMSNorm held(48, 1e-6);
  {
    torch::NoGradGuard no_grad;
    held->weight.set_data(norm->weight.detach().to(torch::kBFloat16));
  }
  const auto held_output = held(x);
  const auto held_reference = held->unfused(x);
  CHECK(held_output.scalar_type() == torch::kFloat32);
  CHECK(relative_difference(held_output, held_reference) <= fp32_reorder_bound);
  auto held_grads = torch::autograd::grad({held_output}, {x, held->weight}, {gradient});
  auto reference_grads = torch::autograd::grad({held_reference}, {x, held->weight}, {gradient});
  CHECK(held_grads[1].scalar_type() == torch::kBFloat16);
  WARN("RMSNorm with a bf16 weight on fp32 input vs step by step: output "
       << relative_difference(held_output, held_reference) << ", input gradient "
       << relative_difference(held_grads[0], reference_grads[0]) << " (bound " << fp32_reorder_bound
       << "), weight gradient " << relative_difference(held_grads[1], reference_grads[1]) << " (bound "
       << std::ldexp(1.0, -7) << ")");
  CHECK(relative_difference(held_grads[0], reference_grads[0]) <= fp32_reorder_bound);
  CHECK(relative_difference(held_grads[1].to(torch::kFloat32), reference_grads[1].to(torch::kFloat32)) <=
        std::ldexp(1.0, -7));  // each rounded to bf16 once (at most an ulp apart), from fp32 sums in other orders
}

TEST_CASE("The --activation-checkpointing knob turns on the model's recomputation through causal_lm_training's hook",
          "[models][chunked_loss]") {
  const auto training = lm::causal_lm_training();
  const auto defaults = hpctrain::training_knobs(training);
  REQUIRE(training.model_hooks().size() == 1);
  torch::manual_seed(0);
  hm::Llama model(tiny_llama_config(false));
  const auto tokens = torch::randint(211, {2, 9}, torch::kInt64);
  auto loss_and_gradient = [&](const std::vector<std::string>& args) {
    for (const auto& hook : training.model_hooks()) hook(*model, defaults.with_arguments(args));
    model->zero_grad();
    auto loss = lm::token_loss(model->forward(tokens.narrow(1, 0, 8)), tokens.narrow(1, 1, 8));
    loss.backward();
    return std::make_pair(loss.item<double>(),
                          model->layers->ptr(0)->named_parameters()["mlp.up_proj.weight"].grad().clone());
  };
  const auto [plain, plain_grad] = loss_and_gradient({});
  CHECK(model->activation_checkpointing() == hm::Recompute::none);
  // Given alone, the switch is full recomputation, as when it was a boolean; its old spellings keep working.
  const auto [recomputed, recomputed_grad] = loss_and_gradient({"--activation-checkpointing"});
  CHECK(model->activation_checkpointing() == hm::Recompute::full);
  CHECK(recomputed == plain);
  CHECK(relative_difference(recomputed_grad, plain_grad) <= fp32_reorder_bound);
  const auto [selective, selective_grad] = loss_and_gradient({"--activation-checkpointing", "selective"});
  CHECK(model->activation_checkpointing() == hm::Recompute::selective);
  CHECK(selective == plain);
  CHECK(relative_difference(selective_grad, plain_grad) <= fp32_reorder_bound);
  (void)loss_and_gradient({"--activation-checkpointing=true"});
  CHECK(model->activation_checkpointing() == hm::Recompute::full);
  (void)loss_and_gradient({"--activation-checkpointing=false"});
  CHECK(model->activation_checkpointing() == hm::Recompute::none);
  CHECK_THROWS_WITH(defaults.with_arguments({"--activation-checkpointing", "some"}),
                    "[hpctrain.spec.knob] --activation-checkpointing = some: must be none, selective or full (true: "
                    "full, false: none)");
  CHECK(defaults.help().find("--activation-checkpointing [none|selective|full]") != std::string::npos);
  // A model that is no CausalLM: the switch names itself.
  torch::nn::Linear linear(2, 2);
  CHECK_THROWS_WITH(training.model_hooks()[0](*linear, defaults.with_arguments({"--activation-checkpointing"})),
                    Catch::Contains("--activation-checkpointing") && Catch::Contains("CausalLM"));
  CHECK_NOTHROW(training.model_hooks()[0](*linear, defaults));
}
