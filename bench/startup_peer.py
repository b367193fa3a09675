"""The peer of hpctrain_startup_bench under torchrun: rendezvous (env://), one all-reduce, clean shutdown.
Prints the same JSON line from rank 0 (bench/startup runs it with torchrun --standalone)."""
import json
import os
import time

import torch
import torch.distributed as dist


def since_launch():
    return time.time() - float(os.environ["HPCTRAIN_BENCH_LAUNCH_TIME"])


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
rendezvous = since_launch()
one = torch.ones(1, dtype=torch.float64)
dist.all_reduce(one)
first_collective = since_launch()
times = torch.zeros(2 * world, dtype=torch.float64)
times[rank] = rendezvous
times[world + rank] = first_collective
dist.all_reduce(times)
if rank == 0:
    print(json.dumps({"ranks": world, "all_reduce_sum": one.item(), "rendezvous_s": round(times[:world].max().item(), 3),
                      "first_collective_s": round(times[world:].max().item(), 3), "collective_done_at": time.time()}),
          flush=True)
dist.destroy_process_group()
