"""torch's side of bench/zero_vs_torch: the same Linear stack, batch and AdamW as zero_bench.cpp, under torchrun
with Gloo on CPU: `ddp` (DistributedDataParallel, replicated optimizer), `zero` (DDP +
torch.distributed.optim.ZeroRedundancyOptimizer: optimizer state sharded, as our ZeRO-1) and `fsdp2`
(torch.distributed.fsdp.fully_shard per Linear: parameters, gradients and state sharded). Rank 0 prints one
JSON line with the largest figure over the ranks (see zero_bench.cpp for the fields)."""
import argparse
import json
import resource

import torch
import torch.distributed as dist


def local(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def state_bytes(optimizer):
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value) and value.dim() > 0:
                total += local(value).numel() * local(value).element_size()
    return total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", choices=["ddp", "zero", "fsdp2"], required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 10))
    parameters = sum(p.numel() for p in model.parameters())
    if args.strategy == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    else:
        model = torch.nn.parallel.DistributedDataParallel(model)
        if args.strategy == "zero":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4,
                                                weight_decay=0.01)
        else:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    torch.manual_seed(100 + rank)
    inputs = torch.randn(32, args.width)
    targets = torch.randint(0, 10, (32,))

    def step():
        optimizer.zero_grad(set_to_none=args.strategy != "ddp")
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()

    import time
    for _ in range(args.warmup):
        step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    dist.barrier()
    seconds = time.perf_counter() - start
    # Held between steps: parameters and gradients (DDP keeps .grad; FSDP2's are sharded DTensors).
    param_grad = 0
    for p in model.parameters():
        param_grad += local(p).numel() * local(p).element_size()
        if p.grad is not None:
            param_grad += local(p.grad).numel() * local(p.grad).element_size()
    if args.strategy == "zero":  # ZeroRedundancyOptimizer keeps the local shard's state in optim
        opt_bytes = state_bytes(optimizer.optim)
    else:
        opt_bytes = state_bytes(optimizer)
    figures = torch.tensor([opt_bytes, param_grad, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0],
                           dtype=torch.float64)
    dist.all_reduce(figures, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(json.dumps({"side": "torch", "strategy": args.strategy, "world": world, "parameters": parameters,
                          "optimizer_state_bytes": int(figures[0]), "param_grad_bytes": int(figures[1]),
                          "max_rss_mb": round(float(figures[2]), 1), "steps_per_s": round(args.steps / seconds, 3)}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
