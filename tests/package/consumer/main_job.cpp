// An outside login-node tool: the torch-free job layer only (hpctrain::job), renders a script, prints the version.
#include <hpctrain/job/cli.hpp>
#include <hpctrain/version.hpp>

#include <iostream>

int main() {
  const auto job = hpctrain::Job("consumer").nodes(2);
  auto context = hpctrain::current_render_context(0, nullptr, {});
  const auto script = hpctrain::render_sbatch(job, context);
  std::cout << "hpctrain " << hpctrain::version << " (job only)\n";
  return script.find("#SBATCH --nodes=2") != std::string::npos ? 0 : 1;
}
