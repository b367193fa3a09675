// hpctrain::FusedAdamW (ATen's fused AdamW kernel, which has a CPU implementation too) against LibTorch's own
// torch::optim::AdamW: the same parameters after the same steps, and the same state, so checkpoints and ZeRO's
// sharded state carry over between the two.
#include <catch2/catch.hpp>

#include <sstream>
#include <vector>

#include <torch/torch.h>

#include <hpctrain/job/setting.hpp>
#include <hpctrain/train/optim/adamw.hpp>
#include <hpctrain/train/optim/fused_adamw.hpp>

namespace {

/// Two groups (different lr and weight decay) of fp32 and fp64 tensors; the third parameter has no gradient
/// on every third step, so its step count falls behind the others'.
struct Setup {
  std::vector<torch::Tensor> first, second;

  static Setup make() {
    torch::manual_seed(7);
    Setup s;
    s.first = {torch::randn({5, 3}).requires_grad_(), torch::randn({7}, torch::kFloat64).requires_grad_()};
    s.second = {torch::randn({4, 4}).requires_grad_(), torch::randn({2, 3, 2}).requires_grad_()};
    return s;
  }
  std::vector<torch::optim::OptimizerParamGroup> groups(bool amsgrad) const {
    auto decayed = std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(2e-2).weight_decay(0.1).amsgrad(amsgrad));
    auto plain = std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(5e-3).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.0).amsgrad(amsgrad));
    return {torch::optim::OptimizerParamGroup(first, std::move(decayed)),
            torch::optim::OptimizerParamGroup(second, std::move(plain))};
  }
  std::vector<torch::Tensor> all() const {
    auto list = first;
    list.insert(list.end(), second.begin(), second.end());
    return list;
  }
};

/// Gradients as a loss would leave them: seeded per step, the same for both optimizers.
void set_gradients(const std::vector<torch::Tensor>& params, int step) {
  torch::manual_seed(100 + step);
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto grad = torch::randn(params[i].sizes(), params[i].options().requires_grad(false));
    params[i].mutable_grad() = (i == 2 && step % 3 == 0) ? torch::Tensor() : grad;
  }
}

template <class Optimizer>
void run_steps(Optimizer& optimizer, const std::vector<torch::Tensor>& params, int first, int last) {
  for (int step = first; step < last; ++step) {
    set_gradients(params, step);
    optimizer.step();
  }
}

}  // namespace

TEST_CASE("FusedAdamW's parameters and state equal torch::optim::AdamW's after 20 steps, with and without AMSGrad",
          "[optimizer]") {
  for (const bool amsgrad : {false, true}) {
    CAPTURE(amsgrad);
    auto reference = Setup::make();
    auto fused = Setup::make();
    torch::optim::AdamW reference_optimizer(reference.groups(amsgrad));
    hpctrain::FusedAdamW fused_optimizer(fused.groups(amsgrad));
    run_steps(reference_optimizer, reference.all(), 0, 20);
    run_steps(fused_optimizer, fused.all(), 0, 20);
    const auto expected = reference.all();
    const auto got = fused.all();
    for (std::size_t i = 0; i < expected.size(); ++i) {
      CAPTURE(i);
      REQUIRE(torch::allclose(got[i], expected[i], 1e-6, 1e-7));
      const auto& want = static_cast<const torch::optim::AdamWParamState&>(
          *reference_optimizer.state().at(expected[i].unsafeGetTensorImpl()));
      const auto& have =
          static_cast<const torch::optim::AdamWParamState&>(*fused_optimizer.state().at(got[i].unsafeGetTensorImpl()));
      REQUIRE(have.step() == want.step());
      REQUIRE(have.step() == (i == 2 ? 13 : 20));  // the third parameter had no gradient on 7 of the 20 steps
      REQUIRE(torch::allclose(have.exp_avg(), want.exp_avg(), 1e-6, 1e-8));
      REQUIRE(torch::allclose(have.exp_avg_sq(), want.exp_avg_sq(), 1e-6, 1e-10));
      REQUIRE(have.max_exp_avg_sq().defined() == amsgrad);
      if (amsgrad) REQUIRE(torch::allclose(have.max_exp_avg_sq(), want.max_exp_avg_sq(), 1e-6, 1e-10));
    }
  }
}

