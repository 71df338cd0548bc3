"""A DDP loop on gloo whose ranks srun or mpirun starts, one process each:
the script reads its rank and world size from the launcher's variables
(`SLURM_PROCID`/`SLURM_NTASKS` as Lightning and Megatron read them, or
Open MPI's `OMPI_COMM_WORLD_RANK`/`SIZE`), sets MASTER_ADDR and
MASTER_PORT itself, and prints how many optimizer steps it took."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def identity() -> tuple[int, int]:
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        return int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    return int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=160)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()

    rank, world = identity()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.samples, 16), torch.randn(args.samples, 1))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            steps += 1
    dist.barrier()
    print(f"rank {rank} of {world}: {steps} optimizer steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
