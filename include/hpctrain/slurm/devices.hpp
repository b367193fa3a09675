#pragma once
// Which CUDA device a rank uses. Slurm's `--gpus-per-task` and `--gpu-bind` give each task its own
// CUDA_VISIBLE_DEVICES, often a single GPU, renumbered from 0 (submitit #1704, Lightning #16828): a rank
// must never take its local rank as an index into the node's GPUs. The choice is made among the devices the
// process sees, so it is right with and without per-task binding. Torch-free: the caller passes the count
// (the CUDA runtime's device count, which follows CUDA_VISIBLE_DEVICES).
#include <fmt/format.h>

#include <hpctrain/error.hpp>

namespace hpctrain::slurm {

/// The index, among the `visible_devices` this process sees, of the GPU for the rank with `local_rank`:
/// - every rank of the node sees every GPU (`--gpus-per-node`, one task per GPU): its local rank;
/// - each task sees its own GPU(s) (`--gpus-per-task`, `--gpu-bind`): device 0 of its own set when it sees one,
///   else `local_rank % visible_devices` (an index it has, never one beyond).
/// Throws RuntimeError `[hpctrain.runtime.cuda_device]` when the process sees no GPU.
inline int cuda_device_for(int local_rank, int visible_devices) {
  if (visible_devices < 1)
    throw RuntimeError(errors::runtime_cuda_device,
                       fmt::format("local rank {} sees no CUDA device (CUDA_VISIBLE_DEVICES empty, or no GPU in the "
                                   "step: ask for GPUs with gpus_per_node)",
                                   local_rank));
  return local_rank % visible_devices;
}

}  // namespace hpctrain::slurm