TEST_CASE(
    "A FusedAdamW state saved after 10 steps resumes in torch::optim::AdamW on the same parameters as 20 fused steps",
    "[optimizer]") {
  auto fused = Setup::make();
  hpctrain::FusedAdamW fused_optimizer(fused.groups(false));
  run_steps(fused_optimizer, fused.all(), 0, 10);

  // The resumed run: the parameters and optimizer state of step 10, through torch::save's archive.
  auto resumed = Setup::make();
  for (std::size_t i = 0; i < resumed.all().size(); ++i) {
    torch::NoGradGuard no_grad;
    resumed.all()[i].copy_(fused.all()[i]);
  }
  std::stringstream archive;
  torch::save(fused_optimizer, archive);
  torch::optim::AdamW plain_optimizer(resumed.groups(false));
  torch::load(plain_optimizer, archive);

  run_steps(fused_optimizer, fused.all(), 10, 20);
  run_steps(plain_optimizer, resumed.all(), 10, 20);
  for (std::size_t i = 0; i < fused.all().size(); ++i) {
    CAPTURE(i);
    REQUIRE(torch::allclose(resumed.all()[i], fused.all()[i], 1e-6, 1e-7));
  }
}

TEST_CASE(
    "ht::adamw builds the examples' former optimizer: FusedAdamW on the CPU, matrices decayed, biases and 1-D not",
    "[optimizer]") {
  torch::manual_seed(3);
  const hpctrain::NamedParameters parameters = {{"linear.weight", torch::randn({4, 3}).requires_grad_()},
                                                {"linear.bias", torch::randn({4}).requires_grad_()},
                                                {"norm.weight", torch::randn({3}).requires_grad_()}};
  // The knob as hpctrain::knob declares it, in a table of this test's own (the program-wide table of inline knobs
  // would reach every later case of this process: tests/train/loop_test.cpp lists the built-in knobs).
  hpctrain::Knobs knobs;
  knobs.declare<double>("adamw_test_weight_decay", 0.1, "weight decay of the matrices", hpctrain::non_negative());
  const hpctrain::Knob<double> decay("adamw_test_weight_decay");
  const auto given = knobs.with_arguments({"--adamw-test-weight-decay", "0.25"});

  const auto factory = hpctrain::adamw(1e-3).betas({0.9, 0.95}).eps(1e-6).weight_decay(decay);
  const auto optimizer = factory(parameters, given);
  REQUIRE(dynamic_cast<hpctrain::FusedAdamW*>(optimizer.get()) != nullptr);  // ATen has the kernel on the CPU
  const auto& groups = optimizer->param_groups();
  REQUIRE(groups.size() == 2);
  const auto& decayed = static_cast<const torch::optim::AdamWOptions&>(groups[0].options());
  const auto& plain = static_cast<const torch::optim::AdamWOptions&>(groups[1].options());
  CHECK(groups[0].params().size() == 1);  // the weight matrix
  CHECK(groups[1].params().size() == 2);  // the bias and the norm's weight
  CHECK(decayed.weight_decay() == 0.25);  // the knob's value as given
  CHECK(plain.weight_decay() == 0.0);
  CHECK(decayed.lr() == 1e-3);
  CHECK(decayed.eps() == 1e-6);
  CHECK(std::get<1>(decayed.betas()) == 0.95);
  CHECK(hpctrain::adamw(1e-3).weight_decay(decay).options(knobs).weight_decay() == 0.1);  // not given: the default
  CHECK(hpctrain::adamw(1e-3).options(knobs).weight_decay() == 0.01);                     // PyTorch's default

  // The same numbers as the lambda the examples held: FusedAdamW over weight_decay_groups.
  auto copy = [&] {
    hpctrain::NamedParameters out;
    for (const auto& [name, tensor] : parameters) out.emplace_back(name, tensor.detach().clone().requires_grad_());
    return out;
  };
  const auto ours_parameters = copy(), theirs_parameters = copy();
  const auto ours = factory(ours_parameters, given);
  auto options = torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).eps(1e-6).weight_decay(0.25);
  hpctrain::FusedAdamW theirs(hpctrain::weight_decay_groups(theirs_parameters, options), options);
  for (int step = 0; step < 5; ++step) {
    for (const auto* side : {&ours_parameters, &theirs_parameters})
      for (const auto& [name, tensor] : *side) tensor.mutable_grad() = torch::full_like(tensor, 0.1 * (step + 1));
    ours->step();
    theirs.step();
  }
  for (std::size_t i = 0; i < parameters.size(); ++i)
    REQUIRE(torch::equal(ours_parameters[i].second, theirs_parameters[i].second));

  const auto unfused = hpctrain::adamw(1e-3).fused(false).decay_groups(false)(parameters, knobs);
  CHECK(dynamic_cast<hpctrain::FusedAdamW*>(unfused.get()) == nullptr);
  CHECK(unfused->param_groups().size() == 1);
}

