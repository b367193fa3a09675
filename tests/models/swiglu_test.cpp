// SwiGLU's node (models/kernels/swiglu.hpp) on the CPU, against autograd's silu(gate) · up: the same output and
// gradients bit for bit (the composite path runs autograd's operations), one tensor of the MLP's width fewer kept for
// backward (the heap in use while the graph lives), and no concatenation of the gradients of a fused gate/up
// product's halves.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <torch/torch.h>

#include <hpctrain/models/kernels/swiglu.hpp>

#include "block_step_support.hpp"

namespace hm = hpctrain::models;

namespace swiglu_test {

/// One forward and backward through `f` of a leaf [batch, tokens, 2 · width] (gate's half first), handed to `f`
/// whole or as its two halves (split_with_sizes, as models::linears does).
struct Run {
  torch::Tensor output, gradient;
  std::int64_t kept = 0;  ///< heap bytes the graph keeps beyond the output, after the forward
  long concatenations = 0;
};

template <typename F>
Run run(const torch::Tensor& gate_up_values, const torch::Tensor& upstream, F f) {
  auto gate_up = gate_up_values.clone().requires_grad_(true);
  const auto before = block_step::heap_in_use();
  auto output = f(gate_up);
  const auto output_bytes = static_cast<std::int64_t>(output.numel() * output.element_size());
  Run out;
  out.kept = block_step::heap_in_use() - before - output_bytes;
  {
    block_step::OpCount cats({"aten::cat"}, at::RecordScope::FUNCTION);
    output.backward(upstream);
    out.concatenations = cats.value();
  }
  out.output = output.detach();
  out.gradient = gate_up.grad();
  return out;
}

}  // namespace swiglu_test

TEST_CASE(
    "SwiGLU's node computes autograd's silu(gate) * up and its gradients bit for bit, keeping one tensor of the "
    "MLP's width fewer and concatenating nothing",
    "[models][swiglu]") {
  using namespace swiglu_test;
  const std::int64_t batch = 4, tokens = 256, width = 2048;  // halves of 8 MB in fp32: far above glibc's mmap threshold
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    torch::manual_seed(7);
    const auto gate_up = torch::randn({batch, tokens, 2 * width}).to(dtype);
    const auto upstream = torch::randn({batch, tokens, width}).to(dtype);
    const auto autograd = run(gate_up, upstream, [&](const torch::Tensor& t) {
      const auto halves = t.split_with_sizes({width, width}, -1);
      return torch::silu(halves[0]) * halves[1];
    });
    const auto joined = run(gate_up, upstream, [](const torch::Tensor& t) { return hm::swiglu(t); });
    const auto separate = run(gate_up, upstream, [&](const torch::Tensor& t) {
      const auto halves = t.split_with_sizes({width, width}, -1);
      return hm::swiglu(halves[0], halves[1]);
    });
    const auto name = std::string(dtype == torch::kFloat32 ? "fp32" : "bf16");
    for (const auto* node : {&joined, &separate}) {
      CHECK(torch::equal(node->output, autograd.output));
      CHECK(torch::equal(node->gradient, autograd.gradient));
    }
    // What each keeps beyond its output: autograd silu's output (one half's bytes) beside the gate/up tensor the
    // caller holds anyway; the node nothing (its saved gate/up is that tensor).
    const auto half = batch * tokens * width * static_cast<std::int64_t>(gate_up.element_size());
    WARN(fmt::format("{}: kept beyond the output: autograd {} bytes, joined {}, separate {} (a half is {})", name,
                     autograd.kept, joined.kept, separate.kept, half));
    if (block_step::heap_in_use() >= 0) {
      CHECK(std::abs(autograd.kept - half) < half / 16);
      CHECK(std::abs(joined.kept) < half / 16);
      CHECK(std::abs(separate.kept) < half / 16);
    }
    // Autograd's split_with_sizes backward concatenates the halves' gradients; the joined node writes them in place.
    CHECK(autograd.concatenations == 1);
    CHECK(joined.concatenations == 0);
  }
}

TEST_CASE("SwiGLU refuses a joined tensor of odd width and halves of different shapes, naming the shapes",
          "[models][swiglu]") {
  const auto odd = torch::randn({2, 5}, torch::requires_grad());
  CHECK_THROWS_WITH(hm::swiglu(odd), Catch::Matchers::Contains("[2, 5]"));
  CHECK_THROWS_WITH(hm::swiglu(torch::randn({2, 4}), torch::randn({2, 3})),
                    Catch::Matchers::Contains("[2, 4]") && Catch::Matchers::Contains("[2, 3]"));
  // Without a gradient it is the composite forward (no node); on the CPU no kernel is compiled at run time.
  torch::NoGradGuard no_grad;
  const auto gate_up = torch::randn({3, 8});
  CHECK(torch::equal(hm::swiglu(gate_up), torch::silu(gate_up.narrow(-1, 0, 4)) * gate_up.narrow(-1, 4, 4)));
  CHECK_FALSE(hm::detail::row_kernels_possible(torch::Device(torch::kCPU), torch::kBFloat16));
}
