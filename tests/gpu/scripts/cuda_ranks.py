"""Two or more ranks on gloo, training on CUDA tensors (one GPU may be
shared by all of them).

    cuda_ranks.py --steps N

Each rank trains a small model on `cuda:<local rank mod device count>` and
all-reduces its gradients over gloo, which takes CUDA tensors and copies
them through the host, so the run needs no NCCL and no second GPU. At the
end the ranks all-reduce their rank numbers and each prints the sum.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    generator = torch.Generator(device=device).manual_seed(rank)
    for _ in range(args.steps):
        x = torch.randn(128, 256, device=device, generator=generator)
        y = torch.randn(128, 1, device=device, generator=generator)
        optimizer.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()
    total = torch.tensor([float(rank)], device=device)
    dist.all_reduce(total)
    print(f"cuda_ranks: rank {rank} of {world} done, sum {total.item():.0f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
