# The one place where hpctrain pins its dependencies. Sourced by scripts/setup and scripts/test.
# torch 2.11.0 matches the PyTorch on the GPU machines we test on; its wheel carries LibTorch for C++.
HPCTRAIN_TORCH_VERSION=2.11.0
# Test-only oracles (the product has no Python): transformers/safetensors for logits and generation,
# tokenizers/tiktoken for token ids, tensorboard to read our event files back, wandb to read our offline W&B runs back:
# 0.29.0 is the last release that ships its Python reader of .wandb files (wandb/sdk/internal/datastore.py); later ones
# read them only inside wandb-core, during an upload. datasets: the peer of the SFT preparation's benchmark
# (bench/sft_prepare_bench, `datasets.map`); 4.8.5 keeps huggingface_hub below 1.0, as transformers 4.57 needs.
# trl 0.24.0 (with accelerate, which it needs): DPOTrainer is the oracle of examples/dpo.cpp (tests/lm/dpo_oracle.py);
# 0.24 requires transformers>=4.56.1, as pinned here.
# pyarrow is not only an oracle: its wheel carries Apache Arrow's C++ libraries and headers (libarrow, libparquet),
# which hpctrain::datasets links as LibTorch comes from the torch wheel (docs/datasets.md); datasets writes with it.
HPCTRAIN_PYARROW_VERSION=26.0.1
HPCTRAIN_PIP_PACKAGES="torch==${HPCTRAIN_TORCH_VERSION} pyarrow==${HPCTRAIN_PYARROW_VERSION} numpy tensorboard transformers==4.57.1 safetensors==0.6.2 tokenizers==0.22.1 tiktoken==0.12.0 jinja2==3.1.6 peft==0.17.1 wandb==0.29.0 datasets==4.8.5 trl==0.24.0 accelerate==1.16.0"
# The second oracle leg: transformers 5 writes config.json in another layout (rope_parameters, dtype), so the model,
# PEFT and tokenizer oracles run again under it. Its venv sees the first one's packages (torch, numpy, ...) through a
# .pth file and holds only what differs; huggingface_hub and tokenizers are the versions transformers 5.24 requires.
HPCTRAIN_PIP_PACKAGES_TRANSFORMERS5="transformers==5.24.0 peft==0.21.2 huggingface_hub==2.4.0 tokenizers==0.23.3 safetensors==0.8.0"
# The GPU suite's llama8b peers (bench/llama8b_peer.py), carried as wheels to the lent GPU machine (scripts/gpu-pack puts
# them in .carry/wheels, scripts/gpu-check installs them into a temporary folder for the peers only): that machine runs
# transformers 5.17 under torch 2.11 and has no registry. peft 0.21.2 is the transformers-5 oracle leg's (above; it
# runs under transformers 4.57.1 too); liger-kernel 0.8.5 needs transformers >= 5 and Triton (torch's CUDA wheel
# brings it: 3.6.0 beside torch 2.11). Both are pure Python (py3-none-any); what they need besides (accelerate,
# psutil, pyyaml, safetensors, huggingface_hub, tqdm) the machine's image holds (docs/gpu.md).
HPCTRAIN_GPU_WHEELS="peft==0.21.2 liger-kernel==0.8.5"
# GPT-2's BPE ranks (gpt2.tiktoken) come from this sdist, which ships them under whisper/assets/.
HPCTRAIN_WHISPER_SDIST="openai-whisper==20250625"
# Debian packages: build, tests, local Slurm cluster, data, container runtime.
# libgloo-dev: the torch wheel omits the gloo headers that ProcessGroupGloo.hpp includes (docs/libtorch.md).
# libpcre2-dev: Unicode regex for the tokenizer's pre-split; libsentencepiece-dev: Llama 2 / T5 models;
# clang + libfuzzer-14-dev: fuzzing and sanitizer builds; clang-format-14: the format check (its version formats).
# libcurl4-openssl-dev: the W&B logger's live stream over HTTPS (train/loggers/http_client.hpp).
HPCTRAIN_APT_PACKAGES="cmake g++ ninja-build python3-venv slurm-wlm munge libfmt-dev catch2 libcli11-dev
  nlohmann-json3-dev zlib1g-dev libgloo-dev dataset-fashion-mnist fortunes charliecloud-runtime procps
  libpcre2-dev libsentencepiece-dev clang libfuzzer-14-dev clang-format-14 libcurl4-openssl-dev"
HPCTRAIN_CACHE="${HPCTRAIN_CACHE:-$HOME/.cache/hpctrain}"
HPCTRAIN_VENV="${HPCTRAIN_VENV:-$HPCTRAIN_CACHE/venv}"
HPCTRAIN_VENV_TRANSFORMERS5="${HPCTRAIN_VENV_TRANSFORMERS5:-$HPCTRAIN_CACHE/venv-transformers5}"
