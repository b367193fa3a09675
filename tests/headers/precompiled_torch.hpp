#pragma once
// What the self-containment checks of the torch headers precompile (tests/headers/CMakeLists.txt): LibTorch,
// the c10d headers that dist/process_group.hpp adds to it, and the other outside headers (about 2 s of each
// check for dist/ and train/ headers). A header still has to include them itself: includes_what_it_uses.py
// checks that, since this PCH would hide a missing one.
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(USE_C10D_NCCL)  // as dist/process_group.hpp includes it
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "precompiled_outside.hpp"
