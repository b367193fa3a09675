// The host memory one training step of a Llama holds under --activation-checkpointing none, selective or full, on
// the CPU (bytes, not time), beside what --plan (lm/memory_plan.hpp) counts for the same run. One mode a process:
//   hpctrain_recompute_memory none|selective|full [--layers 14 --hidden 768 --batch 4 --seq 512 --threads 2]
//                             [--fused-projections under_autocast|always|never]
// Big blocks are served by mmap and given back on free (glibc's mmap threshold fixed at 64 kB), so the resident set
// follows the live tensors; after a first step (the gradients then exist and are accumulated into), the peak
// (VmHWM, reset through /proc/self/clear_refs) of the second step above the resident set before it is the step's
// transient memory: the activations kept, the logits and what backward holds at once. Prints one JSON line.
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cstdint>
#include <iostream>
#include <string>

#include <fmt/format.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <hpctrain/lm/memory_plan.hpp>
#include <hpctrain/models/llama.hpp>
#include <hpctrain/train/host_memory.hpp>

namespace hm = hpctrain::models;

int main(int argc, char** argv) {
  CLI::App app{"host memory of one Llama training step: none vs selective vs full recomputation"};
  std::string mode = "none";
  std::int64_t layers = 14, hidden = 768, intermediate = 2048, heads = 12, kv_heads = 4, vocab = 4096, batch = 4,
               seq = 512;
  int threads = 2;
  app.add_option("mode", mode, "none, selective or full")->check(CLI::IsMember({"none", "selective", "full"}));
  app.add_option("--layers", layers);
  app.add_option("--hidden", hidden);
  app.add_option("--intermediate", intermediate);
  app.add_option("--heads", heads);
  app.add_option("--kv-heads", kv_heads);
  app.add_option("--vocab", vocab);
  app.add_option("--batch", batch);
  app.add_option("--seq", seq);
  app.add_option("--threads", threads);
  std::string fused = "under_autocast";  // fp32 here: `always` fuses (and copies the weights), the others do not
  app.add_option("--fused-projections", fused)->check(CLI::IsMember({"under_autocast", "always", "never"}));
  CLI11_PARSE(app, argc, argv);
  hm::set_fused_projections(fused == "always"  ? hm::FusedProjections::always
                            : fused == "never" ? hm::FusedProjections::never
                                               : hm::FusedProjections::under_autocast);
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 64 * 1024);  // fixed: glibc's dynamic threshold would keep freed big blocks in the heap
#endif
  torch::set_num_threads(threads);
  const auto recompute = *hm::parse_recompute(mode);

  hm::LlamaConfig config;
  config.vocab_size = vocab;
  config.hidden_size = hidden;
  config.intermediate_size = intermediate;
  config.num_hidden_layers = layers;
  config.num_attention_heads = heads;
  config.num_key_value_heads = kv_heads;
  config.tie_word_embeddings = false;
  torch::manual_seed(0);
  hm::Llama model(config);
  model->train();
  model->set_activation_checkpointing(recompute);
  const auto tokens = torch::randint(vocab, {batch, seq + 1}, torch::kLong);
  const auto inputs = tokens.narrow(1, 0, seq), targets = tokens.narrow(1, 1, seq).reshape({-1});
  auto step = [&] {
    const auto logits = model->forward(inputs);
    auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}), targets);
    loss.backward();
    return loss.item<double>();
  };
  (void)step();  // the gradients now exist: the next step accumulates into them
  const auto before = hpctrain::detail::resident_bytes();
  hpctrain::detail::reset_peak_resident();
  const double loss = step();
  const auto peak = hpctrain::detail::peak_resident_bytes();

  hpctrain::lm::PlanInput in;
  in.model = hpctrain::lm::model_shape(config);
  in.micro_batch = batch;
  in.sequence = seq;
  in.activation_checkpointing = recompute;
  in.runtime_bytes = 0;
  const auto plan = hpctrain::lm::plan_memory(in);
  const double kept = hpctrain::lm::kept_activations(in, plan);
  const double planned = kept + plan.logits;  // the forward's end: the transient peak
  const auto measured = peak - before;
  std::cout << fmt::format(R"({{"mode": "{}", "fused_projections": "{}", "parameters": {}, "batch": {}, "seq": {}, )",
                           mode, fused, config.parameter_count(), batch, seq)
            << fmt::format(R"("step_peak_bytes": {}, "resident_before": {}, "planned_activations": {:.0f}, )", measured,
                           before, kept)
            << fmt::format(R"("planned_logits": {:.0f}, "planned_transient": {:.0f}, "plan_over_measured": {:.3f}, )",
                           plan.logits, planned, planned / static_cast<double>(measured))
            << fmt::format(R"("loss": {:.4f}}})", loss) << std::endl;
  return 0;
}
