"""torch's side of bench/ddp_vs_torchrun: the same MLP, data shape, batch and optimizer as ddp_bench.cpp,
with torch.nn.parallel.DistributedDataParallel over Gloo, started by torchrun. Rank 0 prints one JSON line."""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    model = torch.nn.parallel.DistributedDataParallel(model)  # 25 MB buckets, first one 1 MB: as GradientSync
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    torch.manual_seed(100 + rank)
    inputs = torch.randn(64, 784)
    targets = torch.randint(0, 10, (64,))

    def step():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()

    step()
    first_step_done = time.time()
    for _ in range(1, args.warmup):
        step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    dist.barrier()
    seconds = time.perf_counter() - start
    if rank == 0:
        launched = os.environ.get("HPCTRAIN_BENCH_LAUNCH_TIME")
        print(json.dumps({"side": "torchrun", "world": world, "steps_per_s": round(args.steps / seconds, 3),
                          "launch_to_first_step_s": round(first_step_done - float(launched), 3) if launched else -1}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
