#pragma once
// A process-wide switch of the models' GPU step (set_fused_projections, set_fp32_product_gradients,
// set_runtime_kernels) set for a scope and put back as it was after, whatever the scope throws: how a comparison (a
// test, the GPU suite's rows) runs the same code with one rewrite off.
//
//   models::ScopedSwitch composite(models::set_runtime_kernels, models::runtime_kernels, false);

namespace hpctrain::models {

template <typename Value>
class ScopedSwitch {
 public:
  ScopedSwitch(void (*set)(Value), Value (*get)(), Value value) : set_(set), previous_(get()) { set_(value); }
  ~ScopedSwitch() { set_(previous_); }
  ScopedSwitch(const ScopedSwitch&) = delete;
  ScopedSwitch& operator=(const ScopedSwitch&) = delete;

 private:
  void (*set_)(Value);
  Value previous_;
};

}  // namespace hpctrain::models
