// The add_subdirectory consumer: the source tree's headers through the hpctrain::hpctrain target, LibTorch with
// its distributed part (c10d and Gloo, linked through the process group's address) and the version. The
// umbrella header is main.cpp's, the find_package consumer's, which also proves that every header was installed:
// compiling it twice cost ~65 s of CPU more.
#include <hpctrain/dist/process_group.hpp>
#include <hpctrain/version.hpp>

#include <iostream>

int main() {
  const auto x = torch::ones({2, 2});
  static auto* volatile init = &hpctrain::dist::init_process_group;  // odr-used: c10d's symbols must link
  std::cout << "hpctrain " << hpctrain::version << " sum=" << x.sum().item<float>() << '\n';
  return init != nullptr && x.sum().item<float>() == 4.0f ? 0 : 1;
}
