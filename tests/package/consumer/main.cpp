// The find_package and add_subdirectory consumers: hpctrain's headers through the hpctrain::hpctrain target,
// LibTorch with its distributed part (c10d and Gloo, linked through the process group's address) and the
// version. The umbrella header, and with it every installed header, is compiled by the hpctrain_add_program
// consumer (main_program.cpp, built in the container recipe's test): its runtime unit (src/hpctrain_runtime.cpp)
// includes it. Compiling it here too cost ~40 s of CPU more.
#include <hpctrain/dist/process_group.hpp>
#include <hpctrain/version.hpp>

#include <iostream>

int main() {
  const auto x = torch::ones({2, 2});
  static auto* volatile init = &hpctrain::dist::init_process_group;  // odr-used: c10d's symbols must link
  std::cout << "hpctrain " << hpctrain::version << " sum=" << x.sum().item<float>() << '\n';
  return init != nullptr && x.sum().item<float>() == 4.0f ? 0 : 1;
}
