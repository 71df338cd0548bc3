"""A DataLoader forking worker processes after the main process has
initialised CUDA.

    cuda_loader_workers.py --epochs 2

The model is on the GPU before the loader starts, so its two workers are
forked from a process holding a CUDA context. That is allowed as long as
the workers never touch CUDA themselves; whatever perfrun runs inside a
worker must not either, or the worker dies with "Cannot re-initialize CUDA
in forked subprocess" and the script fails.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BATCHES = 8


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(BATCHES * 16, 64), torch.randn(BATCHES * 16, 1))
    loader = DataLoader(data, batch_size=16, num_workers=2, pin_memory=True)
    steps = 0
    for _ in range(args.epochs):
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad()
            loss = (model(x) - y).pow(2).mean()
            loss.backward()
            optimizer.step()
            steps += 1
    print(f"LOADER {steps} steps, last loss {loss.item():.5f}", flush=True)


if __name__ == "__main__":
    main()
