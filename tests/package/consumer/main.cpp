// An outside program: includes the umbrella header, touches LibTorch, and prints the version.
#include <hpctrain/hpctrain.hpp>

#include <iostream>

int main() {
  const auto x = torch::ones({2, 2});
  std::cout << "hpctrain " << hpctrain::version << " sum=" << x.sum().item<float>() << '\n';
  return x.sum().item<float>() == 4.0f ? 0 : 1;
}
