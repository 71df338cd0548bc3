"""Trains on a thread of its own; the main thread only starts and joins it.

    proc_thread_train.py [--steps N]
"""

import argparse
import threading

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def train(steps: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(steps * 8, 4)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trained = 0
    for xb, yb in loader:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(xb), yb).backward()
        optimizer.step()
        trained += 1
    print(f"trained on a thread: {trained} steps", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    thread = threading.Thread(target=train, args=(args.steps,), name="trainer")
    thread.start()
    thread.join()
