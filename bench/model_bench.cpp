// Training throughput and MFU of hpctrain's GPT-2 module: random tokens, AdamW, bf16 autocast (fp32
// master weights), no Trainer around it (the model alone, as bench/model_mfu compares it with PyTorch
// eager and torch.compile running the same config). The step is the Trainer's: hpctrain's clipping (no host
// sync) and, by default, hpctrain::FusedAdamW (`--optimizer torch` for torch::optim::AdamW, whose per-tensor
// loop is what a LibTorch user gets; PyTorch's AdamW uses its foreach path on CUDA). Prints one JSON line.
//   hpctrain_model_bench --device cuda --preset gpt2 --batch 16 --seq 1024 --steps 30 --warmup 10
//   hpctrain_model_bench --device cpu --preset tiny                       (a smoke run on any machine)
//   ... --profile trace.json   (then 3 more steps under the Kineto profiler, as a Chrome trace)
#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <hpctrain/models/gpt2.hpp>
#include <hpctrain/train/optim/fused_adamw.hpp>
#include <hpctrain/train/precision.hpp>
#include <hpctrain/train/strategies/replicated.hpp>

#include "gpu_suite/profile.hpp"

namespace hm = hpctrain::models;

namespace {

hm::GPT2Config preset(const std::string& name) {
  hm::GPT2Config config;  // GPT-2 124M
  config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0;
  config.vocab_size = 50304;  // padded to a multiple of 64, as nanoGPT and llm.c do
  if (name == "tiny") {
    config.n_layer = 2;
    config.n_head = 4;
    config.n_embd = 128;
    config.n_positions = 256;
    config.vocab_size = 1024;
  } else if (name != "gpt2") {
    throw hpctrain::SpecError("preset", name, "must be \"gpt2\" or \"tiny\"");
  }
  return config;
}

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hpctrain GPT-2 training throughput (the model alone)"};
  std::string device_name = torch::cuda::is_available() ? "cuda" : "cpu", preset_name = "gpt2", precision = "bf16";
  std::string optimizer_name = "fused", profile_path;
  std::int64_t batch = 16, seq = 1024, steps = 30, warmup = 10;
  double peak_tflops = 989.0;  // H100 SXM / H200, dense bf16
  bool checkpointing = false;
  std::int64_t vocab = 0;
  app.add_option("--device", device_name);
  app.add_option("--preset", preset_name, "gpt2 (124M) or tiny");
  app.add_option("--batch", batch);
  app.add_option("--seq", seq);
  app.add_option("--steps", steps, "timed steps");
  app.add_option("--warmup", warmup, "untimed steps first");
  app.add_option("--precision", precision, "bf16 or fp32");
  app.add_option("--peak-tflops", peak_tflops, "the device's peak for MFU (default: H100/H200 dense bf16)");
  app.add_flag("--activation-checkpointing", checkpointing);
  app.add_option("--vocab", vocab, "vocabulary size instead of the preset's (GPT-2's BPE: 50257, unpadded)")
      ->check(CLI::PositiveNumber);
  app.add_option("--optimizer", optimizer_name, "fused (hpctrain::FusedAdamW) or torch (torch::optim::AdamW)")
      ->check(CLI::IsMember({"fused", "torch"}));
  app.add_option("--profile", profile_path, "after the timed steps, profile 3 more and save a Chrome trace here");
  CLI11_PARSE(app, argc, argv);

  const torch::Device device(device_name);
  auto config = preset(preset_name);
  if (vocab > 0) config.vocab_size = vocab;
  if (seq > config.n_positions) seq = config.n_positions;
  torch::manual_seed(0);
  hm::GPT2 model(config);
  model->to(device);
  model->set_activation_checkpointing(checkpointing);
  model->train();
  const auto parameters = model->parameters();
  const auto options = torch::optim::AdamWOptions(6e-4).betas({0.9, 0.95}).weight_decay(0.1);
  std::unique_ptr<torch::optim::AdamW> optimizer = optimizer_name == "fused"
                                                       ? std::make_unique<hpctrain::FusedAdamW>(parameters, options)
                                                       : std::make_unique<torch::optim::AdamW>(parameters, options);
  const auto tokens =
      torch::randint(config.vocab_size, {batch, seq + 1}, torch::TensorOptions().dtype(torch::kLong).device(device));
  const auto inputs = tokens.narrow(1, 0, seq), targets = tokens.narrow(1, 1, seq);
  const auto mode = precision == "bf16" ? hpctrain::Precision::bf16 : hpctrain::Precision::fp32;

  auto step = [&] {
    optimizer->zero_grad(/*set_to_none=*/true);
    torch::Tensor loss;
    {
      hpctrain::AutocastScope autocast(mode, device);
      auto logits = model->forward(inputs);
      loss = torch::nn::functional::cross_entropy(logits.reshape({-1, config.vocab_size}).to(torch::kFloat32),
                                                  targets.reshape({-1}));
    }
    loss.backward();
    hpctrain::detail::clip_grad_norm(parameters, 1.0);
    optimizer->step();
    return loss;
  };
  for (std::int64_t i = 0; i < warmup; ++i) step();
  synchronize(device);
  const auto start = std::chrono::steady_clock::now();
  torch::Tensor loss;
  for (std::int64_t i = 0; i < steps; ++i) loss = step();
  synchronize(device);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double tokens_per_s = static_cast<double>(batch * seq * steps) / seconds;
  const double flops = hm::flops_per_token(config, seq);
  const double mfu = tokens_per_s * flops / (peak_tflops * 1e12);
  std::cout
      << fmt::format(
             R"({{"impl": "hpctrain", "optimizer": "{}", "device": "{}", "preset": "{}", "vocab": {}, "batch": {}, "seq": {}, "steps": {}, "precision": "{}", )"
             R"("tokens_per_s": {:.1f}, "ms_per_step": {:.2f}, "flops_per_token": {:.0f}, "mfu": {:.4f}, "loss": {:.4f}}})",
             optimizer_name, device_name, preset_name, config.vocab_size, batch, seq, steps, precision, tokens_per_s,
             1e3 * seconds / static_cast<double>(steps), flops, mfu, loss.item<double>())
      << std::endl;
  if (!profile_path.empty()) hpctrain_gpu_suite::profile(profile_path, device, 3, step);
  return 0;
}
