"""A tiny DistributedDataParallel loop on gloo (CPU) for the process tests.
`--raise-rank R --raise-at K` makes rank R raise at step K; with
`--others-wait` the other ranks sleep at that step instead of training on."""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--raise-rank", type=int, default=None)
    parser.add_argument("--raise-at", type=int, default=None)
    parser.add_argument(
        "--others-wait", action="store_true", help="other ranks sleep when one raises"
    )
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DistributedDataParallel(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        if rank == args.raise_rank and step == args.raise_at:
            raise RuntimeError(f"rank {rank} failed at step {step}")
        if args.others_wait and step == args.raise_at:
            time.sleep(60)  # busy elsewhere (a checkpoint, say) until torchrun stops it
        x, y = torch.randn(4, 8), torch.randn(4, 1)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    print(f"rank {rank} of {os.environ['WORLD_SIZE']} done, sum {total.item():.0f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
