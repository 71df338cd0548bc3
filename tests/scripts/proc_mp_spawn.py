"""Trains only in processes of its own, started with
torch.multiprocessing.spawn as the DDP tutorials do (no process group: each
trains a model of its own), and none in the process perfrun starts."""

import torch
import torch.multiprocessing as mp
from torch import nn


def train(index: int, steps: int) -> None:
    torch.manual_seed(index)
    torch.set_num_threads(1)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
    print(f"worker {index} trained {steps} steps", flush=True)


if __name__ == "__main__":
    mp.spawn(train, args=(5,), nprocs=2)