TEST_CASE(
    "FusedAdamW with its counts and learning rates on the device equals its host-count steps, through a "
    "schedule, a parameter that skips steps and a resume",
    "[optimizer]") {
  for (const bool amsgrad : {false, true}) {
    CAPTURE(amsgrad);
    auto host = Setup::make();
    auto device = Setup::make();
    hpctrain::FusedAdamW host_optimizer(host.groups(amsgrad));
    hpctrain::FusedAdamW device_optimizer(device.groups(amsgrad));
    device_optimizer.keep_counters_on_device();
    REQUIRE(device_optimizer.counters_on_device());
    // A schedule: every step sets each group's learning rate, which the device's tensors must follow.
    auto schedule = [](hpctrain::FusedAdamW& optimizer, int step) {
      for (auto& group : optimizer.param_groups()) {
        auto& options = static_cast<torch::optim::AdamWOptions&>(group.options());
        options.lr((step == 0 ? 1.0 : 0.9) * options.lr());
      }
    };
    for (int step = 0; step < 20; ++step) {
      for (auto* side : {&host_optimizer, &device_optimizer}) schedule(*side, step);
      set_gradients(host.all(), step);
      host_optimizer.step();
      set_gradients(device.all(), step);
      device_optimizer.step();
      if (step == 9) {
        // A checkpoint of the host counts, loaded back: the device's counts are made again from the host's.
        std::stringstream archive;
        torch::save(device_optimizer, archive);
        torch::load(device_optimizer, archive);
      }
    }
    for (std::size_t i = 0; i < host.all().size(); ++i) {
      CAPTURE(i);
      // The CPU kernel reads a tensor learning rate as the double it holds: the same arithmetic, bit for bit.
      REQUIRE(torch::equal(device.all()[i], host.all()[i]));
      const auto& have = static_cast<const torch::optim::AdamWParamState&>(
          *device_optimizer.state().at(device.all()[i].unsafeGetTensorImpl()));
      REQUIRE(have.step() == (i == 2 ? 13 : 20));
    }
  }
}

TEST_CASE("FusedAdamW refuses to make a parameter's state inside a capture, and counts a replayed step on the host",
          "[optimizer]") {
  auto s = Setup::make();
  hpctrain::FusedAdamW optimizer(s.groups(false));
  optimizer.keep_counters_on_device();
  set_gradients(s.all(), 1);
  optimizer.set_capturing(true);  // no step yet: the first would make the state, which a replay would make again
  REQUIRE_THROWS_WITH(optimizer.step(), Catch::Contains("every parameter must have stepped once before the capture"));
  optimizer.set_capturing(false);

  auto fresh = Setup::make();
  hpctrain::FusedAdamW counted(fresh.groups(false));
  counted.keep_counters_on_device();
  set_gradients(fresh.all(), 1);
  counted.step();                 // outside a capture: the state is made
  set_gradients(fresh.all(), 3);  // the third parameter has no gradient: the "captured" step leaves it out
  counted.set_capturing(true);
  counted.step();
  counted.set_capturing(false);
  counted.count_replayed_step();
  counted.count_replayed_step();
  const auto step_of = [&](std::size_t i) {
    return static_cast<const torch::optim::AdamWParamState&>(*counted.state().at(fresh.all()[i].unsafeGetTensorImpl()))
        .step();
  };
  CHECK(step_of(0) == 4);  // one eager step, the captured one, two replays
  CHECK(step_of(2) == 1);  // not in the captured step
}
