# The one place where hpctrain pins its dependencies. Sourced by scripts/setup and scripts/test.
# torch 2.11.0 matches the PyTorch on the GPU machines we test on; its wheel carries LibTorch for C++.
HPCTRAIN_TORCH_VERSION=2.11.0
HPCTRAIN_PIP_PACKAGES="torch==${HPCTRAIN_TORCH_VERSION} numpy tensorboard"
# Debian packages: build, tests, local Slurm cluster, data, container runtime.
# libgloo-dev: the torch wheel omits the gloo headers that ProcessGroupGloo.hpp includes (docs/libtorch.md).
HPCTRAIN_APT_PACKAGES="cmake g++ ninja-build python3-venv slurm-wlm munge libfmt-dev librange-v3-dev catch2 libcli11-dev
  nlohmann-json3-dev zlib1g-dev libgloo-dev dataset-fashion-mnist fortunes charliecloud-runtime procps"
HPCTRAIN_CACHE="${HPCTRAIN_CACHE:-$HOME/.cache/hpctrain}"
HPCTRAIN_VENV="${HPCTRAIN_VENV:-$HPCTRAIN_CACHE/venv}"
